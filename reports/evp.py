"""Expected validation performance (Dodge et al., EMNLP 2019, "Show Your Work"): per tuned cell, the
expected best dev score among n tuning trials, for n = 1 .. N (the N trials that completed), so a
reader sees whether an arm won because it got more tuning.

Two estimators, by `report.expected_max`:
- `with_replacement` (default): the paper's, as its reference code (allenai's show_your_work,
  `expected_max_performance.py`) computes it: n draws from the empirical distribution of the N dev
  scores, i.e. sampling with replacement. With the scores sorted v(1) ≤ … ≤ v(N),
  E[max of n] = Σ_i v(i) · ((i/N)^n − ((i−1)/N)^n). At n = N it is below the observed best.
- `without_replacement`: n of the N trials drawn without replacement,
  E[max of n] = Σ_i v(i) · C(i−1, n−1) / C(N, n), the unbiased estimator of the expected maximum of n
  i.i.d. trials for n ≤ N (Tang et al. 2020); at n = N it is the observed best.
The band is ± the standard deviation of that maximum under the same sampling (the reference's
"variance", which is a standard deviation), clipped to the observed range.

Which trials: the completed ones, each with its best dev score over epochs — what selection compares.
A pruned trial's dev is a partial-training score of a run the pruner stopped, never comparable with a
fully trained trial's and never selectable, so it is not a draw; it counts in the budget (trials and
trial-epochs spent), and the table says how many there were. The estimator assumes i.i.d. trials (random
search); TPE's later trials depend on the earlier ones and ASHA keeps the promising ones, so the curve
describes this search's trials rather than n independent ones (said under the table).

Which estimator by default: Dodge et al. 2021 ("Expected Validation Performance and Estimation of a Random
Variable's Maximum") found the unbiased one the most variable and the lower-variance, biased one with replacement
to lead to fewer wrong conclusions when two models' curves are compared; so `with_replacement`.

Still rising: the curve pools the trials as exchangeable draws, so it cannot say by itself whether the search
was still improving (the rule before, the last step over 10 % of the rise, could not fire from 8 trials: with
replacement that share is at most 9.2 % at 8 trials and 7.0 % at 10, whatever the scores). The trials' order
can: a search that still improves scores its later trials higher than an exchangeable order would, and the
curve, pooling them, then understates what more trials buy. `trend_p` is Kendall's trend test of dev score
on trial number (Mann-Kendall), one-sided, exact for exchangeable trials of any distribution;
benchmarks/rising.py measures how often it fires for TPE searches still improving at 20 trials and for
saturated ones, against tests on the curve's end."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.special import comb
from scipy.stats import kendalltau

ESTIMATORS = ("with_replacement", "without_replacement")
RISING_LEVEL = 0.05  # still rising: the trend test's one-sided p over the completed trials in order is below this
BUDGET_TOLERANCE = 0.1  # arms whose trial-epochs differ by more than 10 % had unequal budgets


def max_probabilities(N: int, n: int, estimator: str = "with_replacement") -> np.ndarray:
    """P(the maximum of n draws is the i-th smallest of N scores), i = 1..N."""
    i = np.arange(1, N + 1, dtype=float)
    if estimator == "with_replacement":
        return (i / N) ** n - ((i - 1) / N) ** n
    if estimator == "without_replacement":
        if not 1 <= n <= N:
            raise ValueError(f"n must be in 1..{N} without replacement, but got n={n}")
        return comb(i - 1, n - 1, exact=False) / comb(N, n, exact=False)
    raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, but got estimator={estimator!r}")


def expected_max(scores, n: int, estimator: str = "with_replacement", mode: str = "max") -> tuple[float, float]:
    """(expected best, its standard deviation) of n trials drawn from `scores`; `mode: min` for a dev
    metric where smaller is better."""
    values = np.sort(np.asarray(scores, dtype=float) * (1 if mode == "max" else -1))
    if not len(values):
        return math.nan, math.nan
    p = max_probabilities(len(values), n, estimator)
    mean = float(np.dot(p, values))
    sd = float(np.sqrt(max(0.0, np.dot(p, (values - mean) ** 2))))
    return (mean if mode == "max" else -mean), sd


def curve(scores, estimator: str = "with_replacement", mode: str = "max") -> pd.DataFrame:
    """n = 1..N with the expected best and its standard deviation."""
    N = len(scores)
    rows = [(n, *expected_max(scores, n, estimator, mode)) for n in range(1, N + 1)]
    return pd.DataFrame(rows, columns=["trials", "expected_best", "sd"])


def trend_p(scores, mode: str = "max") -> tuple[float, float]:
    """(Kendall's tau between trial number and score, its one-sided p for later trials scoring better: greater
    for `mode: max`, smaller for `min`). Exact without ties; NaN under 3 scores or when all are equal."""
    values = np.asarray(scores, dtype=float)
    if len(values) < 3 or np.all(values == values[0]):
        return math.nan, math.nan
    found = kendalltau(np.arange(len(values)), values, alternative="greater" if mode == "max" else "less")
    return float(found.statistic), float(found.pvalue)


def still_rising(scores, mode: str = "max", level: float = RISING_LEVEL) -> bool:
    """Whether the search was still improving: its trials, in the order they ran, trend towards better
    dev scores (`trend_p` below `level`)."""
    p = trend_p(scores, mode)[1]
    return bool(p < level)


def fewest_to_tell(level: float = RISING_LEVEL) -> int:
    """The fewest trials whose best order (every trial better than the last) reaches a one-sided p below
    `level`: 1/n! is the smallest p of n trials."""
    n = 1
    while 1 / math.factorial(n) >= level:
        n += 1
    return n


def too_few_to_tell(completed: int, level: float = RISING_LEVEL) -> bool:
    """Whether `completed` trials are too few for `still_rising` ever to fire."""
    return completed < fewest_to_tell(level)


def trial_order(group: pd.DataFrame) -> pd.DataFrame:
    """A cell's tuning runs in the order the search asked for them (the trial number of `c0-t3`); the
    rows as they are where a key does not say."""
    if "trial_key" not in group:
        return group
    number = group["trial_key"].astype(str).str.extract(r"-t(\d+)$")[0].astype(float)
    if number.isna().any():
        return group
    return group.assign(_number=number).sort_values("_number", kind="stable").drop(columns="_number")


def tuning_budget(runs) -> pd.DataFrame:
    """Per tuned cell: trials, completed, pruned, failed, trial-epochs (every round every tuning trial
    ran), the expected best dev at the trials that completed and whether its curve still rises."""
    tuning = runs.runs[runs.runs.phase == "tune"] if "phase" in runs.runs else runs.runs.iloc[:0]
    if tuning.empty:
        return pd.DataFrame()
    estimator = runs.report.get("expected_max", "with_replacement")
    dev = f"best_{runs.metric}"
    rows = []
    for cell, group in tuning.groupby("cell", sort=False):
        done = trial_order(group[group.outcome == "completed"])
        scores = pd.to_numeric(done[dev], errors="coerce").dropna() if dev in done else pd.Series(dtype=float)
        points = curve(scores.to_numpy(), estimator, runs.mode)
        epochs = pd.to_numeric(group.get("epoch", pd.Series(dtype=float)), errors="coerce").fillna(0)
        last = points.iloc[-1] if len(points) else None
        few = too_few_to_tell(len(scores))
        tau, p = trend_p(scores.to_numpy(), runs.mode)
        rows.append({"cell": cell, "trials": len(group), "completed": len(scores),
                     "pruned": int((group.outcome == "pruned").sum()),
                     "failed": int(group.outcome.isin(["failed", "diverged"]).sum()),
                     "trial_epochs": float(epochs.sum()),
                     "expected_best": last.expected_best if last is not None else math.nan,
                     "expected_best_sd": last.sd if last is not None else math.nan,
                     "observed_best": (scores.max() if runs.mode == "max" else scores.min()) if len(scores)
                     else math.nan,
                     "last_gain": (points.expected_best.iloc[-1] - points.expected_best.iloc[-2]) if len(points) > 1
                     else math.nan,
                     "trend_tau": tau, "trend_p": p, "rising": bool(p < RISING_LEVEL), "too_few": few,
                     "estimator": estimator})
    return pd.DataFrame(rows)


def curves(runs) -> dict[str, pd.DataFrame]:
    """Each tuned cell's curve (for the plot)."""
    tuning = runs.runs[runs.runs.phase == "tune"] if "phase" in runs.runs else runs.runs.iloc[:0]
    estimator = runs.report.get("expected_max", "with_replacement")
    dev = f"best_{runs.metric}"
    out = {}
    for cell, group in tuning.groupby("cell", sort=False):
        done = group[group.outcome == "completed"]
        scores = pd.to_numeric(done[dev], errors="coerce").dropna() if dev in done else pd.Series(dtype=float)
        if len(scores):
            out[cell] = curve(scores.to_numpy(), estimator, runs.mode).assign(
                low=scores.min(), high=scores.max())
    return out


