"""Significance against the study's baseline cell of each row: a paired test over seeds (the
t-test by default, the field's convention; Wilcoxon's signed-rank or an exact sign-flip
permutation test on request) and a paired bootstrap over test pairs using the per-pair predictions
every replicate run stores.

A rank or permutation test over n seeds cannot give a p below 2/2^n; after a correction over m
comparisons the smallest reachable p is m times that. The report says so rather than print no
mark silently (`reachable`), and it marks nothing with fewer than `MIN_SEEDS` paired seeds."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy.stats import permutation_test, ttest_rel, wilcoxon

from reports.aggregate import row_groups
from reports.bootstrap import paired_bootstrap
from reports.collect import StudyRuns
from reports.multibootstrap import multibootstrap

LEVEL = 0.05
CORRECTIONS = {"holm": "Holm–Bonferroni", "bonferroni": "Bonferroni", "none": "no"}
SEED_TESTS = {"t": "paired t-test", "wilcoxon": "Wilcoxon signed-rank", "permutation": "sign-flip permutation test"}
MIN_SEEDS = 3  # a test over fewer paired seeds marks nothing
PERMUTATIONS = 10_000  # exact (every sign flip) up to 13 seeds, Monte Carlo above


def paired_p(test: str, ours: np.ndarray, theirs: np.ndarray) -> float:
    """Two-sided p of the paired test `test` over seeds (NaN when every difference is zero)."""
    if len(ours) < 2 or not np.any(ours != theirs):
        return math.nan
    if test == "t":
        with warnings.catch_warnings():
            # the same difference on every seed (to float64's resolution): scipy warns of precision loss in
            # their variance, yet its t is infinite or ~1e13 either way and p 0 or ~1e-27, a constant shift;
            # the warning would reach `orchestrator report`'s terminal as two lines of scipy's source
            warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
            return float(ttest_rel(ours, theirs).pvalue)
    if test == "wilcoxon":
        return float(wilcoxon(ours, theirs).pvalue)
    result = permutation_test((ours, theirs), lambda a, b, axis: np.mean(a - b, axis=axis), vectorized=True,
                              permutation_type="samples", n_resamples=PERMUTATIONS, random_state=0)
    return float(result.pvalue)


def smallest_p(test: str, n: int) -> float:
    """The smallest two-sided p the test can give over n paired seeds: 0 for the t-test, 2/2^n for
    Wilcoxon's exact distribution and for exact sign flips (2/(B+1) with B Monte Carlo flips)."""
    if test == "t":
        return 0.0
    if test == "permutation" and 2 ** n > PERMUTATIONS:
        return 2 / (PERMUTATIONS + 1)
    return min(1.0, 2 / 2 ** n)


def comparisons_factor(correction: str, m: int) -> int:
    """How much the correction multiplies the smallest p of a family of m comparisons."""
    return 1 if correction == "none" else max(1, m)


def reachable(test: str, n: int, m: int, correction: str, alpha: float) -> bool:
    """Can any comparison over n seeds be marked at `alpha` among m corrected comparisons?"""
    return n >= MIN_SEEDS and comparisons_factor(correction, m) * smallest_p(test, n) < alpha


def adjust_p(values: pd.Series, method: str) -> pd.Series:
    """p-values corrected for the number of comparisons (NaN ones excluded): Holm's step-down
    (the default: uniformly more powerful than Bonferroni, same family-wise error guarantee),
    Bonferroni, or none."""
    valid = values.dropna()
    m = len(valid)
    if method == "none" or m == 0:
        return values.astype(float)
    if method == "bonferroni":
        return (values * m).clip(upper=1.0)
    adjusted, running = {}, 0.0
    for rank, index in enumerate(valid.sort_values(kind="stable").index):
        running = max(running, min(1.0, (m - rank) * float(valid[index])))
        adjusted[index] = running
    return pd.Series([adjusted.get(i, math.nan) for i in values.index], index=values.index, dtype=float)


def baseline_value(group: pd.DataFrame, column_axis: str, wanted) -> object | None:
    """`last` is the largest value of the column axis in this row (the last layer)."""
    values = list(group[column_axis])
    if wanted == "last":
        numeric = [v for v in values if isinstance(v, int | float)]
        return max(numeric) if numeric else None
    return wanted if wanted in values else None


