"""The built-in pooling modules: sentence vectors from token states (batch, tokens, dim) and the
attention mask (batch, tokens). None has parameters."""

from __future__ import annotations

import torch
from torch import nn


def _weights(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return mask.unsqueeze(-1).to(hidden.dtype)


class MeanPooling(nn.Module):
    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = _weights(hidden, mask)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class MeanSqrtLenPooling(nn.Module):
    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = _weights(hidden, mask)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0).sqrt()


class CLSPooling(nn.Module):
    """The state of each row's first unmasked token: the first token under right padding; with a prompt left
    out of the pooling (include_prompt: false), the first token after it, as sentence-transformers' Pooling."""

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        first = mask.to(torch.int).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]


class MaxPooling(nn.Module):
    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return hidden.masked_fill(_weights(hidden, mask) == 0, torch.finfo(hidden.dtype).min).amax(dim=1)


class LastTokenPooling(nn.Module):
    """The state of each row's last real token (the last 1 of its mask), so right padding (pads after it)
    and left padding (pads before it) give the same vector."""

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
        last = (mask.to(positions.dtype) * positions).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
