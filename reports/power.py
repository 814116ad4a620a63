"""How many seeds would have been enough: for each comparison against the baseline, the smallest
difference the paired t-test over seeds detects with 80 % power at the comparison's n and the observed
spread of its paired differences, and the seeds it would take to detect a difference the study names
(`report.detect`).

Power of the two-sided paired t-test (a one-sample t-test on the n paired differences): with
d = true mean difference and s = their standard deviation, t = mean/(s/√n) follows a noncentral t with
n − 1 degrees of freedom and noncentrality d√n/s; power = P(|t| > t_crit). This is a sensitivity
analysis of the design (which differences the study could see), not post-hoc power of the observed
difference. The `_corrected` figures use α/m (Bonferroni over the table's m comparisons against the
baseline), the level a Holm-corrected mark needs of its smallest p: a bound for the marks the table prints.

The spread s of n paired differences is itself an estimate, and at the n of seed studies a rough one: σ's 95 %
confidence interval, s·sqrt((n−1)/χ²(0.975, n−1)) to s·sqrt((n−1)/χ²(0.025, n−1)), spans a factor of 6.6 at
n = 4. Both figures grow with σ, so each comes with the interval it takes over σ's interval (`_low`, `_high`).
The footnote gives the detectable difference only for comparisons the table tests (at least `MIN_SEEDS` paired
seeds), and the seeds a named difference needs, a plan for the next study, from any two pairs on."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.stats import chi2, nct
from scipy.stats import t as t_dist

POWER = 0.8
MAX_SEEDS = 10_000
CONFIDENCE = 0.95  # of sigma's interval


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
    without spread). Power depends on the difference only through difference / sd, so this is sd times the
    detectable effect at n, which every comparison of the same n shares."""
    if n < 2 or not sd > 0 or not math.isfinite(sd):
        return math.nan
    return sd * _detectable_effect(int(n), float(alpha), float(power))


@functools.lru_cache(maxsize=1024)
def _detectable_effect(n: int, alpha: float, power: float) -> float:
    """The smallest difference / sd the test detects with `power` at n pairs."""
    high = 1.0
    while paired_power(n, high, 1.0, alpha) < power:
        high *= 2
    return float(brentq(lambda d: paired_power(n, d, 1.0, alpha) - power, 0.0, high, xtol=1e-12, rtol=1e-12))


def _powers(ns: np.ndarray, effect: float, alpha: float) -> np.ndarray:
    """paired_power at each n of `ns` for a difference of `effect` sds, in one call of scipy's noncentral t."""
    df = ns - 1
    shift = effect * np.sqrt(ns)
    critical = t_dist.ppf(1 - alpha / 2, df)
    upper, lower = nct.sf(critical, df, shift), nct.cdf(-critical, df, shift)
    return np.minimum(1.0, np.where(np.isfinite(upper), upper, 1.0) + np.where(np.isfinite(lower), lower, 0.0))


FIRST_SEEDS = np.arange(2, 65)  # seeds_needed tries these one by one (at once), then coarser steps