def compare_to_baseline(runs: StudyRuns, summary: pd.DataFrame, row_axes: list[str], column_axis: str,
                        baseline, metric: str, bootstrap: bool = True, correction: str = "holm",
                        seed_test: str = "t") -> pd.DataFrame:
    """One row per (cell, its row's baseline cell): differences, raw p-values of every seed-level
    test and of the bootstrap, and p-values corrected over the table's comparisons (`*_adj`).
    `paired_p` is `seed_test`'s p, left out (NaN) below `MIN_SEEDS` paired seeds."""

    replicates = runs.replicates()
    done = replicates[replicates.outcome == "completed"]
    out = []
    predictions: dict = {}  # run id -> its test predictions (None: none stored)
    resampled: dict = {}  # run id -> its test Spearman and its Spearman in each of the bootstrap's resamples
    for _, group in row_groups(summary, row_axes):
        wanted = baseline_value(group, column_axis, baseline)
        if wanted is None:
            continue
        base_cell = group[group[column_axis] == wanted].iloc[0]["cell"]
        base_runs = _by_seed(done[done.cell == base_cell], metric)
        for cell in group.cell:
            if cell == base_cell:
                continue
            cell_runs = _by_seed(done[done.cell == cell], metric)
            seeds = sorted(set(cell_runs.index) & set(base_runs.index))
            ours = cell_runs.loc[seeds, metric].to_numpy(dtype=float) if seeds else np.array([])
            theirs = base_runs.loc[seeds, metric].to_numpy(dtype=float) if seeds else np.array([])
            row = {"cell": cell, "baseline": base_cell, "n_seeds": len(seeds),
                   "difference": float(np.mean(ours - theirs)) if seeds else math.nan,
                   **{f"{name}_p": paired_p(name, ours, theirs) for name in ("t", "wilcoxon", "permutation")},
                   "bootstrap_difference": math.nan, "bootstrap_p": math.nan, "bootstrap_refused": None,
                   "multibootstrap_p": math.nan}
            if bootstrap and seeds and metric == "test_spearman":
                ids = [cell_runs.loc[s, "run_id"] for s in seeds] + [base_runs.loc[s, "run_id"] for s in seeds]
                for run_id in ids:  # each run's predictions read once (a baseline's serve its whole row)
                    if run_id not in predictions:
                        predictions[run_id] = runs.predictions(run_id)
                cell_predictions = [predictions[run_id] for run_id in ids[:len(seeds)]]
                base_predictions = [predictions[run_id] for run_id in ids[len(seeds):]]
                if all(p is not None for p in cell_predictions + base_predictions):
                    try:
                        row["bootstrap_difference"], row["bootstrap_p"] = paired_bootstrap(
                            cell_predictions, base_predictions, cache=resampled, keys=ids)
                        if len(seeds) >= MIN_SEEDS:  # the same resamples of the pairs, the seeds drawn too
                            row["multibootstrap_p"] = multibootstrap(cell_predictions, base_predictions,
                                                                     cache=resampled, keys=ids)[1]
                    except ValueError as exc:  # refused: not paired
                        row["bootstrap_refused"] = str(exc)
            out.append(row)
    stats = pd.DataFrame(out, columns=["cell", "baseline", "n_seeds", "difference", "t_p", "wilcoxon_p",
                                       "permutation_p", "bootstrap_difference", "bootstrap_p", "bootstrap_refused",
                                       "multibootstrap_p"])
    stats["paired_test"] = SEED_TESTS[seed_test]
    chosen = stats[f"{seed_test}_p"].astype(float)
    stats["paired_p"] = chosen.where(stats.n_seeds >= MIN_SEEDS)
    stats["paired_p_adj"] = adjust_p(stats.paired_p, correction)
    stats["bootstrap_p_adj"] = adjust_p(stats.bootstrap_p.astype(float), correction)
    stats["multibootstrap_p_adj"] = adjust_p(stats.multibootstrap_p.astype(float), correction)
    stats["correction"] = correction
    return stats


def _by_seed(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """A cell's completed runs with a finite value of `metric`, one per seed (the first kept)."""
    if metric not in runs:
        return runs.iloc[:0].set_index("seed")
    valid = runs[pd.to_numeric(runs[metric], errors="coerce").notna()]
    return valid.drop_duplicates("seed").set_index("seed")


def marks(stats: pd.DataFrame, alpha: float = LEVEL) -> dict[str, str]:
    """Per cell: † when the paired test over seeds has a corrected p < alpha, ‡ when the paired
    bootstrap over test pairs has a corrected p < alpha."""
    out = {}
    for row in stats.itertuples():
        symbol = ("†" if row.paired_p_adj < alpha else "") + ("‡" if row.bootstrap_p_adj < alpha else "")
        if symbol:
            out[row.cell] = symbol
    return out
