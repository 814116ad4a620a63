"""Practical equivalence against the baseline (`report.rope`, in score points): for each cell, the posterior
probabilities that its true mean difference from the baseline is above +rope (better), within ±rope
(equivalent) or below −rope (worse). A significance test cannot say that layer 7 is as good as layer 12; a
region of practical equivalence can (Benavoli, Corani, Demšar and Zaffalon, JMLR 2017).

The model is the Bayesian correlated t-test of Corani and Benavoli (2015), as baycomp's `CorrelatedTTest`
computes it: under the flat prior the mean paired difference has a Student posterior with n − 1 degrees of
freedom, centred on the observed mean, with scale² = s²·(1/n + ρ/(1 − ρ)). Cross-validation folds share
training data, so baycomp sets ρ = 1/k (Nadeau and Bengio's correction); replicate seeds train on the same
data but draw every random stream apart, so the paired differences of n seeds are independent: ρ = 0, the
Bayesian twin of the paired t-test the † marks run. A cell is marked ≈ where P(equivalent) ≥ 0.95."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.stats import t as t_dist

EQUIVALENT = 0.95  # the ≈ mark: P(equivalent) at least this
MARK = "≈"


def posterior_probabilities(differences, rope: float, rho: float = 0.0) -> tuple[float, float, float]:
    """(P(worse), P(equivalent), P(better)) of the mean of `differences` (cell minus baseline, greater is
    better) against ±`rope`; NaN below 2 differences. Differences without spread give a point posterior."""
    if not rope >= 0:
        raise ValueError(f"rope must be at least 0, but got rope={rope}")
    if not 0 <= rho < 1:
        raise ValueError(f"rho must be in [0, 1), but got rho={rho}")
    values = np.asarray(differences, dtype=float)
    n = len(values)
    if n < 2:
        return math.nan, math.nan, math.nan
    mean, variance = float(values.mean()), float(values.var(ddof=1))
    scale = math.sqrt(variance * (1 / n + rho / (1 - rho)))
    if np.all(values == values[0]):  # no spread (its float variance may be 1e-33, not 0)
        return float(mean < -rope), float(-rope <= mean <= rope), float(mean > rope)
    below, within = t_dist.cdf(-rope, n - 1, mean, scale), t_dist.cdf(rope, n - 1, mean, scale)
    return float(below), float(within - below), float(1 - within)


def add_equivalence(stats: pd.DataFrame, runs, metric: str, rope: float | None) -> pd.DataFrame:
    """`stats` with `rope` and each comparison's `p_better`, `p_equivalent`, `p_worse` (better: the direction
    the study's mode prefers); NaN below `MIN_SEEDS` paired seeds. Unchanged without a rope."""
    from reports.power import paired_differences
    from reports.significance import MIN_SEEDS

    if stats.empty or rope is None:
        return stats
    sign = -1.0 if runs.mode == "min" else 1.0
    rows = []
    for row in stats.itertuples():
        differences = sign * paired_differences(runs, row.cell, row.baseline, metric)
        worse, equivalent, better = (posterior_probabilities(differences, float(rope))
                                     if len(differences) >= MIN_SEEDS else (math.nan,) * 3)
        rows.append({"p_better": better, "p_equivalent": equivalent, "p_worse": worse})
    return pd.concat([stats.reset_index(drop=True), pd.DataFrame(rows)], axis=1).assign(rope=float(rope))


def equivalence_marks(stats: pd.DataFrame) -> dict[str, str]:
    """Per cell: ≈ where P(equivalent) ≥ 0.95."""
    if "p_equivalent" not in stats:
        return {}
    return {row.cell: MARK for row in stats.itertuples() if row.p_equivalent >= EQUIVALENT}


def equivalence_note(stats: pd.DataFrame, against: str):
    """The ablation table's footnote for ≈ (None without a rope or without a marked cell)."""
    from reports.render import Note

    marked = equivalence_marks(stats)
    if not marked:
        return None
    rope = float(stats.rope.iloc[0])
    return Note(f"{MARK} practically equivalent to {against}: P(the mean difference is within ±{rope:g} points) ≥ "
                f"{EQUIVALENT:g}, Bayesian correlated t-test over seeds (Benavoli et al. 2017; ρ = 0 for independent "
                f"seeds), report.rope = {rope:g} ({len(marked)} of {len(stats)} cells; equivalence.tex and stats.csv "
                "give every cell's P(better), P(equivalent), P(worse))",
                f"{MARK} P(within ±{rope:g} of {against.removeprefix('the ')})\u00a0≥\u00a0{EQUIVALENT:g}")


def equivalence_grid(runs, stats: pd.DataFrame, decimals: int):
    """Per comparison against the baseline: the mean difference and the three posterior probabilities
    (None without `report.rope`)."""
    from reports.captions import axes_label, caption, cell_labels, constants_phrase, varying
    from reports.render import Cell, Grid, Note
    from reports.significance import MIN_SEEDS

    if stats.empty or "p_equivalent" not in stats:
        return None
    rope = float(stats.rope.iloc[0])
    axes = varying(runs, runs.axes) or runs.axes[:1]
    shown = cell_labels(runs, axes)
    rows = []
    for row in stats.itertuples():
        known = not math.isnan(row.p_equivalent)
        probabilities = [Cell(text=f"{value:.2f}" if known else "—") for value in
                         (row.p_better, row.p_equivalent, row.p_worse)]
        if known and row.p_equivalent >= EQUIVALENT:
            probabilities[1] = Cell(text=f"{row.p_equivalent:.2f}", mark=MARK)
        rows.append((shown.get(row.cell, row.cell),
                     [Cell(text=shown.get(row.baseline, row.baseline)), Cell(text=str(int(row.n_seeds))),
                      Cell(text=f"{row.difference:+.{decimals}f}" if not math.isnan(row.difference) else "—"),
                      *probabilities]))
    few = stats[stats.p_equivalent.isna()]
    notes: list = [Note(f"posterior probabilities that the cell's true mean test score is more than {rope:g} points "
                        f"above its baseline's (better), within ±{rope:g} (equivalent: report.rope) or more than "
                        f"{rope:g} below (worse): Bayesian correlated t-test over the paired seeds (Benavoli et al. "
                        "2017; baycomp's CorrelatedTTest with ρ = 0, as seeds are independent: a Student posterior, "
                        "n − 1 degrees of freedom, scale s/√n); Δ: the mean paired difference",
                        f"P: posterior of the mean difference vs. ±{rope:g} points (Bayesian t-test over seeds)"),
                   Note(f"{MARK} P(equivalent) ≥ {EQUIVALENT:g}: practically equivalent",
                        f"{MARK} P(equivalent)\u00a0≥\u00a0{EQUIVALENT:g}")]
    if len(few):
        notes.append(Note(f"—: fewer than {MIN_SEEDS} seeds pair with the baseline ({len(few)} of {len(stats)} cells)",
                          f"—: under {MIN_SEEDS} paired seeds"))
    what = (f"Practical equivalence against the baseline: the probability that each cell is better, equivalent "
            f"(within ±{rope:g} points) or worse, test score ×100 over seeds")
    return Grid(caption(what, constants_phrase(runs, axes[0] if axes else None)), axes_label(runs, axes),
                ["Baseline", "n", "Δ", "P(better)", "P(equivalent)", "P(worse)"], rows, notes, decimals)
