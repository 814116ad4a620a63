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

from reports.bootstrap import BOOTSTRAP_SAMPLES, check_same_pairs, resampled_p, spearmans_of


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


def seed_draws(seeds: int, samples: int, seed: int) -> np.ndarray:
    """(samples, seeds): the seeds each resample draws, with replacement, from a stream of its own (the pairs
    come from `seed`'s own stream, the pair bootstrap's, so that each run's resampled Spearmans serve both)."""
    return np.random.default_rng([seed, 1]).integers(0, seeds, size=(samples, seeds))


def joint_from_resampled(cell: list[np.ndarray], base: list[np.ndarray], samples: int, seed: int) -> np.ndarray:
    """The Multi-Bootstrap's resampled differences from each seed's Spearman in each resample of the pairs
    (`cell[s]`, `base[s]`: seed s's, over the pair bootstrap's resamples): per resample, the mean over the
    seeds it draws of the cell's minus the baseline's."""
    weights = seed_weights(seed_draws(len(cell), samples, seed), len(cell))
    return (weights * (np.stack(cell, axis=1) - np.stack(base, axis=1))).sum(axis=1)


def multibootstrap(cell: list[pd.DataFrame], base: list[pd.DataFrame], samples: int = BOOTSTRAP_SAMPLES,
                   seed: int = 0, cache: dict | None = None, keys: list | None = None) -> tuple[float, float]:
    """(mean difference, two-sided p) of the seed-averaged test Spearman, the i-th prediction file of
    `cell` and of `base` from the same seed; seeds and test pairs resampled jointly: the pairs as the pair
    bootstrap draws them (`spearmans_of`), the seeds from `seed_draws`. Refuses files that do not
    hold the same pairs in the same order, or seeds that do not pair. `cache` and `keys`: as
    `paired_bootstrap`'s, whose cache this shares."""
    if len(cell) != len(base) or not cell:
        raise ValueError(f"the cell and its baseline must have the same seeds, but got {len(cell)} and {len(base)} "
                         "prediction files")
    check_same_pairs(cell + base)
    observed, resampled = spearmans_of(cell + base, samples, seed, cache, keys)
    differences = joint_from_resampled(list(resampled[:len(cell)]), list(resampled[len(cell):]), samples, seed)
    return float(np.mean(observed[:len(cell)]) - np.mean(observed[len(cell):])), resampled_p(differences)