def unequal_budgets(budget: pd.DataFrame, stats: pd.DataFrame) -> list[str]:
    """For each comparison against the baseline: the arms' tuning budgets when they differ (trials, or
    trial-epochs by more than 10 %)."""
    if budget.empty or stats.empty:
        return []
    by_cell = budget.set_index("cell")
    out = []
    for row in stats.itertuples():
        if row.cell not in by_cell.index or row.baseline not in by_cell.index:
            continue
        ours, theirs = by_cell.loc[row.cell], by_cell.loc[row.baseline]
        larger = max(ours.trial_epochs, theirs.trial_epochs)
        if ours.trials != theirs.trials or (larger and abs(ours.trial_epochs - theirs.trial_epochs) >
                                            BUDGET_TOLERANCE * larger):
            out.append(f"{row.cell} against {row.baseline}: {int(ours.trials)} and {int(theirs.trials)} trials, "
                       f"{ours.trial_epochs:g} and {theirs.trial_epochs:g} trial-epochs")
    return out


NAMES = {"with_replacement": "with replacement (Dodge et al. 2019; the lower-variance estimator, which Dodge et al. "
                             "2021 found to draw fewer wrong conclusions than the unbiased one)",
         "without_replacement": "without replacement (unbiased for n ≤ N; of higher variance than the one with "
                                "replacement, Dodge et al. 2021)"}
