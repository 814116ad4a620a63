"""How many seeds would have been enough (the paired t-test's power, checked by simulation) and the
expected best dev score of n tuning trials (Dodge et al. 2019, checked against brute force)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ttest_1samp

from reports.evp import (
    expected_max,
    fewest_to_tell,
    still_rising,
    too_few_to_tell,
    trend_p,
    unequal_budgets,
)
from reports.power import detectable_difference, paired_power, seeds_needed

SIMULATIONS = 20_000


def rejection_rate(n: int, difference: float, sd: float, alpha: float, seed: int = 0) -> float:
    """How often the paired t-test (a one-sample t-test on the differences) rejects at `alpha` when the
    paired differences are N(difference, sd²): what the power figure claims."""
    draws = np.random.default_rng(seed).normal(difference, sd, size=(SIMULATIONS, n))
    return float((ttest_1samp(draws, 0.0, axis=1).pvalue < alpha).mean())


@pytest.mark.parametrize(("n", "sd", "alpha"), [(3, 1.5, 0.05), (5, 0.8, 0.05), (10, 2.0, 0.05), (5, 0.8, 0.05 / 4)])
def test_the_detectable_difference_is_detected_80_percent_of_the_time(n, sd, alpha):
    difference = detectable_difference(n, sd, alpha)
    assert paired_power(n, difference, sd, alpha) == pytest.approx(0.8, abs=1e-9)
    assert rejection_rate(n, difference, sd, alpha) == pytest.approx(0.8, abs=0.03)
    assert rejection_rate(n, difference / 2, sd, alpha) < 0.6  # half of it is missed far more often


@pytest.mark.parametrize(("difference", "sd"), [(0.5, 1.0), (1.0, 0.7)])
def test_the_seeds_needed_are_the_fewest_that_reach_80_percent(difference, sd):
    n = int(seeds_needed(difference, sd, 0.05))
    assert paired_power(n, difference, sd, 0.05) >= 0.8 > paired_power(n - 1, difference, sd, 0.05)
    assert rejection_rate(n, difference, sd, 0.05) >= 0.8 - 0.03
    assert rejection_rate(n - 1, difference, sd, 0.05, seed=1) < 0.8 + 0.03


def test_power_needs_two_seeds_and_a_spread():
    assert math.isnan(detectable_difference(1, 1.0, 0.05)) and math.isnan(detectable_difference(4, 0.0, 0.05))
    assert math.isnan(seeds_needed(0.5, 0.0, 0.05))


def brute_force(values: list[float], n: int, replace: bool) -> float:
    """The mean of the maximum over every ordered n-tuple (with replacement) or every n-subset (without)."""
    draws = itertools.product(values, repeat=n) if replace else itertools.combinations(values, n)
    maxima = [max(d) for d in draws]
    return sum(maxima) / len(maxima)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=6))
def test_the_expected_best_equals_the_brute_force_average_over_every_draw(values):
    for n in range(1, len(values) + 1):
        assert expected_max(values, n, "with_replacement")[0] == pytest.approx(brute_force(values, n, True), abs=1e-9)
        assert expected_max(values, n, "without_replacement")[0] == pytest.approx(brute_force(values, n, False),
                                                                                  abs=1e-9)


def test_the_estimators_at_the_ends_of_the_curve_and_for_a_smaller_is_better_metric():
    scores = [61.0, 70.5, 72.25, 68.0, 40.0]
    assert expected_max(scores, 1)[0] == pytest.approx(np.mean(scores))  # one trial: the mean, either way
    assert expected_max(scores, 1, "without_replacement")[0] == pytest.approx(np.mean(scores))
    assert expected_max(scores, 5, "without_replacement") == (72.25, 0.0)  # every trial: the observed best
    assert expected_max(scores, 5)[0] < 72.25  # with replacement: five draws may miss it
    losses = [0.3, 0.1, 0.2]
    assert expected_max(losses, 2, mode="min")[0] == pytest.approx(
        np.mean([min(a, b) for a, b in itertools.product(losses, repeat=2)]))
    sd = expected_max(scores, 2)[1]  # the sd of the best of two draws, as the reference computes it
    maxima = [max(a, b) for a, b in itertools.product(scores, repeat=2)]
    assert sd == pytest.approx(np.std(maxima))


def kendall_s(order: np.ndarray) -> int:
    """Concordant minus discordant pairs of (trial number, score), by hand."""
    n = len(order)
    return sum(int(np.sign(order[j] - order[i])) for i in range(n) for j in range(i + 1, n))


@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_trend_p_is_the_share_of_trial_orders_that_rise_at_least_as_much(mode):
    """Exchangeable trials: every order of the same scores is equally likely, so the one-sided p is the share
    of the 720 orders of 6 scores whose concordance with the trial number is at least the observed one. Here
    13 of 15 pairs rise (S = 11, tau = 11/15): the orders with at most 2 inversions, 1 + 5 + 14 of 720."""
    scores = np.array([0.3, 1.9, 0.8, 2.5, 2.0, 3.1])
    observed = kendall_s(scores)
    share = float(np.mean([kendall_s(np.array(o)) >= observed for o in itertools.permutations(scores)]))
    assert observed == 11 and share == pytest.approx(20 / 720)
    tau, p = trend_p(scores if mode == "max" else -scores, mode)  # a loss improves as it falls
    assert p == pytest.approx(share) and tau == pytest.approx((11 / 15) * (1 if mode == "max" else -1))


def test_rising_can_fire_at_any_budget_where_an_order_can_reach_the_level():
    """1/n! is the smallest p of n trials: 1/6 at 3 trials, 1/24 < 0.05 at 4."""
    assert fewest_to_tell() == 4 and too_few_to_tell(3) and not too_few_to_tell(4)
    assert fewest_to_tell(0.01) == 5
    assert not still_rising([1.0, 2.0, 3.0])  # the best order of 3: p = 1/6
    assert still_rising([1.0, 2.0, 3.0, 4.0]) and not still_rising([1.0, 2.0, 4.0, 3.0])  # 1/24; 4/24
    assert still_rising([4.0, 3.0, 2.0, 1.0], mode="min")  # a loss that falls trial by trial
    assert not still_rising([5.0] * 8) and not still_rising([5.0])
    # 30 trials: the curve's last step can no longer carry 10 % of its rise (at most 3 %), the order still tells
    rng = np.random.default_rng(3)
    assert still_rising(np.linspace(0, 3, 30) + rng.normal(size=30))
    assert not still_rising(np.linspace(3, 0, 30) + rng.normal(size=30))


def test_rising_fires_at_its_level_for_exchangeable_trials_and_mostly_for_a_rising_search():
    """Independent draws of one distribution (a normal and a skewed one): it fires in at most 5 % of cells
    (plus three standard errors); a mean that rises by 3 noise sd over 20 trials: in over 90 %."""
    rng = np.random.default_rng(11)
    cells = 3_000
    normal = np.mean([still_rising(rng.normal(size=20)) for _ in range(cells)])
    skewed = np.mean([still_rising(rng.exponential(size=20)) for _ in range(cells)])
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / cells)
    assert normal <= bound and skewed <= bound
    assert normal > 0.02  # not a rule that never fires either
    rising = np.mean([still_rising(np.linspace(0, 3, 20) + rng.normal(size=20)) for _ in range(1_000)])
    assert rising > 0.9


def test_the_default_expected_best_is_the_lower_variance_estimator():
    """Dodge et al. 2021's criterion: over repeated searches of 10 trials the expected best of 10 with
    replacement varies less than the unbiased one without (which is the observed best)."""
    rng = np.random.default_rng(5)
    searches = rng.normal(size=(2_000, 10))
    with_replacement = [expected_max(s, 10)[0] for s in searches]
    without = [expected_max(s, 10, "without_replacement")[0] for s in searches]
    assert np.allclose(without, searches.max(axis=1))
    assert np.var(with_replacement) < 0.8 * np.var(without)


def test_unequal_budgets_name_the_arms_of_a_comparison():
    budget = pd.DataFrame({"cell": ["a", "b", "c"], "trials": [4, 4, 3], "trial_epochs": [10.0, 10.5, 8.0]})
    stats = pd.DataFrame({"cell": ["a", "c"], "baseline": ["b", "b"]})
    assert unequal_budgets(budget, stats) == ["c against b: 3 and 4 trials, 8 and 10.5 trial-epochs"]


def test_sigmas_interval_covers_the_true_spread_95_percent_of_the_time():
    """σ's interval from the sd of n normal draws (χ², n − 1 degrees of freedom), checked by simulation; at
    n = 4 its ends are a factor sqrt(9.348 / 0.2158) = 6.58 apart."""
    from reports.power import sigma_interval

    low, high = sigma_interval(1.0, 4)
    assert high / low == pytest.approx(math.sqrt(9.3484 / 0.21580), rel=1e-4)
    draws = np.random.default_rng(2).normal(0, 2.0, size=(SIMULATIONS, 4))
    sds = draws.std(axis=1, ddof=1)
    covered = [a <= 2.0 <= b for a, b in (sigma_interval(s, 4) for s in sds[:5_000])]
    assert np.mean(covered) == pytest.approx(0.95, abs=0.01)
    assert all(math.isnan(v) for v in sigma_interval(1.0, 1) + sigma_interval(0.0, 5))


def test_the_seeds_needed_at_the_high_end_of_sigma_reach_80_percent_there():
    """sd 1 over 4 pairs, a difference of 1 to detect: σ may be 0.57 to 3.73, and the seeds needed run from
    what the low end needs to what the high end does; each end checked by simulated rejections."""
    from reports.power import sigma_interval

    low, high = sigma_interval(1.0, 4)
    needed = [int(seeds_needed(1.0, sigma, 0.05)) for sigma in (low, 1.0, high)]
    assert needed[0] < needed[1] < needed[2]
    assert rejection_rate(needed[2], 1.0, high, 0.05) >= 0.8 - 0.02
    assert rejection_rate(needed[2] - 1, 1.0, high, 0.05, seed=1) < 0.8 + 0.02
    assert rejection_rate(needed[0], 1.0, low, 0.05) >= 0.8 - 0.02
    assert 90 <= needed[2] <= 120  # about (1.96 + 0.84)^2 * 3.73^2 = 109 pairs


def power_stats(ns: list[int], detect: float | None) -> pd.DataFrame:
    """A stats frame as add_power writes it, each comparison with the paired differences' sd 1."""
    from reports.power import detectable_difference, sigma_interval

    rows = []
    for i, n in enumerate(ns):
        row = {"cell": f"c{i}", "baseline": "b", "n_seeds": n, "correction": "holm"}
        low, high = sigma_interval(1.0, n)
        for suffix, sigma in (("", 1.0), ("_low", low), ("_high", high)):
            row[f"detectable_80{suffix}"] = detectable_difference(n, sigma, 0.05)
            row[f"detectable_80_corrected{suffix}"] = detectable_difference(n, sigma, 0.05 / len(ns))
            row[f"seeds_for_detect{suffix}"] = seeds_needed(detect, sigma, 0.05) if detect else math.nan
            row[f"seeds_for_detect_corrected{suffix}"] = (seeds_needed(detect, sigma, 0.05 / len(ns)) if detect
                                                          else math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def test_the_power_footnote_gives_sigmas_interval_and_only_for_tested_comparisons():
    from reports.power import power_note, short_power_note, sigma_interval

    two = power_stats([2, 2], 1.0)  # the table runs no test over 2 seeds: no detectable difference to state
    text = power_note(two, 1.0)
    assert "detects" not in text and text.startswith("detecting 1 points would take ")
    assert power_note(power_stats([2, 2], None), None) is None
    mixed = power_stats([4, 2], None)  # only the comparison over 4 seeds speaks for the test
    low, high = sigma_interval(1.0, 4)
    point = detectable_difference(4, 1.0, 0.05)
    text = power_note(mixed, None)
    assert text.startswith(f"with n = 4 seeds the paired t-test detects with 80 % power differences of {point:.2f} "
                           f"points at each comparison's observed spread of paired differences, {point * low:.2f}–"
                           f"{point * high:.2f} with σ anywhere in its 95 % confidence interval")
    needed = [seeds_needed(1.0, sigma, 0.025) for sigma in (1.0, low, high)]
    assert short_power_note(power_stats([4, 4], 1.0), 1.0) == (
        f"detecting 1 points would take {needed[0]:.0f} seeds ({needed[1]:.0f}–{needed[2]:.0f} over σ's 95 % "
        "interval)")
