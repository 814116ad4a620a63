"""STS objectives on pairs of sentence vectors (u, v) and a gold score in [0, 1] per pair; each is a
`PairLoss` (`trainables.objectives.base`) built from the embedding size, which they do not need."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CosineMSELoss(nn.Module):
    """MSE between cos(u, v) and the gold score (the reference paper's objective)."""

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(F.cosine_similarity(u, v), target.to(u.dtype))


def _ranking_loss(similarity: torch.Tensor, target: torch.Tensor, scale: float) -> torch.Tensor:
    """CoSENT: log(1 + sum over pairs (i, j) with target_i < target_j of exp(scale * (s_i - s_j)))."""
    differences = (similarity[:, None] - similarity[None, :]) * scale
    wrong_order = target[:, None] < target[None, :]
    differences = differences - (~wrong_order).to(differences.dtype) * 1e12
    return torch.logsumexp(torch.cat([differences.new_zeros(1), differences.flatten()]), dim=0)


class CoSENTLoss(nn.Module):
    """CoSENT (Su, 2022): a ranking loss on cosine similarities, scale 20."""

    def __init__(self, dim: int | None = None, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _ranking_loss(F.cosine_similarity(u, v), target, self.scale)


class AnglELoss(nn.Module):
    """AnglE (Li and Li, 2023): the CoSENT ranking on angle differences in complex space, scale 20."""

    def __init__(self, dim: int | None = None, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from sentence_transformers.util import pairwise_angle_sim  # 2.5 s to import: only when AnglE trains

        return _ranking_loss(pairwise_angle_sim(u.float(), v.float()), target, self.scale)
