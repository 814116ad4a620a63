"""Training objectives on pairs of sentence vectors (u, v) and a target per pair.

STS objectives take a gold score in [0, 1]; pair-classification objectives take a 0/1 label.
Each is a small module built from the embedding size; its own parameters (a classifier head,
a logit scale) are trained with the encoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainables.errors import UserInputError, one_of
from trainables.names import LOSS_TASKS


class CosineMSELoss(nn.Module):
    """MSE between cos(u, v) and the gold score (the reference paper's objective)."""

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

    def __init__(self, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _ranking_loss(F.cosine_similarity(u, v), target, self.scale)


class AnglELoss(nn.Module):
    """AnglE (Li and Li, 2023): the CoSENT ranking on angle differences in complex space, scale 20."""

    def __init__(self, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from sentence_transformers.util import pairwise_angle_sim  # 2.5 s to import: only when AnglE trains

        return _ranking_loss(pairwise_angle_sim(u.float(), v.float()), target, self.scale)


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

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(F.cosine_similarity(u.float(), v.float()), target.float())


class AffineCosineBCELoss(nn.Module):
    """BCE on a learned affine logit of cos(u, v): w * cos + b, starting at a 0.5 decision threshold
    (w=20, b=-10); this project's earlier `cosine_bce`, kept as an explicit option."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(20.0))
        self.bias = nn.Parameter(torch.tensor(-10.0))

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.weight * F.cosine_similarity(u.float(), v.float()) + self.bias
        return F.binary_cross_entropy_with_logits(logits, target.float())


# name -> factory from the embedding size; the task kind each trains is `names.LOSS_TASKS`
LOSSES = {
    "cosine_mse": lambda dim: CosineMSELoss(),
    "cosent": lambda dim: CoSENTLoss(),
    "angle": lambda dim: AnglELoss(),
    "softmax": lambda dim: SoftmaxClassifierLoss(dim),
    "cosine_bce": lambda dim: CosineBCELoss(),
    "cosine_bce_affine": lambda dim: AffineCosineBCELoss(),
}
assert set(LOSSES) == set(LOSS_TASKS), "every objective declares the task kind it trains in names.LOSS_TASKS"


def build_loss(name: str, task_kind: str, dim: int) -> nn.Module:
    """The objective `name` for vectors of size `dim`; it must suit the task's kind."""
    if name not in LOSSES:
        raise one_of("train.loss", name, LOSSES)
    kind = LOSS_TASKS[name]
    if kind != task_kind:
        fitting = ", ".join(n for n, k in LOSS_TASKS.items() if k == task_kind)
        raise UserInputError("train.loss", name,
                             f"it trains {kind} tasks; for a {task_kind} task use one of: {fitting}")
    return LOSSES[name](dim)