def seeds_needed(difference: float, sd: float, alpha: float, power: float = POWER) -> float:
    """The fewest seeds (pairs) with which the test detects `difference` with `power` (NaN without spread)."""
    if not sd > 0 or not difference or not math.isfinite(sd):
        return math.nan
    enough = np.flatnonzero(_powers(FIRST_SEEDS, abs(difference) / sd, alpha) >= power)
    if len(enough):
        return float(FIRST_SEEDS[enough[0]])
    n = int(FIRST_SEEDS[-1])
    while paired_power(n, difference, sd, alpha) < power:
        n += max(1, n // 8)
        if n > MAX_SEEDS:
            return math.inf
    while n > 2 and paired_power(n - 1, difference, sd, alpha) >= power:  # the coarse steps overshoot: step back
        n -= 1
    return float(n)


def sigma_interval(sd: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The `confidence` interval of σ from the sample sd of n normal draws (χ² with n − 1 degrees of
    freedom); NaN below 2 draws or without a spread."""
    if n < 2 or not sd > 0 or not math.isfinite(sd):
        return math.nan, math.nan
    tail = (1 - confidence) / 2
    return (sd * math.sqrt((n - 1) / chi2.ppf(1 - tail, n - 1)), sd * math.sqrt((n - 1) / chi2.ppf(tail, n - 1)))


def paired_differences(runs, cell: str, baseline: str, metric: str) -> np.ndarray:
    """The cell's minus its baseline's test score, seed by seed (the pairs the t-test compares)."""
    from reports.significance import _by_seed

    done = runs.replicates()[runs.replicates().outcome == "completed"]
    ours, theirs = _by_seed(done[done.cell == cell], metric), _by_seed(done[done.cell == baseline], metric)
    seeds = sorted(set(ours.index) & set(theirs.index))
    return (ours.loc[seeds, metric].to_numpy(dtype=float) - theirs.loc[seeds, metric].to_numpy(dtype=float)
            if seeds else np.array([]))


def add_power(stats: pd.DataFrame, runs, metric: str, alpha: float, detect: float | None = None) -> pd.DataFrame:
    """`stats` with, per comparison: the sd of its paired differences and σ's 95 % interval
    (`difference_sd_low`, `_high`), the differences detectable with 80 % power at its n (`detectable_80`, and at
    α/m `detectable_80_corrected`), and with `detect` the seeds needed to detect it (`seeds_for_detect`,
    `seeds_for_detect_corrected`); each figure also at the ends of σ's interval (`_low`, `_high`)."""
    if stats.empty:
        return stats
    family = max(1, len(stats))  # the table's comparisons: a design figure, whatever the seeds that came in
    corrected = alpha / family if stats.get("correction", pd.Series(["holm"])).iloc[0] != "none" else alpha
    rows = []
    for row in stats.itertuples():
        differences = paired_differences(runs, row.cell, row.baseline, metric)
        n = len(differences)
        sd = float(np.std(differences, ddof=1)) if n >= 2 else math.nan
        low, high = sigma_interval(sd, n)
        figures = {"difference_sd": sd, "difference_sd_low": low, "difference_sd_high": high}
        for suffix, sigma in (("", sd), ("_low", low), ("_high", high)):
            figures[f"detectable_80{suffix}"] = detectable_difference(n, sigma, alpha)
            figures[f"detectable_80_corrected{suffix}"] = detectable_difference(n, sigma, corrected)
            figures[f"seeds_for_detect{suffix}"] = seeds_needed(detect, sigma, alpha) if detect else math.nan
            figures[f"seeds_for_detect_corrected{suffix}"] = (seeds_needed(detect, sigma, corrected) if detect
                                                              else math.nan)
        rows.append(figures)
    return pd.concat([stats.reset_index(drop=True), pd.DataFrame(rows)], axis=1).assign(
        power_alpha=alpha, power_alpha_corrected=corrected, detect=detect if detect else math.nan)


def tested(stats: pd.DataFrame) -> pd.DataFrame:
    """The comparisons the table runs its test over seeds for (at least `MIN_SEEDS` paired seeds) and
    whose detectable difference is known: what a statement of the test's power may speak for."""
    from reports.significance import MIN_SEEDS

    if stats.empty or "detectable_80" not in stats:
        return stats.iloc[:0]
    return stats[(stats.n_seeds >= MIN_SEEDS) & stats.detectable_80.notna()]


def power_note(stats: pd.DataFrame, detect: float | None) -> str | None:
    """The footnote: what the table's n could detect (comparisons it tests), and the seeds a named
    difference needs; each at the observed spread and over σ's 95 % interval."""
    if stats.empty or "detectable_80" not in stats:
        return None
    parts = []
    known = tested(stats)
    if len(known):
        ns = sorted({int(n) for n in known.n_seeds})
        parts.append(f"with n = {', '.join(map(str, ns))} seeds the paired t-test detects with 80 % power differences "
                     f"of {_range(known.detectable_80)} points at each comparison's observed spread of paired "
                     f"differences, {_span(known.detectable_80_low, known.detectable_80_high)} with σ anywhere in its "
                     f"{CONFIDENCE * 100:g} % confidence interval (χ², n − 1 degrees of freedom); after the correction "
                     f"{_range(known.detectable_80_corrected)}, "
                     f"{_span(known.detectable_80_corrected_low, known.detectable_80_corrected_high)}")
    planned = stats.dropna(subset=["seeds_for_detect_corrected"]) if detect else stats.iloc[:0]
    if len(planned):
        parts.append(f"detecting {detect:g} points would take {_range(planned.seeds_for_detect_corrected, True)} seeds "
                     f"per cell at the observed spreads, "
                     f"{_span(planned.seeds_for_detect_corrected_low, planned.seeds_for_detect_corrected_high, True)} "
                     f"within σ's {CONFIDENCE * 100:g} % intervals (after the correction; stats.csv per comparison)")
    return "; ".join(parts) or None


def short_power_note(stats: pd.DataFrame, detect: float | None) -> str | None:
    """The line under the table when the study names a difference to detect: the seeds it needs."""
    planned = stats.dropna(subset=["seeds_for_detect_corrected"]) if detect and "seeds_for_detect_corrected" in stats \
        else stats.iloc[:0]
    if not len(planned):
        return None
    return (f"detecting {detect:g} points would take {_range(planned.seeds_for_detect_corrected, True)} seeds "
            f"({_span(planned.seeds_for_detect_corrected_low, planned.seeds_for_detect_corrected_high, True)} over "
            f"σ's {CONFIDENCE * 100:g} % interval)")


def _format(value: float, integer: bool) -> str:
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if integer else f"{value:.2f}"


def _range(values: pd.Series, integer: bool = False) -> str:
    shown = [_format(v, integer) for v in (values.min(), values.max())]
    return shown[0] if shown[0] == shown[1] else f"{shown[0]}–{shown[1]}"


def _span(lows: pd.Series, highs: pd.Series, integer: bool = False) -> str:
    """From the smallest low end to the largest high end."""
    return f"{_format(lows.min(), integer)}–{_format(highs.max(), integer)}"


def attach_power_note(grids: list, stats: pd.DataFrame, detect: float | None) -> None:
    """Add the power footnote to the ablation table: in full always, under the table when the study
    names a difference to detect (`report.detect`)."""
    from reports.render import Note

    text = power_note(stats, detect)
    for name, grid in grids:
        if name == "ablation" and text:
            grid.footnotes.append(Note(text, short_power_note(stats, detect)))
