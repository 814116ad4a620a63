"""Almost Stochastic Order (reports.aso): deepsig's own numbers on fixed inputs, the violation ratio's
properties from its definition, and ε_min's behaviour at the extremes and over random inputs.

The reference numbers were printed by deepsig 1.2.8 (`pip install deepsig==1.2.8` in a virtualenv outside the
project, numpy 2.4.6, scipy 1.17.1; its `deepsig.__version__` still says 1.2.6), on the inputs of REFERENCE:
`deepsig.aso.compute_violation_ratio(np.array(a), np.array(b), dt=dt)` and
`deepsig.aso.aso(a, b, seed=1234, show_progress=False)` (1,000 resamples, confidence 0.95) and
`aso(a, b, seed=7, show_progress=False, num_bootstrap_iterations=200, confidence_level=0.99, num_comparisons=3)`.
The violation ratio has no randomness: it must agree to rounding. ε_min does: deepsig reseeds numpy's legacy
generator with seed + i for resample i, which this test replays (`deepsig_uniforms`) to check ε_min to
rounding too; `aso` itself draws its uniforms from `default_rng(seed)`, so its ε_min is checked against
deepsig's within the spread of the bootstrap, measured here over 40 of its seeds."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.aso import DT, THRESHOLD, ASOResult, aso, bootstrap_ratios, upper_bound, violation_ratio

OVERLAP = ([81.2, 80.1, 81.9, 80.4, 81.5], [80.9, 80.3, 81.0, 80.6, 81.7])
UNEQUAL = ([71.3, 72.8, 70.9, 73.4, 72.1, 71.7, 72.6], [70.2, 72.9, 71.0])
CROSSING = ([1.0, 2.0, 3.0, 4.0, 10.0], [2.5, 2.6, 2.7, 2.8, 2.9])

# name: (a, b, {dt: (ratio(a, b), ratio(b, a))}, eps_min(seed=1234), eps_min(seed=7, 200 resamples, 0.99, m=3))
REFERENCE = {
    "overlap": (*OVERLAP, {0.005: (0.1721132897603426, 0.8257080610021844),
                           0.001: (0.17355371900825856, 0.8260113092649038)}, 0.7883449382103648, 1.0),
    "unequal_n": (*UNEQUAL, {0.005: (0.00646298472385497, 0.9906580493537008),
                             0.001: (0.006727979032107782, 0.9926986801460256)}, 0.5362122526202359,
                  0.7829013937573528),
    "crossing": (*CROSSING, {0.005: (0.04792197373791394, 0.9510224761797531),
                             0.001: (0.047860922926187835, 0.9519318869312745)}, 0.5739845299983923,
                 0.9162780335290379),
}

# scores ×100 to six decimals, as a report carries them: differences of 1e-158 square to subnormal numbers, where
# no sum of squares keeps 12 digits (hypothesis found a=[0.0], b=[6.2e-158] on a plugin-suite run)
scores = st.lists(st.floats(-100, 100, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 6)),
                  min_size=1, max_size=12)
tied_scores = st.lists(st.integers(0, 4).map(float), min_size=1, max_size=12)


def deepsig_uniforms(seed: int, resamples: int, n_a: int, n_b: int) -> tuple[np.ndarray, np.ndarray]:
    """The uniforms deepsig's bootstrap draws with `seed`: resample i reseeds the legacy generator with
    seed + i (i from 1) and draws n_a uniforms for A, then n_b for B."""
    drawn_a, drawn_b = [], []
    for i in range(1, resamples + 1):
        state = np.random.RandomState(seed + i)
        drawn_a.append(state.random_sample(n_a))
        drawn_b.append(state.random_sample(n_b))
    return np.array(drawn_a), np.array(drawn_b)


def grid_sums(a, b, dt: float = DT, skip_first_point: bool = True) -> tuple[float, float]:
    """(violation, W2): ε_W2's two integrals written out point by point from its definition on deepsig's grid
    (no runs, no batch)."""
    t = np.arange(dt, 1, dt)
    sorted_a, sorted_b = np.sort(a), np.sort(b)
    f = np.array([sorted_a[min(max(int(np.ceil(len(a) * p)) - 1, 0), len(a) - 1)] for p in t])
    g = np.array([sorted_b[min(max(int(np.ceil(len(b) * p)) - 1, 0), len(b) - 1)] for p in t])
    violated = np.where(f < g, (g - f) ** 2, 0.0)
    violation = np.sum(violated[1:] * dt) if skip_first_point else np.sum(violated * dt)
    return float(violation), float(np.sum((g - f) ** 2 * dt))


def grid_ratio(a, b, dt: float = DT, skip_first_point: bool = True) -> float:
    violation, distance = grid_sums(a, b, dt, skip_first_point)
    return 0.5 if distance == 0 else violation / distance


@pytest.mark.parametrize("name", sorted(REFERENCE))
@pytest.mark.parametrize("dt", [0.005, 0.001])
def test_the_violation_ratio_is_deepsigs(name, dt):
    a, b, ratios, _, _ = REFERENCE[name]
    assert violation_ratio(a, b, dt) == pytest.approx(ratios[dt][0], rel=1e-12, abs=1e-15)
    assert violation_ratio(b, a, dt) == pytest.approx(ratios[dt][1], rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_eps_min_is_deepsigs_given_deepsigs_resamples(name):
    """The whole chain, bootstrap included, on the uniforms deepsig drew: its printed ε_min to rounding."""
    a, b, _, at_1234, at_7 = REFERENCE[name]
    for seed, resamples, confidence, comparisons, expected in ((1234, 1000, 0.95, 1, at_1234),
                                                               (7, 200, 0.99, 3, at_7)):
        uniforms_a, uniforms_b = deepsig_uniforms(seed, resamples, len(a), len(b))
        resampled = bootstrap_ratios(a, b, uniforms_a, uniforms_b)
        found = upper_bound(violation_ratio(a, b), resampled, len(a), len(b), confidence, comparisons)
        assert found == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_eps_min_agrees_with_deepsigs_within_the_bootstraps_spread(name):
    """`aso` with its own generator: deepsig's ε_min is one draw of the same bootstrap, so it lies within 4 sd
    (the sd of ours over 40 seeds) of our mean over them (about 1 sd here: 0.79 ± 0.008, 0.51 ± 0.014, 0.58 ±
    0.013 against deepsig's 0.79, 0.54, 0.57)."""
    a, b, _, expected, _ = REFERENCE[name]
    ours = np.array([aso(a, b, seed=seed).eps_min for seed in range(40)])
    spread = ours.std(ddof=1)
    assert 0 < spread < 0.05
    assert abs(ours.mean() - expected) <= 4 * spread * np.sqrt(1 + 1 / 40)


def test_a_clearly_dominant_cell_has_eps_min_0_and_a_dominated_one_1():
    """Every score of A above every score of B: every resample is in order too, so ε̂ = σ̂ = 0. The other way
    round ε̂ is 1 over the whole grid; deepsig's leaves the first of its 199 points out of the violation."""
    better, worse = [85.0, 85.4, 84.8, 85.9, 85.2], [80.1, 80.6, 79.9, 80.3, 80.8]
    assert aso(better, worse) == ASOResult(0.0, 0.0)
    assert aso(worse, better, skip_first_point=False) == ASOResult(1.0, 1.0)
    dominated = aso(worse, better)
    assert dominated.violation_ratio == pytest.approx(1 - DT * (84.8 - 79.9) ** 2 / grid_sums(worse, better)[1])
    assert 0.99 < dominated.violation_ratio < dominated.eps_min < 1


def test_eps_min_separates_overlapping_normals_by_their_shift():
    """Two 50-seed samples two sds apart overlap, yet A is almost stochastically larger (ε_min well under τ),
    B not at all; equal distributions fall in between, far from τ."""
    rng = np.random.default_rng(3)
    a, b, c = rng.normal(2, 1, 50), rng.normal(0, 1, 50), rng.normal(0, 1, 50)
    assert aso(a, b).eps_min < 0.05 < THRESHOLD
    assert aso(b, a).eps_min > 0.95
    equal = aso(b, c)
    assert equal.eps_min > max(0.3, equal.violation_ratio)


@settings(max_examples=150, deadline=None)
@given(scores, scores)
def test_the_ratio_is_its_grid_definition_and_its_two_directions_sum_to_one(a, b):
    """ε(A, B) + ε(B, A) = 1 over the whole grid (del Barrio et al.: the violation sets of the two directions
    split the distance), and 1 − dt·(G⁻¹(dt) − F⁻¹(dt))²/W2 where deepsig leaves the first point out of the
    violation (not out of W2); both the point-by-point sums of the definition."""
    assert violation_ratio(a, b) == pytest.approx(grid_ratio(a, b), rel=1e-9, abs=1e-12)
    whole = violation_ratio(a, b, skip_first_point=False)
    assert whole == pytest.approx(grid_ratio(a, b, skip_first_point=False), rel=1e-9, abs=1e-12)
    first = (np.min(b) - np.min(a)) ** 2  # both quantile functions at t = dt are the minimum (n <= 12 < 1/dt)
    distance = grid_sums(a, b)[1]
    if distance > 0:
        assert whole + violation_ratio(b, a, skip_first_point=False) == pytest.approx(1.0, abs=1e-12)
        assert violation_ratio(a, b) + violation_ratio(b, a) == pytest.approx(1 - DT * first / distance, abs=1e-12)
    else:
        assert violation_ratio(a, b) == violation_ratio(b, a) == 0.5


@settings(max_examples=100, deadline=None)
@given(st.one_of(scores, tied_scores), st.one_of(scores, tied_scores), st.integers(0, 2**16),
       st.sampled_from([0.9, 0.95, 0.99]))
def test_eps_min_is_a_number_in_0_1_at_least_the_ratio_and_blind_to_the_scores_order(a, b, seed, confidence):
    found = aso(a, b, confidence, num_bootstrap=200, seed=seed)
    assert 0 <= found.violation_ratio <= found.eps_min <= 1
    permuted = aso(a[::-1], sorted(b, reverse=True), confidence, num_bootstrap=200, seed=seed)
    assert permuted == found


def test_the_ratio_ignores_a_common_shift_and_positive_scale():
    a, b = CROSSING
    moved = violation_ratio(3.5 * np.array(a) - 40, 3.5 * np.array(b) - 40)
    assert moved == pytest.approx(violation_ratio(a, b), rel=1e-12)


def test_a_batch_gives_each_comparison_what_it_gives_alone():
    """A 300-comparison table in one call: each row's ε_min is that row's alone, to rounding (the same
    uniforms for every row), with B broadcast against every row of A."""
    rng = np.random.default_rng(0)
    cells, baseline = rng.normal(0, 1, (3, 100, 5)), rng.normal(0.5, 1, 5)
    batch = aso(cells, baseline, seed=11)
    assert batch.eps_min.shape == batch.violation_ratio.shape == (3, 100)
    for index in [(0, 0), (1, 37), (2, 99)]:
        alone = aso(cells[index], baseline, seed=11)
        assert batch.eps_min[index] == pytest.approx(alone.eps_min, rel=1e-12)
        assert batch.violation_ratio[index] == pytest.approx(alone.violation_ratio, rel=1e-12)
    assert len(np.unique(batch.eps_min)) > 50


def test_more_confidence_or_more_comparisons_raise_eps_min():
    a, b = UNEQUAL
    plain, sure = aso(a, b, 0.95).eps_min, aso(a, b, 0.99).eps_min
    assert 0 < plain < sure < 1
    assert aso(a, b, 0.95, num_comparisons=5).eps_min == pytest.approx(aso(a, b, 0.96).eps_min, rel=1e-12)


def test_identical_cells_have_ratio_one_half():
    assert violation_ratio([80.0, 81.0, 82.0], [82.0, 80.0, 81.0]) == 0.5
    assert violation_ratio([[1.0, 1.0], [2.0, 3.0]], [1.0, 1.0]).tolist() == [0.5, 0.0]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: aso([], [1.0]), "scores_a must hold at least one score (its last axis), but got shape (0,)"),
    (lambda: aso([1.0], 2.0), "scores_b must hold at least one score (its last axis), but got shape ()"),
    (lambda: aso([1.0, float("nan")], [1.0]), "scores_a must be finite, but got [nan]"),
    (lambda: aso([1.0], [2.0], num_bootstrap=0), "num_bootstrap must be at least 1, but got num_bootstrap=0"),
    (lambda: aso([1.0], [2.0], confidence_level=1.0),
     "confidence_level must be in (0, 1), but got confidence_level=1.0"),
    (lambda: aso([1.0], [2.0], num_comparisons=0), "num_comparisons must be at least 1, but got num_comparisons=0"),
    (lambda: violation_ratio([1.0], [2.0], dt=0.0), "dt must be in (0, 1), but got dt=0.0"),
    (lambda: bootstrap_ratios([1.0, 2.0], [3.0], np.zeros((4, 3)), np.zeros((4, 1))),
     "the uniforms must be (resamples, 2) and (resamples, 1), but got (4, 3) and (4, 1)"),
])
def test_bad_arguments_say_the_rule_and_the_value(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
