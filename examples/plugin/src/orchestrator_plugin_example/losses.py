"""sentence-transformers' margin-based ContrastiveLoss (Hadsell, Chopra and LeCun, 2006) for pair
classification, on the vectors the orchestrator's bi-encoder gives: a matching pair (label 1) is pulled
together, a non-matching one (label 0) pushed apart until its distance reaches the margin.

    loss = mean over pairs of 1/2 * (y * d^2 + (1 - y) * relu(margin - d)^2),   d = 1 - cos(u, v)

as `ContrastiveLoss(model, SiameseDistanceMetric.COSINE_DISTANCE, margin=0.5, size_average=True)`
computes it from two batches of embeddings (tests/test_example_plugin.py compares them). The one
deviation, on purpose: the distance is computed in fp32 when training runs under bf16 autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ContrastiveLoss(nn.Module):
    def __init__(self, dim: int | None = None, margin: float = 0.5):
        super().__init__()
        if margin <= 0:
            raise ValueError(f"margin must be positive, but got margin={margin}")
        self.margin = margin

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        distances = 1 - F.cosine_similarity(u.float(), v.float())
        labels = target.float()
        losses = 0.5 * (labels * distances.pow(2) + (1 - labels) * F.relu(self.margin - distances).pow(2))
        return losses.mean()
