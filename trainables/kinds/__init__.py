"""The closed registry of trainable kinds: YAML names -> the class that implements each.

Adding a kind is one module under `trainables/kinds/` and one line here. Kinds are imported on
first use (a Ray worker imports only its own); the orchestrator reaches a kind only through
`get_kind`, and a trial carries its kind's registry entry, so workers resolve the same class.
"""

from __future__ import annotations

import importlib

from trainables.errors import one_of
from trainables.kinds.base import TrainableKind

KINDS: dict[str, str] = {
    "finetune": "trainables.kinds.finetune:FinetuneKind",
    "probe": "trainables.kinds.probe:ProbeKind",
    "cross_encoder": "trainables.kinds.cross_encoder:CrossEncoderKind",
    "contrastive": "trainables.kinds.contrastive:ContrastiveKind",
    "distill": "trainables.kinds.distill:DistillKind",
}

_loaded: dict[str, TrainableKind] = {}


def load_kind(path: str) -> TrainableKind:
    """The kind at a registry entry (`module:Class`), imported and built once per process."""
    if path not in _loaded:
        module, name = path.split(":")
        _loaded[path] = getattr(importlib.import_module(module), name)()
    return _loaded[path]


def get_kind(name: str, key: str = "trainable") -> TrainableKind:
    if name not in KINDS:
        raise one_of(key, name, KINDS)
    return load_kind(KINDS[name])


__all__ = ["KINDS", "TrainableKind", "get_kind", "load_kind"]
