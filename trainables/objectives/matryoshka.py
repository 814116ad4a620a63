"""Sentence-transformers' MatryoshkaLoss (`sentence_transformer/losses/matryoshka.py`, 6.2; Kusupati et al.
2022) around any pair loss: the loss of each vector's first d dimensions, unit-normalised as there, for each
d of `dims` (largest first), times its weight, summed. With `per_step` only that many dimensions, drawn anew
at each call (sentence-transformers draws them from Python's global generator; here from one the learner
seeds per step, so that a resumed trial draws the same), take part. Inside `AdaptiveLayerLoss` it is
sentence-transformers' Matryoshka2dLoss (2D Matryoshka: every drawn layer at the drawn dimensions)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F


def shrink(vectors: torch.Tensor, dim: int) -> torch.Tensor:
    """The first `dim` dimensions, unit-normalised (sentence-transformers' `shrink`)."""
    return F.normalize(vectors[..., :dim], p=2, dim=-1)


class MatryoshkaLoss(nn.Module):
    def __init__(self, loss: nn.Module, dims: Sequence[int], weights: Sequence[float] | None = None,
                 per_step: int | None = None):
        super().__init__()
        weights = [1.0] * len(dims) if weights is None else list(weights)
        pairs = sorted(zip(dims, weights, strict=True), key=lambda p: p[0], reverse=True)
        self.loss, self.dims, self.weights, self.per_step = loss, [d for d, _ in pairs], [w for _, w in pairs], per_step
        self.generator = random.Random(0)

    def reseed(self, key: str) -> None:
        """The draws of the calls that follow, from `key` (the learner's seed, epoch and step)."""
        self.generator = random.Random(key)

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        chosen = range(len(self.dims))
        if self.per_step is not None and self.per_step < len(self.dims):
            chosen = sorted(self.generator.sample(list(chosen), self.per_step))
        loss = u.new_zeros(())
        for i in chosen:
            loss = loss + self.weights[i] * self.loss(shrink(u, self.dims[i]), shrink(v, self.dims[i]), target)
        return loss
