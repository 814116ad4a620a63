"""How many replicate seeds a cell gets under `replicate.until`: pure functions of dev scores.

`sequential` (the rule before): add a seed while the 95 % t-interval of the mean dev score is wider
than the target. It stops on a draw whose spread happens to be small, so the std it reports runs
low and its interval covers the true mean less often than 95 % (optional stopping).

`two_stage` (the default, after Stein 1945): the first `seeds` fix the total once, from their own
spread only: n = ceil((t * s / target)^2), capped at `max_seeds`. The seeds added afterwards are
never looked at by the rule, so the std over all n seeds is not selected for being small.
`benchmarks/adaptive_seeds.py` measures both against a fixed n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RULES = ("two_stage", "sequential")


def ci95_half(values: Sequence[float]) -> float:
    """Half-width of the 95 % Student-t interval of the mean (inf with fewer than two values)."""
    if len(values) < 2:
        return math.inf
    from scipy.stats import t as t_dist

    return float(t_dist.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))


def stein_half(first: Sequence[float], n: int) -> float:
    """Half-width of Stein's 95 % interval for the mean of n seeds whose total the first stage fixed:
    t_{k-1} * s_k / sqrt(n), with the first stage's k values and std. Exact (its coverage is 95 %
    whatever the cap) because n depends on s_k only and the mean of n normal values is independent
    of s_k; the t-interval over all n is not (it covered 91-95 % in benchmarks/adaptive_seeds.py)."""
    k = len(first)
    if k < 2 or n < 1:
        return math.inf
    from scipy.stats import t as t_dist

    return float(t_dist.ppf(0.975, k - 1) * np.std(first, ddof=1) / math.sqrt(n))


def seeds_needed(first: Sequence[float], target: float, max_seeds: int) -> int:
    """Two-stage: the total seeds whose mean reaches a ±target 95 % interval, from the first stage's
    spread: n = ceil((t_{k-1} * s_k / target)^2), at least k, at most max_seeds."""
    k = len(first)
    if k < 2:
        return max_seeds
    from scipy.stats import t as t_dist

    s = float(np.std(first, ddof=1))
    n = math.ceil((float(t_dist.ppf(0.975, k - 1)) * s / target) ** 2) if s > 0 else k
    return max(k, min(max_seeds, n))


def wants_another(rule: str, values: Sequence[float], first_stage: int, target: float,
                  max_seeds: int) -> tuple[bool, str]:
    """(add one more seed?, why) for a cell whose finished replicates scored `values` on dev, in seed
    order; the first `first_stage` of them are the planned seeds."""
    n = len(values)
    if rule == "two_stage":
        needed = seeds_needed(values[:first_stage], target, max_seeds)
        if n < needed:
            return True, f"{n} of {needed} seeds (fixed by the first {first_stage} seeds' spread for ±{target:g})"
        half = stein_half(values[:first_stage], n)
        capped = " (capped at max_seeds)" if needed == max_seeds and half > target else ""
        return False, (f"stopped: {n} seeds as the first {first_stage} fixed{capped}; dev 95% CI ±{half:.2f} "
                       "(Stein)")
    half = ci95_half(values)
    if half <= target:
        return False, f"stopped: dev 95% CI ±{half:.2f} ≤ {target:g} after {n} seeds"
    if n >= max_seeds:
        return False, f"stopped at max_seeds {max_seeds}: dev 95% CI ±{half:.2f}"
    return True, f"dev 95% CI ±{half:.2f} > {target:g} after {n} seeds: one more"
