"""The seed-level test behind the † marks: pinned against hand computations, and honest about
what a test cannot reach at a table's n after correction."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as t_dist

from reports.aggregate import summarize
from reports.build import build_report
from reports.collect import StudyRuns
from reports.significance import adjust_p, compare_to_baseline, marks, paired_p, reachable, smallest_p

# test Spearman per seed of a MiniLM layer study (the paper-scale means: layer 0 57.97, 3 74.75, 6 85.49),
# with seed-to-seed spread of a few tenths as measured there
OFFSETS = [0.12, -0.31, 0.05, 0.22, -0.08, -0.17, 0.27, -0.02]
MEANS = {0: 57.97, 3: 74.75, 6: 85.49}


def layer_runs(seeds: int, test: str = "t", correction: str = "holm", means=MEANS) -> StudyRuns:
    """A 3-layer table as `collect` returns it: one completed replicate run per layer and seed."""
    rows = []
    for layer, mean in means.items():
        for seed in range(seeds):
            # each layer its own noise pattern: the paired differences vary, as in a real study
            noise = OFFSETS[(seed + layer) % len(OFFSETS)]
            rows.append({"run_id": f"r{layer}-{seed}", "trial_key": f"c{layer}-s{seed}", "cell": f"layer={layer}",
                         "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED",
                         "error": None, "layer": layer, "test_spearman": mean + noise,
                         "best_dev_spearman": mean + 1 + noise, "epoch": 2, "best_epoch": 1})
    return StudyRuns("minilm", pd.DataFrame(rows), ["layer"], "dev_spearman",
                     {"baseline": {"layer": "last"}, "seed_test": test, "correction": correction}, planned_seeds=seeds)


def by_hand_t(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The paired t-test written out: t = mean(d) / (sd(d) / sqrt(n)), two-sided, n - 1 df."""
    d = ours - theirs
    n = len(d)
    t = d.mean() / (math.sqrt(((d - d.mean()) ** 2).sum() / (n - 1)) / math.sqrt(n))
    return 2 * t_dist.sf(abs(t), n - 1)


def values(runs: StudyRuns, layer: int) -> np.ndarray:
    frame = runs.runs[runs.runs.layer == layer].sort_values("seed")
    return frame.test_spearman.to_numpy()


def test_six_seeds_mark_a_25_point_gap_after_holm_with_the_t_test():
    runs = layer_runs(6)
    stats = compare_to_baseline(runs, summarize(runs), [], "layer", "last", "test_spearman").set_index("cell")
    raw = {layer: by_hand_t(values(runs, layer), values(runs, 6)) for layer in (0, 3)}
    assert stats.loc["layer=0", "paired_p"] == pytest.approx(raw[0], rel=1e-9)
    assert stats.loc["layer=3", "paired_p"] == pytest.approx(raw[3], rel=1e-9)
    # Holm over 2 comparisons: the smaller p times 2, the larger times 1 (never below the first)
    low, high = sorted(raw.values())
    holm = {layer: (2 * low if p == low else max(2 * low, high)) for layer, p in raw.items()}
    assert stats.loc["layer=0", "paired_p_adj"] == pytest.approx(holm[0], rel=1e-9)
    assert stats.loc["layer=3", "paired_p_adj"] == pytest.approx(holm[3], rel=1e-9)
    assert holm[0] < 1e-6  # a 27.5-point gap over 6 seeds with sd ~0.3
    assert marks(stats.reset_index()) == {"layer=0": "†", "layer=3": "†"}


def test_wilcoxon_at_six_seeds_cannot_reach_significance_and_the_footnote_says_so(tmp_path):
    runs = layer_runs(6, test="wilcoxon")
    stats = compare_to_baseline(runs, summarize(runs), [], "layer", "last", "test_spearman", seed_test="wilcoxon")
    # every difference has the same sign: the exact signed-rank p is 2 / 2^6, Holm doubles it
    assert list(stats.paired_p) == pytest.approx([2 / 64, 2 / 64])
    assert list(stats.paired_p_adj) == pytest.approx([4 / 64, 4 / 64])
    assert marks(stats) == {}
    build_report(runs, tmp_path, ("markdown",))
    report = (tmp_path / "report.md").read_text()
    assert ("Wilcoxon signed-rank cannot reach p < 0.05 with n = 6 and 2 comparisons (smallest possible corrected "
            "p 0.0625)") in report
    assert "†" not in report.split("**Test Spearman ×100")[1].split("\n\n")[1]  # no mark in the table body
    assert "no † possible with the Wilcoxon test at n = 6" in report.split("Notes in full")[0]  # the short note


