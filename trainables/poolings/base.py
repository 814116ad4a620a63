"""The extension point for pooling: a `Pooling` is what the registry holds and `validate` reads,
without importing torch; the module it builds is a `PoolingModule`: `Class(dim)`, called on token
states and the attention mask, returning one vector of the same size per sentence (the built-in
ones: `trainables.poolings.modules`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trainables.registry import load_target

if TYPE_CHECKING:  # a declaration imports no torch: reading the registry stays light
    import torch


class PoolingModule(Protocol):
    """What `Pooling.module` builds: a torch module made from the hidden size. Its parameters, if it
    has any, are trained and checkpointed with the encoder."""

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Sentence vectors (batch, dim) from token states (batch, tokens, dim) and the attention mask
        (batch, tokens; 1 on real tokens, 0 on padding, which must not change the result, and on a prompt's
        tokens that `include_prompt: false` leaves out of the pooling, as sentence-transformers does)."""
        ...


@dataclass(frozen=True)
class Pooling:
    """A pooling method as the registry declares it."""

    module: str  # `module:Class`; Class(dim) is a PoolingModule
    # the `pooling_mode` of sentence-transformers' Pooling that computes the same vectors, so that `save:`
    # writes a model sentence-transformers loads; None where it has none (then `save:` is refused)
    sentence_transformers: str | None = None
    description: str = ""
    # whether it fits a causal model's token states (False: `cls`, whose first token sees nothing after it)
    causal: bool = True

    def __post_init__(self) -> None:
        if ":" not in self.module:
            raise ValueError(f"module must be 'module:Class', but got module={self.module!r}")

    def build(self, dim: int) -> torch.nn.Module:
        """The pooling module for token states of size `dim` (imports its module: torch)."""
        return load_target(self.module)(dim)
