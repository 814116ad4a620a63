"""Multi-layer pooling's module: several layers' token states combined before the pooling (what each
`pooling_layers` value means: trainables/models/pooling_layers.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from trainables.models.pooling_layers import LEARNED, mixed_layers


class LayerMix(nn.Module):
    """Token states of `layers` (each (batch, tokens, dim)) combined into one: their mean, or with
    `learned`, ELMo's scalar mix (a weight per layer through a softmax, and a scale gamma)."""

    def __init__(self, layers: Sequence[int], learned: bool = False):
        super().__init__()
        self.layers = list(layers)
        self.learned = learned
        if learned:
            self.scalars = nn.Parameter(torch.zeros(len(self.layers)))
            self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(states) == 1 and not self.learned:
            return states[0]
        stacked = torch.stack(list(states))
        if not self.learned:
            return stacked.mean(0)
        weights = torch.softmax(self.scalars.float(), dim=0).to(stacked.dtype)
        return self.gamma.to(stacked.dtype) * torch.einsum("l,l...->...", weights, stacked)


def build_mix(spec: str | Sequence[int], k: int) -> LayerMix | None:
    """The mix of `spec` at cut `k`; None for the cut layer alone (`last`, or `[k]`)."""
    layers = mixed_layers(spec, k)
    learned = spec == LEARNED
    if layers == [k] and not learned:
        return None
    return LayerMix(layers, learned)


def mixed(states: dict[int, torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """The equal-weight mix of `layers`' states, from states computed once for several mixes (the probe)."""
    if len(layers) == 1:
        return states[layers[0]]
    return torch.stack([states[j] for j in layers]).mean(0)