def test_the_permutation_test_is_exact_sign_flips():
    ours, theirs = values(layer_runs(6), 0), values(layer_runs(6), 6)
    assert paired_p("permutation", ours, theirs) == pytest.approx(2 / 64)  # only the two all-same-sign flips
    mixed = theirs + np.array([1.0, -0.5, 2.0, 0.3, -0.1, 0.8])
    flips = np.array(np.meshgrid(*[[-1, 1]] * 6)).reshape(6, -1).T  # all 64 sign patterns
    d = mixed - theirs
    extreme = np.abs((flips * d).mean(axis=1)) >= abs(d.mean()) - 1e-12
    assert paired_p("permutation", mixed, theirs) == pytest.approx(extreme.mean())


@pytest.mark.parametrize("test,n,m,expected", [("t", 3, 100, True), ("wilcoxon", 6, 2, False),
                                               ("wilcoxon", 7, 2, True), ("wilcoxon", 9, 12, True),
                                               ("wilcoxon", 8, 12, False), ("permutation", 5, 1, False),
                                               ("t", 2, 1, False)])
def test_what_a_test_can_reach(test, n, m, expected):
    # Wilcoxon at n = 9 with 12 comparisons: 12 * 2/512 = 0.047 < 0.05; at n = 8, 12 * 2/256 = 0.094
    assert reachable(test, n, m, "holm", 0.05) is expected


def test_adding_seeds_never_takes_a_mark_away_with_the_default_test():
    for seeds in (3, 5, 6, 7, 8):
        runs = layer_runs(seeds)
        stats = compare_to_baseline(runs, summarize(runs), [], "layer", "last", "test_spearman")
        assert marks(stats) == {"layer=0": "†", "layer=3": "†"}, seeds


def test_two_seeds_mark_nothing_and_say_why(tmp_path):
    runs = layer_runs(2)
    stats = compare_to_baseline(runs, summarize(runs), [], "layer", "last", "test_spearman")
    assert not math.isnan(stats.t_p.iloc[0])  # computed and kept in stats.csv
    assert stats.paired_p.isna().all() and marks(stats) == {}
    build_report(runs, tmp_path, ("markdown",))
    assert "no † for 2 of 2 cells: fewer than 3 seeds pair with the baseline (n = 2)" in (
        tmp_path / "report.md").read_text()


def test_smallest_p_and_holm_agree_with_their_definitions():
    assert smallest_p("wilcoxon", 6) == pytest.approx(0.03125) and smallest_p("t", 3) == 0.0
    p = pd.Series([0.01, 0.04, math.nan, 0.03])
    assert list(adjust_p(p, "holm").dropna()) == pytest.approx([0.03, 0.06, 0.06])
    assert list(adjust_p(p, "bonferroni").dropna()) == pytest.approx([0.03, 0.12, 0.09])


@settings(max_examples=30, deadline=None)
@given(shift=st.floats(0.01, 30), base=st.lists(st.floats(40, 90), min_size=3, max_size=10))
def test_the_same_gain_on_every_seed_is_p_zero_without_scipys_warning(shift, base):
    """A cell that beats its baseline by the same amount on every seed (to float64's resolution): the paired
    t-test's p is ~0 (t infinite), and scipy's precision-loss warning stays out of the report's terminal."""
    theirs = np.array(base)
    ours = theirs + shift
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = paired_p("t", ours, theirs)
    assert p < 1e-6


@settings(max_examples=60, deadline=None)
@given(pairs=st.integers(2, 60), samples=st.integers(1, 40), seed=st.integers(0, 10), levels=st.integers(1, 8),
       data=st.data())
def test_resampled_spearman_from_draw_counts_is_the_resampled_rows_ranked_one_by_one(pairs, samples, seed, levels,
                                                                                    data):
    """The ‡ bootstrap ranks each prediction set once and weights each pair by how often a resample drew it;
    that is `_spearman_rows` of the resampled rows (scipy's average ranks), ties in the gold and the
    predictions (few `levels`) included, a constant side NaN, to rounding (here: the same numbers)."""
    from reports.bootstrap import _draws, _spearman_rows, resampled_spearmans

    values = st.floats(-3, 3, allow_nan=False, width=32)
    gold = np.round(np.array(data.draw(st.lists(values, min_size=pairs, max_size=pairs))) * levels) / levels
    predictions = [np.round(np.array(data.draw(st.lists(values, min_size=pairs, max_size=pairs))) * levels) / levels
                   for _ in range(2)] + [np.full(pairs, 1.5)]
    index, _ = _draws(pairs, samples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = [_spearman_rows(p[index], gold[index]) for p in predictions]
    found = resampled_spearmans(predictions, gold, samples, seed)
    for want, got in zip(expected, found, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9, equal_nan=True)


def test_resampled_spearman_with_a_missing_prediction_ranks_the_rows_as_before():
    from reports.bootstrap import _draws, _spearman_rows, resampled_spearmans

    gold = np.linspace(0, 5, 30)
    broken = gold.copy()
    broken[3] = np.nan
    index, _ = _draws(30, 20, 0)
    np.testing.assert_array_equal(resampled_spearmans([broken], gold, 20, 0)[0],
                                  _spearman_rows(broken[index], gold[index]))
