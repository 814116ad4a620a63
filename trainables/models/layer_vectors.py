"""Sentence vectors at several layers of one (cut) sentence encoder from one forward pass: what
`adaptive_layers` trains on (each drawn layer's vectors beside the last's) and scores (every layer of the
trained model, one pass over each split's sentences). Layer k's token states are the cut's (`layer_states`:
the family's final norm on a pre-norm stack), pooled and projected by the encoder's own head, so layer j of the
trained model is what a model cut at j and given this head would return."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from trainables.models.architectures import layer_states


class LayerVectors(nn.Module):
    """`encoder`'s sentence vectors at each of `layers`, (batch, len(layers), dim), in that order."""

    def __init__(self, encoder: nn.Module, layers: Sequence[int]):
        super().__init__()
        self.sentence_encoder, self.layers = encoder, list(layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        model = self.sentence_encoder
        states = layer_states(model.encoder, {"input_ids": input_ids, "attention_mask": attention_mask},
                              self.layers)
        vectors = torch.stack([model.pool(h, attention_mask, input_ids) for h in states], dim=1)
        return model.projection(vectors) if model.projection is not None else vectors

