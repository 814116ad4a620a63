"""Pair-classification objectives on pairs of sentence vectors (u, v) and a 0/1 label per pair; each
is a `PairLoss` (`trainables.objectives.base`) built from the embedding size; its own parameters (a
classifier head, a logit scale) are trained with the encoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SoftmaxClassifierLoss(nn.Module):
    """SBERT's classification objective: a linear layer on (u, v, |u - v|), cross-entropy."""

    def __init__(self, dim: int, num_labels: int = 2):
        super().__init__()
        self.classifier = nn.Linear(3 * dim, num_labels)

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(torch.cat([u, v, (u - v).abs()], dim=-1))
        return F.cross_entropy(logits.float(), target.long())


class CosineBCELoss(nn.Module):
    """Binary cross-entropy with the raw cosine as the logit (the reference paper's MRPC objective):
    no parameters, so what is learned lives in the encoder alone; the decision threshold is tuned
    on dev by the evaluator."""

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(F.cosine_similarity(u.float(), v.float()), target.float())


class AffineCosineBCELoss(nn.Module):
    """BCE on a learned affine logit of cos(u, v): w * cos + b, starting at a 0.5 decision threshold
    (w=20, b=-10); this project's earlier `cosine_bce`, kept as an explicit option."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(20.0))
        self.bias = nn.Parameter(torch.tensor(-10.0))

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.weight * F.cosine_similarity(u.float(), v.float()) + self.bias
        return F.binary_cross_entropy_with_logits(logits, target.float())


class NLISoftmaxLoss(SoftmaxClassifierLoss):
    """SBERT's NLI objective (Reimers & Gurevych 2019; sentence-transformers' SoftmaxLoss with num_labels=3): the
    classifier on (u, v, |u - v|) over entailment, neutral and contradiction (0, 1, 2), cross-entropy."""

    def __init__(self, dim: int):
        super().__init__(dim, num_labels=3)
