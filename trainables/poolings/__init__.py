"""The registry of poolings (`pooling:` of every kind with a sentence encoder): names -> `Pooling`
declarations (`base.py`), the built-in ones in `builtin.py` with their modules in `modules.py`; an
installed package adds poolings under the entry-point group `ablation_orchestrator.poolings`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainables.poolings.base import Pooling
from trainables.registry import Registry

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
    """The pooling module `name` for token states of size `dim`."""
    return pooling(name, key).build(dim)


__all__ = ["BUILTIN", "POOLINGS", "Pooling", "build_pooling", "pooling"]
