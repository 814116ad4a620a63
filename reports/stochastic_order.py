"""Almost Stochastic Order against the baseline in the report (`report.aso: true`): for each comparison of the
ablation table, ε_min of the cell over its baseline and of the baseline over the cell (reports.aso, deepsig's
numbers), from the two cells' test scores over their seeds, in stats.csv and a table of their own.

ε_min < τ = 0.2 reads "almost stochastically larger" (Ulmer et al. 2022). The comparisons of a table share one
family: with `report.correction` other than none, each is made at confidence 1 − 0.05/m for m comparisons
(deepsig's Bonferroni, the only correction it defines); without, at 0.95. Greater is better unless the study
minimises its metric, when the scores are negated first. A cell or baseline with fewer than 3 completed seeds
gets none (ASO at 3 seeds already decides for one of two equal cells in 8.9-9.8 % of simulated comparisons:
benchmarks/aso.py, docs/concepts/reports.md)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.aso import THRESHOLD, aso

MARK = "≻"
LEVEL = 0.95


def cell_scores(runs, cell: str, metric: str) -> np.ndarray:
    """A cell's test scores over its completed seeds (one per seed)."""
    from reports.significance import _by_seed

    done = runs.replicates()[runs.replicates().outcome == "completed"]
    return _by_seed(done[done.cell == cell], metric)[metric].to_numpy(dtype=float)


def add_aso(stats: pd.DataFrame, runs, metric: str, enabled: bool, correction: str = "holm") -> pd.DataFrame:
    """`stats` with each comparison's `aso_eps_min` (the cell over its baseline), `aso_eps_min_reverse` (the
    baseline over the cell), the seeds each side had (`aso_n_cell`, `aso_n_baseline`) and the family size
    (`aso_comparisons`); NaN where a side has fewer than `MIN_SEEDS` seeds. Unchanged unless `enabled`."""
    from reports.significance import MIN_SEEDS

    if stats.empty or not enabled:
        return stats
    sign = -1.0 if runs.mode == "min" else 1.0
    comparisons = len(stats) if correction != "none" else 1
    rows = []
    for row in stats.itertuples():
        ours, theirs = sign * cell_scores(runs, row.cell, metric), sign * cell_scores(runs, row.baseline, metric)
        forward = reverse = math.nan
        if min(len(ours), len(theirs)) >= MIN_SEEDS:
            forward = float(aso(ours, theirs, LEVEL, num_comparisons=comparisons).eps_min)
            reverse = float(aso(theirs, ours, LEVEL, num_comparisons=comparisons).eps_min)
        rows.append({"aso_eps_min": forward, "aso_eps_min_reverse": reverse, "aso_n_cell": len(ours),
                     "aso_n_baseline": len(theirs)})
    return pd.concat([stats.reset_index(drop=True), pd.DataFrame(rows)], axis=1).assign(aso_comparisons=comparisons)


def aso_grid(runs, stats: pd.DataFrame):
    """Per comparison against the baseline: each side's seeds and ε_min both ways, ≻ where one is below τ
    (None without `report.aso`)."""
    from reports.captions import axes_label, caption, cell_labels, constants_phrase, varying
    from reports.render import Cell, Grid, Note
    from reports.significance import MIN_SEEDS

    if stats.empty or "aso_eps_min" not in stats:
        return None
    axes = varying(runs, runs.axes) or runs.axes[:1]
    shown = cell_labels(runs, axes)
    comparisons = int(stats.aso_comparisons.iloc[0])
    confidence = LEVEL + (1 - LEVEL) / comparisons if comparisons > 1 else LEVEL
    rows = []
    for row in stats.itertuples():
        values = []
        for value in (row.aso_eps_min, row.aso_eps_min_reverse):
            if math.isnan(value):
                values.append(Cell(text="—"))
            else:
                values.append(Cell(text=f"{value:.2f}", mark=MARK if value < THRESHOLD else ""))
        rows.append((shown.get(row.cell, row.cell),
                     [Cell(text=shown.get(row.baseline, row.baseline)),
                      Cell(text=f"{int(row.aso_n_cell)}/{int(row.aso_n_baseline)}"), *values]))
    family = (f"confidence {confidence:.4g} for each of the {comparisons} comparisons (deepsig's Bonferroni; "
              "report.correction: none keeps 0.95)" if comparisons > 1 else f"confidence {LEVEL:g}")
    notes: list = [
        Note("ε_min: the upper confidence bound of the violation ratio ε_W2, the share of the squared Wasserstein-2 "
             "distance between the two cells' score distributions over seeds where the first lies below the second "
             "(Almost Stochastic Order: del Barrio et al. 2018, Dror et al. 2019; deepsig's computation, Ulmer et al. "
             f"2022), from 1,000 bootstrap resamples of both cells' seeds, {family}; the seeds need not pair",
             f"ε_min: Almost Stochastic Order (Dror et al. 2019), {family.split(' (')[0]}"),
        Note(f"{MARK} ε_min < {THRESHOLD:g}: that side is almost stochastically larger (Ulmer et al.'s τ); ε_min at "
             f"or above {THRESHOLD:g} both ways: neither is shown larger (with few seeds both bounds lie near 1)",
             f"{MARK} ε_min\u00a0<\u00a0{THRESHOLD:g}: almost stochastically larger"),
        Note(f"with {MIN_SEEDS} seeds on each side ASO decides for one of two equal cells in 8.9-9.8 % of simulated "
             "comparisons (5.6-5.9 % at 5 seeds, 3.2-3.5 % at 10; benchmarks/aso.py): above the paired t-test's 5 %",
             None)]
    few = stats[stats.aso_eps_min.isna()]
    if len(few):
        notes.append(Note(f"—: a side with fewer than {MIN_SEEDS} completed seeds ({len(few)} of {len(stats)} "
                          "comparisons)", f"—: under {MIN_SEEDS} seeds"))
    what = ("Almost Stochastic Order against the baseline: ε_min of the cell over the baseline and of the baseline "
            "over the cell, test score over seeds")
    return Grid(caption(what, constants_phrase(runs, axes[0] if axes else None)), axes_label(runs, axes),
                ["Baseline", "Seeds", "ε_min (cell over baseline)", "ε_min (baseline over cell)"], rows, notes, 2)
