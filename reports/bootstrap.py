"""The paired bootstrap over test pairs: every prediction set of a comparison resampled with the same
pair indices (`_draws`), each resample's Spearman from one sort of the values (`resampled_spearmans`),
and the two-sided p of the resampled differences (`resampled_p`). `reports.significance` (one run per
seed) and `reports.multibootstrap` (seeds drawn too) both stand on it."""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
from scipy.stats import rankdata

BOOTSTRAP_SAMPLES = 1000
THREADS = 2  # the pair bootstrap's prediction sets at once


def check_same_pairs(frames: list[pd.DataFrame]) -> None:
    """Paired resampling needs every prediction file to hold the same test pairs in the same order."""
    first = frames[0]
    for frame in frames[1:]:
        if len(frame) != len(first) or not np.array_equal(frame["pair"].to_numpy(), first["pair"].to_numpy()) \
                or not np.allclose(frame["score"].to_numpy(), first["score"].to_numpy()):
            raise ValueError("the prediction files of the cell and its baseline hold different test pairs "
                             f"({len(first)} and {len(frame)} rows, or another order)")


def _spearman_rows(predictions: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman x100 of each row of (samples, pairs) predictions against the matching gold rows."""
    a, b = rankdata(predictions, axis=1), rankdata(gold, axis=1)
    a -= a.mean(axis=1, keepdims=True)
    b -= b.mean(axis=1, keepdims=True)
    return 100 * (a * b).sum(axis=1) / np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))


@functools.lru_cache(maxsize=4)
def _draws(pairs: int, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The resampled pair indices (samples, pairs) of `seed`, and how often each pair was drawn in each
    resample, pairs first (pairs, samples); the same for every comparison of a report (read-only)."""
    index = np.random.default_rng(seed).integers(0, pairs, size=(samples, pairs))
    counts = np.bincount((index * samples + np.arange(samples)[:, None]).ravel(), minlength=samples * pairs)
    counts = counts.reshape(pairs, samples).astype(float)
    index.flags.writeable = counts.flags.writeable = False
    return index, counts


def _centred_ranks(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair's rank among the values a resample drew (ties averaged, as rankdata ranks them), less the
    mean rank (pairs + 1) / 2, from how often each pair was drawn (`counts`, pairs first): one sort of the
    values and sums over the counts instead of a sort per resample. A pair drawn c times takes its tie
    group's average rank, the draws below the group plus (the group's draws + 1) / 2. Returned in the
    values' sorted order (pairs, samples), with the counts in that order and the order itself."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new_group = np.r_[True, ordered[1:] != ordered[:-1]]
    drawn = counts[order]  # whole rows: pairs first keeps this a copy of contiguous rows
    if new_group.all():  # no ties: each pair its own group
        ranks = np.cumsum(drawn, axis=0)
        ranks -= drawn / 2 - 0.5
    else:
        starts, group = np.flatnonzero(new_group), np.cumsum(new_group) - 1
        grouped = np.add.reduceat(drawn, starts, axis=0)
        ranks = (np.cumsum(grouped, axis=0) - grouped / 2 + 0.5)[group]
    ranks -= (len(values) + 1) / 2
    return ranks, drawn, order


def _resampled_spearman(values: np.ndarray, gold: tuple[np.ndarray, np.ndarray], counts: np.ndarray,
                        buffers: list[np.ndarray]) -> np.ndarray:
    """Spearman x100 of `values` against the gold in each resample: the Pearson correlation of the drawn
    pairs' ranks, each pair weighted by how often it was drawn (the mean rank of a resample is always
    (pairs + 1) / 2), which is `_spearman_rows` of the resampled rows (tests/reports/test_significance.py).
    `gold`: its weighted centred ranks (counts x ranks, pairs first, in their own order) and their sums of
    squares per resample; `buffers`: three arrays of the counts' shape to work in (a fresh 11 MB array costs
    more in page faults than the arithmetic on it)."""
    weighted_gold, gold_squares = gold
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    drawn, ranks, scratch = buffers
    np.take(counts, order, axis=0, out=drawn)
    if np.all(ordered[1:] != ordered[:-1]):  # no ties (predictions seldom have them): in place
        np.cumsum(drawn, axis=0, out=ranks)
        np.subtract(ranks, np.multiply(drawn, 0.5, out=scratch), out=ranks)
        np.add(ranks, 0.5 - (len(values) + 1) / 2, out=ranks)
    else:
        ranks[...] = _centred_ranks(values, counts)[0]
    together = np.einsum("ij,ij->j", np.take(weighted_gold, order, axis=0, out=scratch), ranks)
    squares = np.einsum("ij,ij,ij->j", drawn, ranks, ranks)
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant side: NaN, as _spearman_rows gives
        return 100 * together / np.sqrt(squares * gold_squares)


def resampled_spearmans(predictions: list[np.ndarray], gold: np.ndarray, samples: int = BOOTSTRAP_SAMPLES,
                        seed: int = 0) -> list[np.ndarray]:
    """Each prediction set's Spearman x100 against the gold over the same `samples` resamples of the pairs
    (`seed`'s). Finite values take the rank sums above; any NaN, the resampled rows ranked one by one."""
    index, counts = _draws(len(gold), samples, seed)
    if not (np.all(np.isfinite(gold)) and all(np.all(np.isfinite(p)) for p in predictions)):
        return [_spearman_rows(p[index], gold[index]) for p in predictions]
    if not predictions:
        return []
    gold_side = _gold_side(np.ascontiguousarray(gold, dtype=float).tobytes(), samples, seed)

    def work(part: list[int]) -> list[tuple[int, np.ndarray]]:
        buffers = [np.empty_like(counts) for _ in range(3)]
        return [(i, _resampled_spearman(predictions[i], gold_side, counts, buffers)) for i in part]

    # two threads where there are two cores: numpy's gathers, sums and products here let go of the GIL
    # (1.65x a set on the 2-core machine); each set's numbers are the same either way
    workers = max(1, min(THREADS, len(predictions), os.cpu_count() or 1))
    parts = [list(range(start, len(predictions), workers)) for start in range(workers)]
    if workers == 1:
        found = work(parts[0])
    else:
        with ThreadPoolExecutor(workers) as pool:
            found = [pair for done in pool.map(work, parts) for pair in done]
    return [values for _, values in sorted(found, key=lambda pair: pair[0])]


@functools.lru_cache(maxsize=4)
def _gold_side(gold: bytes, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The gold's weighted centred ranks in every resample (pairs first, in the pairs' own order) and their
    sums of squares (one per report: its runs share their test pairs)."""
    values = np.frombuffer(gold, dtype=float)
    _, counts = _draws(len(values), samples, seed)
    ranks, drawn, order = _centred_ranks(values, counts)
    weighted = np.empty_like(counts)
    weighted[order] = drawn * ranks
    weighted.flags.writeable = False
    return weighted, np.einsum("ij,ij->j", drawn * ranks, ranks)


def paired_bootstrap(cell: list[pd.DataFrame], base: list[pd.DataFrame], samples: int = BOOTSTRAP_SAMPLES,
                     seed: int = 0, cache: dict | None = None, keys: list | None = None) -> tuple[float, float]:
    """(mean difference, two-sided p) of the seed-averaged test Spearman, resampling test pairs
    with replacement; both sides see the same resampled pairs. With `cache` and one key per frame (cell's,
    then base's: their run ids), each frame's Spearman and resampled Spearmans are kept there for the next
    comparison (a baseline is compared with every cell of its row)."""
    check_same_pairs(cell + base)
    observed, resampled = spearmans_of(cell + base, samples, seed, cache, keys)
    differences = np.mean(resampled[:len(cell)], axis=0) - np.mean(resampled[len(cell):], axis=0)
    return float(np.mean(observed[:len(cell)]) - np.mean(observed[len(cell):])), resampled_p(differences)


def spearmans_of(frames: list[pd.DataFrame], samples: int, seed: int, cache: dict | None = None,
                 keys: list | None = None) -> tuple[tuple[float, ...], tuple[np.ndarray, ...]]:
    """Each prediction file's test Spearman x100 and its Spearman in each of the pair bootstrap's resamples
    (`resampled_spearmans`), in the frames' order; with `cache` and one key per frame, kept there by key and
    computed only for keys not there yet."""
    gold = frames[0]["score"].to_numpy(dtype=float)
    if cache is None or keys is None:
        cache, keys = {}, list(range(len(frames)))
    wanted = [i for i, key in enumerate(keys) if key not in cache]
    values = [frames[i]["prediction"].to_numpy(dtype=float) for i in wanted]
    for i, prediction, resampled in zip(wanted, values, resampled_spearmans(values, gold, samples, seed),
                                        strict=True):
        cache[keys[i]] = (float(_spearman_rows(prediction[None], gold[None])[0]), resampled)
    observed, resampled = zip(*(cache[key] for key in keys), strict=True)
    return observed, resampled


def resampled_p(differences: np.ndarray) -> float:
    """Two-sided p of resampled differences against 0: twice the smaller tail, each tail counted with the
    observed sample among the resamples, (1 + count) / (1 + B), so that B resamples never give p = 0 (at
    most 2 / (1 + B) is claimed)."""
    samples = len(differences)
    tails = [(1 + int(np.sum(differences <= 0))) / (1 + samples), (1 + int(np.sum(differences >= 0))) / (1 + samples)]
    return min(1.0, 2 * min(tails))
