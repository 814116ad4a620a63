"""How many seeds would have been enough: for each comparison against the baseline, the smallest
difference the paired t-test over seeds detects with 80 % power at the comparison's n and the observed
spread of its paired differences, and the seeds it would take to detect a difference the study names
(`report.detect`).

Power of the two-sided paired t-test (a one-sample t-test on the n paired differences): with
d = true mean difference and s = their standard deviation, t = mean/(s/√n) follows a noncentral t with
n − 1 degrees of freedom and noncentrality d√n/s; power = P(|t| > t_crit). This is a sensitivity
analysis of the design (which differences the study could see), not post-hoc power of the observed
difference. The `_corrected` figures use α/m (Bonferroni over the table's m comparisons against the
baseline), the level a Holm-corrected mark needs of its smallest p: a bound for the marks the table prints."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.stats import nct
from scipy.stats import t as t_dist

POWER = 0.8
MAX_SEEDS = 10_000


def paired_power(n: int, difference: float, sd: float, alpha: float) -> float:
    """Power of the two-sided paired t-test at level `alpha` over `n` pairs whose differences have
    mean `difference` and standard deviation `sd`."""
    if n < 2 or not sd > 0:
        return math.nan
    df = n - 1
    shift = abs(difference) * math.sqrt(n) / sd
    critical = t_dist.ppf(1 - alpha / 2, df)
    upper, lower = float(nct.sf(critical, df, shift)), float(nct.cdf(-critical, df, shift))
    # far in the tails scipy's noncentral t gives NaN for what is 0 (the wrong tail) or 1 (a huge shift)
    upper = upper if math.isfinite(upper) else 1.0
    lower = lower if math.isfinite(lower) else 0.0
    return min(1.0, upper + lower)


def detectable_difference(n: int, sd: float, alpha: float, power: float = POWER) -> float:
    """The smallest true difference the test detects with `power` at n pairs (NaN below 2 pairs or
    without spread)."""
    if n < 2 or not sd > 0 or not math.isfinite(sd):
        return math.nan
    high = sd
    while paired_power(n, high, sd, alpha) < power:
        high *= 2
    return float(brentq(lambda d: paired_power(n, d, sd, alpha) - power, 0.0, high, xtol=1e-12 * sd, rtol=1e-12))


def seeds_needed(difference: float, sd: float, alpha: float, power: float = POWER) -> float:
    """The fewest seeds (pairs) with which the test detects `difference` with `power` (NaN without spread)."""
    if not sd > 0 or not difference or not math.isfinite(sd):
        return math.nan
    n = 2
    while paired_power(n, difference, sd, alpha) < power:
        n += 1 if n < 64 else max(1, n // 8)
        if n > MAX_SEEDS:
            return math.inf
    if n > 64:  # the coarse steps above 64 overshoot: step back one seed at a time
        while n > 2 and paired_power(n - 1, difference, sd, alpha) >= power:
            n -= 1
    return float(n)


def paired_differences(runs, cell: str, baseline: str, metric: str) -> np.ndarray:
    """The cell's minus its baseline's test score, seed by seed (the pairs the t-test compares)."""
    from reports.significance import _by_seed

    done = runs.replicates()[runs.replicates().outcome == "completed"]
    ours, theirs = _by_seed(done[done.cell == cell], metric), _by_seed(done[done.cell == baseline], metric)
    seeds = sorted(set(ours.index) & set(theirs.index))
    return (ours.loc[seeds, metric].to_numpy(dtype=float) - theirs.loc[seeds, metric].to_numpy(dtype=float)
            if seeds else np.array([]))


def add_power(stats: pd.DataFrame, runs, metric: str, alpha: float, detect: float | None = None) -> pd.DataFrame:
    """`stats` with, per comparison: the sd of its paired differences, the differences detectable with
    80 % power at its n (`detectable_80`, and at α/m `detectable_80_corrected`), and with `detect` the
    seeds needed to detect it (`seeds_for_detect`, `seeds_for_detect_corrected`)."""
    if stats.empty:
        return stats
    family = max(1, len(stats))  # the table's comparisons: a design figure, whatever the seeds that came in
    corrected = alpha / family if stats.get("correction", pd.Series(["holm"])).iloc[0] != "none" else alpha
    rows = []
    for row in stats.itertuples():
        differences = paired_differences(runs, row.cell, row.baseline, metric)
        sd = float(np.std(differences, ddof=1)) if len(differences) >= 2 else math.nan
        rows.append({"difference_sd": sd,
                     "detectable_80": detectable_difference(len(differences), sd, alpha),
                     "detectable_80_corrected": detectable_difference(len(differences), sd, corrected),
                     "seeds_for_detect": seeds_needed(detect, sd, alpha) if detect else math.nan,
                     "seeds_for_detect_corrected": seeds_needed(detect, sd, corrected) if detect else math.nan})
    return pd.concat([stats.reset_index(drop=True), pd.DataFrame(rows)], axis=1).assign(
        power_alpha=alpha, power_alpha_corrected=corrected, detect=detect if detect else math.nan)


def power_note(stats: pd.DataFrame, detect: float | None) -> str | None:
    """The footnote: what the table's n could detect, and the seeds a named difference needs."""
    if stats.empty or "detectable_80" not in stats or stats.detectable_80.isna().all():
        return None
    known = stats.dropna(subset=["detectable_80"])
    ns = sorted({int(n) for n in known.n_seeds})
    text = (f"with n = {', '.join(map(str, ns))} seeds and each comparison's spread of paired differences, the "
            f"paired t-test detects differences of {_range(known.detectable_80)} points with 80 % power "
            f"({_range(known.detectable_80_corrected)} after the correction)")
    if detect:
        needed = known.seeds_for_detect_corrected
        text += (f"; detecting {detect:g} points would take {_range(needed, integer=True)} seeds per cell "
                 "(after the correction; stats.csv per comparison)")
    return text


def _range(values: pd.Series, integer: bool = False) -> str:
    shown = [("∞" if math.isinf(v) else f"{v:.0f}") if integer else f"{v:.2f}" for v in (values.min(), values.max())]
    return shown[0] if shown[0] == shown[1] else f"{shown[0]}–{shown[1]}"


def attach_power_note(grids: list, stats: pd.DataFrame, detect: float | None) -> None:
    """Add the power footnote to the ablation table: in full always, under the table when the study
    names a difference to detect (`report.detect`)."""
    from reports.render import Note

    text = power_note(stats, detect)
    for name, grid in grids:
        if name == "ablation" and text:
            grid.footnotes.append(Note(text, text if detect else None))
