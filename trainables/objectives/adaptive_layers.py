"""Sentence-transformers' AdaptiveLayerLoss (`sentence_transformer/losses/adaptive_layer.py`, 6.2; the layer half
of 2D Matryoshka, Li et al. 2024, and Starbucks, arXiv 2410.13230) over the vectors `LayerVectors` returns: the
pair loss at the last layer, plus at each drawn earlier layer the same loss / n x `prior_weight` and a KL term,
KL(softmax(last / T) || softmax(layer / T)) over the embedding dimensions of both sides' vectors, batch-mean,
x T x `kl_weight` (the last layer's distribution detached, as there). Layer weighting: uniform (its default,
the 2DMSE and Starbucks papers'); the last layer's weight 1."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class AdaptiveLayerLoss(nn.Module):
    def __init__(self, loss: nn.Module, prior_weight: float = 1.0, kl_weight: float = 1.0,
                 temperature: float = 0.3):
        super().__init__()
        self.loss, self.prior_weight, self.kl_weight, self.temperature = loss, prior_weight, kl_weight, temperature

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """`u`, `v`: (batch, layers, dim), the drawn layers first and the last layer last."""
        loss = self.loss(u[:, -1], v[:, -1], target)
        drawn = u.shape[1] - 1
        if drawn == 0:
            return loss
        both = torch.cat([u, v])  # every sentence of the batch, as sentence-transformers collects them
        if self.temperature > 0:
            last = F.softmax(both[:, -1] / self.temperature, dim=-1).detach()
        for j in range(drawn):
            loss = loss + self.loss(u[:, j], v[:, j], target) / drawn * self.prior_weight
            if self.temperature > 0:
                kl = F.kl_div(F.log_softmax(both[:, j] / self.temperature, dim=-1), last, reduction="batchmean")
                loss = loss + kl * self.temperature * self.kl_weight
        return loss
