"""The registry of poolings (`pooling:` of every kind with a sentence encoder): names -> `Pooling`
declarations (`base.py`), the built-in ones in `builtin.py` with their modules in `modules.py`; an
installed package adds poolings under the entry-point group `ablation_orchestrator.poolings`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainables.errors import UserInputError
from trainables.poolings.base import Pooling
from trainables.registry import Registry, build_module

if TYPE_CHECKING:
    from torch import nn

BUILTIN = {
    "mean": "trainables.poolings.builtin:MEAN",
    "cls": "trainables.poolings.builtin:CLS",
    "max": "trainables.poolings.builtin:MAX",
    "mean_sqrt_len": "trainables.poolings.builtin:MEAN_SQRT_LEN",
    "last_token": "trainables.poolings.builtin:LAST_TOKEN",
}
POOLINGS = Registry("poolings", "pooling", BUILTIN)
# `pooling: all`: the encoder poolings (what `all` meant in the studies run before last_token, which a decoder
# study names itself)
ALL = tuple(name for name in BUILTIN if name != "last_token")


def pooling(name: str, key: str = "pooling") -> Pooling:
    """The declaration registered as `name` (a plugin's: its declaration module is imported, nothing more)."""
    return POOLINGS.declared(name, key, Pooling, "a Pooling (trainables.poolings.base)")


def build_pooling(name: str, dim: int, key: str = "pooling") -> nn.Module:
    """The pooling module `name` for token states of size `dim`. A plugin's that is no torch module, or that
    returns anything but one vector of size `dim` per sentence, is one line naming it (at the first batch),
    not a shape error deep inside a loss or a cosine that broadcasts silently."""
    declared = pooling(name, key)
    module = build_module(declared.build, dim, key, name, declared.module, "a pooling", "trainables.poolings.base")
    module.register_forward_hook(_one_vector_each(key, name, declared.module, dim))
    return module


def _one_vector_each(key: str, name: str, target: str, dim: int):
    """A forward hook: a pooling returns a floating tensor (batch, dim) for token states (batch, tokens, dim)."""
    import torch

    def check(module, inputs, output) -> None:
        batch = len(inputs[0]) if inputs else None
        if not (isinstance(output, torch.Tensor) and output.is_floating_point()
                and tuple(output.shape) == (batch, dim)):
            shown = (f"a {output.dtype} tensor of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor)
                     else f"a {type(output).__name__}")
            raise UserInputError(key, name, f"its module {target} returned {shown} for {batch} sentences of size "
                                            f"{dim}; a pooling returns one vector of the hidden size per sentence, "
                                            f"shape ({batch}, {dim})")
    return check


__all__ = ["BUILTIN", "POOLINGS", "Pooling", "build_pooling", "pooling"]
