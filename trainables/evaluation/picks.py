"""Which layer a label-free diagnostic picks, and how well it orders the layers as the labels do, in numpy and
scipy alone: the probe (trainables.evaluation.diagnostics) and the report (which imports no torch) share it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# +1: the layer with the largest value is picked, -1: the smallest. RankMe: more dimensions used is better;
# anisotropy: vectors spread over the sphere, not in a narrow cone; alignment: a pair's two sides close;
# uniformity: the log of the mean Gaussian potential, lower is more uniform.
DIRECTIONS = {"rankme": +1, "anisotropy": -1, "alignment": -1, "uniformity": -1}


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
