"""Almost Stochastic Order (ASO): is cell A's score distribution over seeds almost stochastically larger than
cell B's? (del Barrio, Cuesta-Albertos and Matrán 2018; Dror, Shlomov and Reichart, "Deep Dominance", ACL
2019; as deepsig computes it, Ulmer, Hardmeier and Frellsen 2022, `deepsig/aso.py` 1.2.8.)

With F⁻¹ and G⁻¹ the empirical quantile functions of A's and B's scores, the violation ratio

    ε_W2(A, B) = ∫_{F⁻¹(t) < G⁻¹(t)} (F⁻¹(t) − G⁻¹(t))² dt  /  ∫₀¹ (F⁻¹(t) − G⁻¹(t))² dt

is the share of the squared Wasserstein-2 distance where A lies below B: 0 when every quantile of A is at
least B's (stochastic order), 1 when none is, and ε(A, B) + ε(B, A) = 1. ε_min is its one-sided upper
confidence bound, ε̂ + Φ⁻¹(confidence) · σ̂ with σ̂ the standard deviation of ε over bootstrap resamples of
both score sets. **ε_min < τ = 0.2 reads "A is almost stochastically larger than B"** (Ulmer et al.'s
threshold); ε_min ≥ 0.5 says nothing in A's favour. Unlike the paired t-test it compares the two
distributions, not paired seeds, and it is one-directional: ask ε_min(B, A) for the other way.

The integrals are sums over the grid t = dt, 2·dt, … < 1 (dt = 0.005, deepsig's), each quantile function
evaluated as deepsig's `get_quantile_function` does, and the bootstrap draws each resample as deepsig does
(the quantile function at uniform draws), so given the same uniforms the numbers are deepsig's
(tests/reports/test_aso.py checks them against its printed values). Where it differs, or can:

- deepsig leaves the grid's first point out of the violation integral but not out of W2 (its comment says
  "ignore t = 0", but the grid starts at dt), so there ε(A, B) + ε(B, A) = 1 − dt·(G⁻¹(dt) − F⁻¹(dt))²/W2.
  `skip_first_point=True` (the default) keeps that, to agree with deepsig; False integrates the whole grid,
  where the sum is 1 as in del Barrio et al.
- the bootstrap is vectorised instead of parallel (no `num_jobs`), and its uniforms come from numpy's
  `default_rng(seed)` (deepsig reseeds the legacy global generator with seed + i for resample i): the same
  seed gives other resamples than deepsig's, so ε_min agrees with deepsig's within the bootstrap's own spread,
  and exactly given the same uniforms (`bootstrap_ratios`). Every comparison of one call uses the same
  uniforms, as a loop over deepsig with one seed does, so a comparison's ε_min does not depend on the others.
- two score sets with no distance between them (W2 = 0) give ε = 0.5, as in deepsig, without its warning;
  `seed` defaults to 0, not None, so a report's ε_min is the same every time it is built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

THRESHOLD = 0.2  # τ: ε_min below it reads "A is almost stochastically larger than B" (Ulmer et al. 2022)
DT = 0.005  # deepsig's aso() grid step (its compute_violation_ratio alone defaults to 0.001)
BOOTSTRAP = 1000
_CHUNK_ELEMENTS = 4_000_000  # resampled quantiles held at once (32 MB of floats)


@dataclass(frozen=True)
class ASOResult:
    """ε_min (the upper bound that `THRESHOLD` is compared with) and the observed violation ratio ε̂: floats for
    one comparison, arrays of the batch's shape for many."""

    eps_min: float | np.ndarray
    violation_ratio: float | np.ndarray


