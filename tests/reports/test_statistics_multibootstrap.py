"""The Multi-Bootstrap (joint resampling of seeds and test pairs): its resampled differences against a
brute-force loop over the same draws, and what it says where one lucky seed makes the difference."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from reports.multibootstrap import joint_differences, multibootstrap
from reports.significance import paired_bootstrap


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