SHORT_NAMES = {"with_replacement": "with replacement (Dodge et al. 2019, 2021)",
               "without_replacement": "without replacement (unbiased)"}


def budget_grid(runs, stats: pd.DataFrame):
    """The tuning budget of every tuned cell and its expected best dev score at that budget."""
    from reports.captions import axes_label, caption, cell_labels, constants_phrase, varying
    from reports.render import Cell, Grid, Note

    budget = tuning_budget(runs)
    if budget.empty:
        return None
    axes = varying(runs, runs.axes) or runs.axes[:1]
    shown = cell_labels(runs, axes)
    rows = []
    for row in budget.itertuples():
        counted = f"{row.trials}" + (f" ({row.pruned} pruned)" if row.pruned else "") + (
            f" ({row.failed} failed)" if row.failed else "")
        rows.append((shown.get(row.cell, row.cell), [
            Cell(text=counted), Cell(text=f"{row.trial_epochs:g}"), Cell(text=str(row.completed)),
            Cell(mean=row.expected_best, std=row.expected_best_sd), Cell(mean=row.observed_best),
            Cell(text="yes ↑" if row.rising else "too few" if row.too_few else "no")]))
    estimator = runs.report.get("expected_max", "with_replacement")
    notes: list = [Note(f"E[best dev]: the expected best dev score of n tuning trials at n = the trials that "
                        f"completed (mean ± sd of that best), {NAMES[estimator]}, over each cell's completed trials "
                        "and their best dev over epochs; pruned trials (a partial-training score, never selected) "
                        "count in the budget, not as draws; expected_dev_by_trials.png shows every n",
                        f"E[best dev]: expected best of the completed trials, {SHORT_NAMES[estimator]}"),
                   Note("the estimator assumes independent trials (random search); a TPE sampler's later trials "
                        "follow its earlier ones and a pruner keeps the promising ones, so the curve describes this "
                        "search rather than n independent trials")]
    level = f"{RISING_LEVEL:g}"
    notes.append(Note(f"Rising: whether the search was still improving, from the order its trials ran in: yes when "
                      "later trials scored better than earlier ones more than trials drawn independently of one "
                      "distribution would (Kendall's τ of dev score on trial number, one-sided p < "
                      f"{level}, exact for exchangeable trials; budget.csv trend_tau, trend_p); about "
                      f"{RISING_LEVEL * 100:g} % of saturated cells say yes by chance, and no means no evidence of a "
                      "rise, not that more trials cannot help (few trials detect only a steep one)"))
    rising = budget[budget.rising]
    if len(rising):
        text = (f"↑ still rising at the budget spent ({len(rising)} of {len(budget)} cells): later trials scored "
                f"better (trend p < {level}); E[best dev] pools the trials as independent draws, so it understates "
                "what more tuning trials would buy, and more may change these cells")
        notes.append(Note(text, f"↑ still rising at the budget spent: later trials better, p < {level} "
                                f"({len(rising)} of {len(budget)} cells)"))
    few = budget[budget.too_few]
    if len(few):
        fewest = fewest_to_tell()
        text = (f"too few: under {fewest} completed trials no order of the scores reaches p < {level} (the "
                "smallest one-sided p of n trials is 1/n!), so the trend cannot tell whether the search was still "
                f"improving ({len(few)} of {len(budget)} cells)")
        notes.append(Note(text, f"too few: under {fewest} completed trials, too few to tell whether still rising "
                                f"({len(few)} of {len(budget)} cells)"))
    unequal = unequal_budgets(budget, stats)
    if unequal:
        text = "unequal tuning budgets in comparisons against the baseline: " + "; ".join(unequal)
        notes.append(Note(text, f"unequal tuning budgets in {len(unequal)} comparison"
                                f"{'s' if len(unequal) > 1 else ''} against the baseline (notes in full)"))
    metric = runs.metric.replace("dev_", "dev ").replace("_", " ")
    what = (f"Tuning budget per cell (trials, trial-epochs) and the expected best {metric} ×100 at the budget "
            "spent (Dodge et al. 2019)")
    return Grid(caption(what, constants_phrase(runs, axes[0] if axes else None)), axes_label(runs, axes),
                ["Trials", "Trial-epochs", "Completed", "E[best dev]", "Best dev", "Rising"], rows, notes, 2)


def budget_plot(runs, stem):
    """expected_dev_by_trials.png/.pdf: each tuned cell's curve with its ± sd band, clipped to the
    observed range (as the reference plots it). None without completed tuning trials."""
    drawn = curves(runs)
    if not drawn:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for cell, points in drawn.items():
        x, mean, sd = points.trials.to_numpy(), points.expected_best.to_numpy(), points.sd.to_numpy()
        line, = axis.plot(x, mean, marker="o", label=cell)
        axis.fill_between(x, np.maximum(mean - sd, points.low.iloc[0]), np.minimum(mean + sd, points.high.iloc[0]),
                          color=line.get_color(), alpha=0.15)
    axis.set_xlabel("tuning trials n")
    axis.set_ylabel(f"expected best {runs.metric.replace('_', ' ')}")
    axis.xaxis.get_major_locator().set_params(integer=True)
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(stem.with_suffix(".png"), dpi=150)
    figure.savefig(stem.with_suffix(".pdf"))
    plt.close(figure)
    return stem