@functools.lru_cache(maxsize=256)
def _grid_segments(n_a: int, n_b: int, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid t = dt, 2·dt, … < 1 in runs where neither empirical quantile changes: per run, the sorted-score
    index of A's and of B's quantile (deepsig: sorted[clip(ceil(n·t) − 1, 0, n − 1)]) and how many points."""
    t = np.arange(dt, 1, dt)
    index_a = np.clip(np.ceil(n_a * t).astype(int) - 1, 0, n_a - 1)
    index_b = np.clip(np.ceil(n_b * t).astype(int) - 1, 0, n_b - 1)
    starts = np.flatnonzero(np.r_[True, (index_a[1:] != index_a[:-1]) | (index_b[1:] != index_b[:-1])])
    counts = np.diff(np.r_[starts, len(t)])
    return index_a[starts], index_b[starts], counts


def _ratio(quantiles_a: np.ndarray, quantiles_b: np.ndarray, counts: np.ndarray, dt: float,
           skip_first_point: bool) -> np.ndarray:
    """ε_W2 from both quantile functions on the grid's runs (last axis: the runs, `counts` points each)."""
    difference = quantiles_b - quantiles_a
    squared = difference * difference
    distance = squared @ (counts * dt)
    violated_counts = counts.copy()
    if skip_first_point:
        violated_counts[0] -= 1
    violation = np.where(difference > 0, squared, 0.0) @ (violated_counts * dt)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(distance == 0, 0.5, violation / np.where(distance == 0, 1.0, distance))


def _scores(values, name: str) -> np.ndarray:
    scores = np.asarray(values, dtype=float)
    if scores.ndim == 0 or scores.shape[-1] == 0:
        raise ValueError(f"{name} must hold at least one score (its last axis), but got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"{name} must be finite, but got {scores[~np.isfinite(scores)][:3].tolist()}")
    return np.sort(scores, axis=-1)


def _check_dt(dt: float) -> None:
    if not 0 < dt < 1:
        raise ValueError(f"dt must be in (0, 1), but got dt={dt}")


def violation_ratio(scores_a, scores_b, dt: float = DT, skip_first_point: bool = True) -> float | np.ndarray:
    """ε_W2(A, B), the share of the squared Wasserstein-2 distance between the two empirical score
    distributions where A's quantile lies below B's (deterministic: no bootstrap). Scores on the last axis;
    leading axes are a batch of comparisons (broadcast). 0.5 where the two have no distance."""
    _check_dt(dt)
    sorted_a, sorted_b = _scores(scores_a, "scores_a"), _scores(scores_b, "scores_b")
    index_a, index_b, counts = _grid_segments(sorted_a.shape[-1], sorted_b.shape[-1], dt)
    found = _ratio(sorted_a[..., index_a], sorted_b[..., index_b], counts, dt, skip_first_point)
    return float(found) if found.ndim == 0 else found


def bootstrap_ratios(scores_a, scores_b, uniforms_a: np.ndarray, uniforms_b: np.ndarray, dt: float = DT,
                     skip_first_point: bool = True) -> np.ndarray:
    """(..., B): ε_W2 of B bootstrap resamples, resample i drawing A's scores as F⁻¹(uniforms_a[i]) and B's as
    G⁻¹(uniforms_b[i]) (deepsig's way of resampling with replacement); `uniforms_a` is (B, n_a) in [0, 1),
    shared by every comparison of the batch."""
    _check_dt(dt)
    sorted_a, sorted_b = _scores(scores_a, "scores_a"), _scores(scores_b, "scores_b")
    n_a, n_b = sorted_a.shape[-1], sorted_b.shape[-1]
    uniforms_a, uniforms_b = np.asarray(uniforms_a, dtype=float), np.asarray(uniforms_b, dtype=float)
    if uniforms_a.ndim != 2 or uniforms_b.shape != (len(uniforms_a), n_b) or uniforms_a.shape[1] != n_a:
        raise ValueError(f"the uniforms must be (resamples, {n_a}) and (resamples, {n_b}), but got "
                         f"{uniforms_a.shape} and {uniforms_b.shape}")
    index_a, index_b, counts = _grid_segments(n_a, n_b, dt)
    # a resample's quantile at t is the (sorted) drawn index at the grid's quantile index, read from the scores
    drawn_a = np.sort(np.clip(np.ceil(n_a * uniforms_a).astype(int) - 1, 0, n_a - 1), axis=1)[:, index_a]
    drawn_b = np.sort(np.clip(np.ceil(n_b * uniforms_b).astype(int) - 1, 0, n_b - 1), axis=1)[:, index_b]
    batch = np.broadcast_shapes(sorted_a.shape[:-1], sorted_b.shape[:-1])
    flat_a = np.broadcast_to(sorted_a, (*batch, n_a)).reshape(-1, n_a)
    flat_b = np.broadcast_to(sorted_b, (*batch, n_b)).reshape(-1, n_b)
    rows = max(1, _CHUNK_ELEMENTS // (len(uniforms_a) * len(counts)))
    found = np.empty((len(flat_a), len(uniforms_a)))
    for start in range(0, len(flat_a), rows):
        chunk = slice(start, start + rows)
        found[chunk] = _ratio(flat_a[chunk][:, drawn_a], flat_b[chunk][:, drawn_b], counts, dt, skip_first_point)
    return found.reshape(*batch, len(uniforms_a))


def upper_bound(ratio, resampled: np.ndarray, n_a: int, n_b: int, confidence_level: float = 0.95,
                num_comparisons: int = 1) -> float | np.ndarray:
    """ε_min: ε̂ − (1/c)·σ̂·Φ⁻¹(1 − confidence), with c = sqrt(n_a·n_b/(n_a + n_b)) and σ̂ the (population) std of
    c·(ε* − ε̂) over the resamples ε* (the last axis), clipped to [0, 1]: deepsig's formula, term by term
    (c cancels). `num_comparisons` > 1 raises the confidence to confidence + (1 − confidence)/m (deepsig's
    Bonferroni)."""
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), but got confidence_level={confidence_level}")
    if num_comparisons < 1:
        raise ValueError(f"num_comparisons must be at least 1, but got num_comparisons={num_comparisons}")
    confidence_level += (1 - confidence_level) / num_comparisons if num_comparisons > 1 else 0.0
    ratio = np.asarray(ratio, dtype=float)
    const = np.sqrt(n_a * n_b / (n_a + n_b))
    sigma_hat = np.std(const * (np.asarray(resampled) - ratio[..., None]), axis=-1)
    found = np.clip(ratio - (1 / const) * sigma_hat * norm.ppf(1 - confidence_level), 0, 1)
    return float(found) if found.ndim == 0 else found


def aso(scores_a, scores_b, confidence_level: float = 0.95, num_bootstrap: int = BOOTSTRAP, seed: int = 0,
        num_comparisons: int = 1, dt: float = DT, skip_first_point: bool = True) -> ASOResult:
    """Almost Stochastic Order of A over B: ε_min, the `confidence_level` upper bound of the violation ratio
    ε_W2(A, B) from `num_bootstrap` resamples, and ε̂ itself. ε_min < `THRESHOLD` (0.2) reads "A is almost
    stochastically larger than B" (greater is better); near 1, B is larger. Scores on the last axis (any number
    each, A and B may differ); leading axes are a batch of comparisons, computed at once: a table of 300 takes
    about a second (benchmarks/aso.py). The same seed gives the same ε_min for the same scores (to rounding),
    whatever else is in the batch."""
    if num_bootstrap < 1:
        raise ValueError(f"num_bootstrap must be at least 1, but got num_bootstrap={num_bootstrap}")
    sorted_a, sorted_b = _scores(scores_a, "scores_a"), _scores(scores_b, "scores_b")
    n_a, n_b = sorted_a.shape[-1], sorted_b.shape[-1]
    rng = np.random.default_rng(seed)
    uniforms_a, uniforms_b = rng.random((num_bootstrap, n_a)), rng.random((num_bootstrap, n_b))
    ratio = violation_ratio(sorted_a, sorted_b, dt, skip_first_point)
    resampled = bootstrap_ratios(sorted_a, sorted_b, uniforms_a, uniforms_b, dt, skip_first_point)
    return ASOResult(upper_bound(ratio, resampled, n_a, n_b, confidence_level, num_comparisons), ratio)
