"""The Multi-Bootstrap (joint resampling of seeds and test pairs): its resampled differences against a
brute-force loop over the same draws, and what it says where one lucky seed makes the difference."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from reports.bootstrap import paired_bootstrap
from reports.multibootstrap import joint_differences, multibootstrap


def frames(gold: np.ndarray, predictions: np.ndarray) -> list[pd.DataFrame]:
    return [pd.DataFrame({"pair": np.arange(len(gold)), "score": gold, "prediction": p}) for p in predictions]


def test_the_joint_differences_are_the_seed_averaged_spearman_differences_on_each_draw():
    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, 40)
    cell = gold + rng.normal(0, 1.0, (3, 40))
    base = gold + rng.normal(0, 1.5, (3, 40))
    seed_index = rng.integers(0, 3, (25, 3))
    pair_index = rng.integers(0, 40, (25, 40))
    ours = joint_differences(cell, base, gold, seed_index, pair_index)
    for b in range(25):
        pairs = pair_index[b]
        expected = np.mean([100 * (spearmanr(cell[s][pairs], gold[pairs]).statistic
                                   - spearmanr(base[s][pairs], gold[pairs]).statistic) for s in seed_index[b]])
        assert ours[b] == pytest.approx(expected, abs=1e-9)


def test_one_lucky_seed_is_a_difference_for_the_pair_bootstrap_and_not_for_the_multi_bootstrap():
    """The cell equals its baseline on seeds 1 and 2 and is far better on seed 0. With the seeds fixed, every
    resample of test pairs favours the cell (p = 2/1001); resampling the seeds too, a draw of 3 seeds misses
    seed 0 with probability (2/3)^3 = 0.296 and then differs by exactly 0, so p = 2 * 0.296 (each tail counted
    with the observed sample), whatever the pairs drawn."""
    rng = np.random.default_rng(1)
    gold = rng.uniform(0, 5, 150)
    base = gold + rng.normal(0, 2.0, (3, 150))
    cell = base.copy()
    cell[0] = gold + rng.normal(0, 0.2, 150)
    difference, pair_p = paired_bootstrap(frames(gold, cell), frames(gold, base))
    assert difference > 0 and pair_p == pytest.approx(2 / 1001)
    samples = 4_000
    joint_difference, joint_p = multibootstrap(frames(gold, cell), frames(gold, base), samples=samples)
    assert joint_difference == pytest.approx(difference)
    expected = 2 * (1 + samples * (2 / 3) ** 3) / (1 + samples)
    assert joint_p == pytest.approx(expected, abs=3 * 2 * np.sqrt(0.296 * 0.704 / samples))


def test_the_multi_bootstrap_refuses_seeds_that_do_not_pair():
    gold = np.linspace(0, 5, 10)
    with pytest.raises(ValueError, match=re.escape("the cell and its baseline must have the same seeds, but got 2 "
                                                   "and 3 prediction files")):
        multibootstrap(frames(gold, np.stack([gold] * 2)), frames(gold, np.stack([gold] * 3)))


def test_the_report_gives_each_comparison_its_multi_bootstrap_p_from_the_pair_bootstraps_resamples(tmp_path):
    """stats.csv: `multibootstrap_p` (and Holm's `_adj`) for every comparison with 3 paired seeds and stored
    predictions, the p that `multibootstrap` gives on the same files; none below 3 seeds."""
    from benchmarks.report_columns import synthetic_study
    from reports.build import build_report

    runs = synthetic_study(2, 3, 3, 60, {}, True)
    build_report(runs, tmp_path / "three", ("csv",))
    stats = pd.read_csv(tmp_path / "three" / "stats.csv")
    assert len(stats) == 4 and stats.multibootstrap_p.notna().all()
    assert (stats.multibootstrap_p_adj >= stats.multibootstrap_p).all()
    done = runs.replicates()
    for row in stats.itertuples():
        ids = [[done[(done.cell == cell) & (done.seed == s)].run_id.iloc[0] for s in range(3)]
               for cell in (row.cell, row.baseline)]
        cell, base = ([runs.held[run_id] for run_id in side] for side in ids)
        assert row.multibootstrap_p == pytest.approx(multibootstrap(cell, base)[1], abs=1e-12)
        assert row.bootstrap_p == pytest.approx(paired_bootstrap(cell, base)[1], abs=1e-12)
    build_report(synthetic_study(2, 3, 2, 60, {}, True), tmp_path / "two", ("csv",))
    two = pd.read_csv(tmp_path / "two" / "stats.csv")
    assert two.multibootstrap_p.isna().all() and two.bootstrap_p.notna().all()


def test_the_reproducibility_section_says_where_the_multi_bootstrap_is(tmp_path):
    import json

    from benchmarks.report_columns import synthetic_study
    from reports.build import build_report

    build_report(synthetic_study(2, 3, 3, 60, {}, True), tmp_path, ("markdown",))
    items = {item["key"]: item for item in json.loads((tmp_path / "reproducibility.json").read_text())}
    assert "The Multi-Bootstrap's p (Sellam et al. 2022" in items["tests"]["answer"]
    assert "is in stats.csv for 4 comparisons, not marked." in items["tests"]["answer"]
