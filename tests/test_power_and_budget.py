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

from reports.evp import FEWEST_TO_TELL, curve, expected_max, still_rising, too_few_to_tell, unequal_budgets
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


def test_a_curve_is_still_rising_when_its_last_trial_adds_much_of_its_rise():
    assert still_rising(curve([1.0, 2.0, 3.0]))  # three trials: the third adds a third of the rise
    assert not still_rising(curve(list(np.linspace(0, 1, 12))))
    assert not still_rising(curve([5.0, 5.0, 5.0])) and not still_rising(curve([5.0]))


@pytest.mark.parametrize("estimator", sorted(FEWEST_TO_TELL))
def test_too_few_trials_is_where_the_rising_rule_fires_whatever_the_scores(estimator):
    """Independent draws of one distribution (any continuous one: the rule is scale-free; a normal here):
    one trial short of the threshold the rule says "rising" in over 10 % of the cells (43 % and 13 %), at it in
    under 10 % (5 % and 2.5-3.4 %)."""
    rng = np.random.default_rng(7)

    def fires(n: int) -> float:
        return float(np.mean([still_rising(curve(rng.normal(size=n), estimator)) for _ in range(2_000)]))

    fewest = FEWEST_TO_TELL[estimator]
    assert fires(fewest - 1) > 0.10 > fires(fewest)
    assert too_few_to_tell(fewest - 1, estimator) and not too_few_to_tell(fewest, estimator)


def test_unequal_budgets_name_the_arms_of_a_comparison():
    budget = pd.DataFrame({"cell": ["a", "b", "c"], "trials": [4, 4, 3], "trial_epochs": [10.0, 10.5, 8.0]})
    stats = pd.DataFrame({"cell": ["a", "c"], "baseline": ["b", "b"]})
    assert unequal_budgets(budget, stats) == ["c against b: 3 and 4 trials, 8 and 10.5 trial-epochs"]
