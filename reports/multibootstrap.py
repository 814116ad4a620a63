"""The Multi-Bootstrap (Sellam et al., "The MultiBERTs", ICLR 2022): a cell against its baseline as
procedures, resampling seeds and test pairs jointly. The seed test (†) holds the test pairs fixed and the
pair bootstrap (‡) holds the seeds fixed, so each answers a question about the one it resamples; a claim
that one layer (one training procedure) scores higher than another needs both, which this resamples at
once: per resample, n seeds drawn with replacement (the same seeds for both cells, as seeds pair them)
and the test pairs drawn with replacement (the same pairs for both), the statistic being the difference of
the seed-averaged Spearman. Its p is the resampled differences' two-sided p (`resampled_p`), as the pair
bootstrap's. benchmarks/multibootstrap.py measures its type-I error and power against † and ‡."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from reports.significance import BOOTSTRAP_SAMPLES, _spearman_rows, check_same_pairs, resampled_p


def _centred_ranks(values: np.ndarray) -> np.ndarray:
    """Each row's ranks (ties averaged), centred and scaled to unit length: their dot product is Spearman's."""
    ranks = rankdata(values, axis=1)
    ranks -= ranks.mean(axis=1, keepdims=True)
    return ranks / np.sqrt((ranks * ranks).sum(axis=1, keepdims=True))


def per_seed_differences(cell: np.ndarray, base: np.ndarray, gold: np.ndarray, pair_index: np.ndarray) -> np.ndarray:
    """(B, seeds): Spearman×100 of seed s's cell minus baseline predictions on the test pairs `pair_index[b]`.
    `cell`, `base`: (seeds, pairs) predictions, row s of both from seed s; `pair_index`: (B, pairs)."""
    truth = _centred_ranks(gold[pair_index])
    return np.stack([100 * ((_centred_ranks(cell[s][pair_index]) - _centred_ranks(base[s][pair_index])) * truth)
                     .sum(axis=1) for s in range(cell.shape[0])], axis=1)


def seed_weights(seed_index: np.ndarray, seeds: int) -> np.ndarray:
    """(B, seeds): how often resample b drew each seed, over the seeds drawn."""
    samples, drawn = seed_index.shape
    counts = np.zeros((samples, seeds))
    np.add.at(counts, (np.repeat(np.arange(samples), drawn), seed_index.ravel()), 1.0)
    return counts / drawn


def joint_differences(cell: np.ndarray, base: np.ndarray, gold: np.ndarray, seed_index: np.ndarray,
                      pair_index: np.ndarray) -> np.ndarray:
    """Per resample b: the mean over the seeds `seed_index[b]` (B, seeds drawn) of Spearman×100 of the cell's
    minus the baseline's predictions, both on the test pairs `pair_index[b]`."""
    return (seed_weights(seed_index, cell.shape[0]) * per_seed_differences(cell, base, gold, pair_index)).sum(axis=1)


def multibootstrap(cell: list[pd.DataFrame], base: list[pd.DataFrame], samples: int = BOOTSTRAP_SAMPLES,
                   seed: int = 0) -> tuple[float, float]:
    """(mean difference, two-sided p) of the seed-averaged test Spearman, the i-th prediction file of
    `cell` and of `base` from the same seed; seeds and test pairs resampled jointly. Refuses files that do
    not hold the same pairs in the same order, or seeds that do not pair."""
    if len(cell) != len(base) or not cell:
        raise ValueError(f"the cell and its baseline must have the same seeds, but got {len(cell)} and {len(base)} "
                         "prediction files")
    check_same_pairs(cell + base)
    gold = cell[0]["score"].to_numpy(dtype=float)
    ours = np.stack([p["prediction"].to_numpy(dtype=float) for p in cell])
    theirs = np.stack([p["prediction"].to_numpy(dtype=float) for p in base])
    rng = np.random.default_rng(seed)
    seed_index = rng.integers(0, len(cell), size=(samples, len(cell)))
    pair_index = rng.integers(0, len(gold), size=(samples, len(gold)))
    differences = joint_differences(ours, theirs, gold, seed_index, pair_index)
    everything = np.arange(len(gold))[None]
    observed = float(np.mean([_spearman_rows(ours[s][everything], gold[everything])[0]
                              - _spearman_rows(theirs[s][everything], gold[everything])[0] for s in range(len(cell))]))
    return observed, resampled_p(differences)
