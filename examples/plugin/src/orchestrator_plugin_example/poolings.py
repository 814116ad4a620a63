"""Position-weighted mean pooling (Muennighoff, 2022, SGPT): the mean of the real tokens' states,
token i (1-based, counted from the first real token) weighted by i — sentence-transformers'
`Pooling(dim, pooling_mode="weightedmean")` (the old `pooling_mode_weightedmean_tokens=True`),
which tests/test_example_plugin.py compares it with. Accumulates in fp32 for half-precision states,
as sentence-transformers does."""

from __future__ import annotations

import torch
from torch import nn


class WeightedMeanPooling(nn.Module):
    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        accumulate = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
        weights = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=accumulate).view(1, -1, 1)
        weights = weights - mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1)  # left padding: from the first token
        weighted = mask.unsqueeze(-1).to(accumulate) * weights
        summed = (hidden * weighted).sum(dim=1)
        return (summed / weighted.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype)
