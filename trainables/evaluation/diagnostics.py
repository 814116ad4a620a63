"""Label-free layer diagnostics: what a layer's sentence vectors look like, without any gold score.

RankMe (Garrido et al. 2023), anisotropy (mean pairwise cosine), alignment and uniformity (Wang & Isola
2020), all in float64 on the probe's pooled vectors. `DIRECTIONS` says which end each one prefers when it
picks a layer; `pick_and_agreement` gives that layer and the diagnostic's Spearman correlation with the
labelled ranking of layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

RANKME_EPS = 1e-7  # Garrido et al. 2023, eq. 1: p_k = s_k / ||s||_1 + eps
UNIFORMITY_T = 2.0  # Wang & Isola 2020's t
ALIGNMENT_ALPHA = 2.0  # Wang & Isola 2020's alpha
UNIFORMITY_MAX_SENTENCES = 4096  # all pairs of at most this many sentences (a fixed random subset beyond)

# +1: the layer with the largest value is picked, -1: the smallest. RankMe: more dimensions used is better;
# anisotropy: vectors spread over the sphere, not in a narrow cone; alignment: a pair's two sides close;
# uniformity: the log of the mean Gaussian potential, lower is more uniform.
DIRECTIONS = {"rankme": +1, "anisotropy": -1, "alignment": -1, "uniformity": -1}


def as_float64(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def normalized(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero, as torch's `normalize`)."""
    x = as_float64(x)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def rankme(x: np.ndarray | torch.Tensor, eps: float = RANKME_EPS) -> float:
    """Effective rank of the (sentences, dim) matrix as it is (not centred, not normalized): exp of the
    entropy of its singular values divided by their sum, plus eps."""
    s = np.linalg.svd(as_float64(x), compute_uv=False)
    if s.sum() == 0:
        return float("nan")
    p = s / s.sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


def anisotropy(x: np.ndarray | torch.Tensor) -> float:
    """Mean cosine similarity over all ordered pairs of distinct rows, exactly:
    (||sum of unit rows||^2 - sum of their squared norms) / (n (n - 1))."""
    u = normalized(x)
    n = len(u)
    if n < 2:
        return float("nan")
    total = u.sum(axis=0)
    return float((total @ total - (u * u).sum()) / (n * (n - 1)))


def alignment(first: np.ndarray | torch.Tensor, second: np.ndarray | torch.Tensor,
              alpha: float = ALIGNMENT_ALPHA) -> float:
    """Mean ||u - v||^alpha over the given pairs (row i of `first` with row i of `second`), unit vectors."""
    u, v = normalized(first), normalized(second)
    if len(u) == 0:
        return float("nan")
    return float((np.linalg.norm(u - v, axis=1) ** alpha).mean())


def uniformity(x: np.ndarray | torch.Tensor, t: float = UNIFORMITY_T,
               max_sentences: int = UNIFORMITY_MAX_SENTENCES, seed: int = 0) -> float:
    """log of the mean of exp(-t ||u - v||^2) over all pairs of distinct rows (unit vectors); beyond
    `max_sentences` rows, over all pairs of a fixed random subset of that many."""
    u = normalized(x)
    if len(u) > max_sentences:
        u = u[np.sort(np.random.default_rng(seed).choice(len(u), max_sentences, replace=False))]
    n = len(u)
    if n < 2:
        return float("nan")
    total = 0.0
    for start in range(0, n, 1024):  # blocks of rows: the full n x n matrix is never held
        block = u[start:start + 1024]
        squared = np.maximum(2.0 - 2.0 * block @ u.T, 0.0)
        potential = np.exp(-t * squared)
        rows = np.arange(len(block))
        potential[rows, start + rows] = 0.0  # a row with itself is no pair
        total += potential.sum()
    return float(np.log(total / (n * (n - 1))))


def layer_diagnostics(vectors: np.ndarray | torch.Tensor, first: np.ndarray | torch.Tensor,
                      second: np.ndarray | torch.Tensor) -> dict[str, float]:
    """All four for one layer: `vectors` are the split's distinct sentences, `first`/`second` the two
    sides of its pairs, as given (no score is read)."""
    return {"rankme": rankme(vectors), "anisotropy": anisotropy(vectors), "alignment": alignment(first, second),
            "uniformity": uniformity(vectors)}


def pick_and_agreement(layers: Sequence[int], values: Sequence[float],
                       scores: Sequence[float], direction: int) -> tuple[int | None, float]:
    """The layer a diagnostic picks (its preferred end, `direction` +1 max / -1 min; the lowest layer on a
    tie) and the Spearman correlation between `direction * value` and the labelled `scores` over layers
    where both are finite: +1 means the diagnostic orders layers as the labels do. NaN under 3 layers
    or where either side is constant."""
    from scipy.stats import spearmanr

    oriented = direction * np.asarray(values, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(oriented)
    pick = int(layers[int(np.argmax(np.where(finite, oriented, -np.inf)))]) if finite.any() else None
    both = finite & np.isfinite(scores)
    if both.sum() < 3 or np.ptp(oriented[both]) == 0 or np.ptp(scores[both]) == 0:
        return pick, float("nan")
    rho = float(spearmanr(oriented[both], scores[both]).statistic)
    return pick, rho if math.isfinite(rho) else float("nan")
