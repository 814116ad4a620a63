"""The registry of trainable kinds: YAML names -> the class that implements each.

A built-in kind is one module under `trainables/kinds/` and one line in `BUILTIN`; an installed
package adds a kind under the entry-point group `ablation_orchestrator.kinds` (`trainables.registry`).
Kinds are imported on first use (a Ray worker imports only its own); the orchestrator reaches a kind
only through `get_kind`, and a trial carries its kind's registry entry, so workers resolve the same
class.
"""

from __future__ import annotations

from trainables.kinds.base import TrainableKind
from trainables.registry import Registry, load_target

BUILTIN = {
    "finetune": "trainables.kinds.finetune:FinetuneKind",
    "probe": "trainables.kinds.probe:ProbeKind",
    "cross_encoder": "trainables.kinds.cross_encoder:CrossEncoderKind",
    "contrastive": "trainables.kinds.contrastive:ContrastiveKind",
    "distill": "trainables.kinds.distill:DistillKind",
}
KINDS = Registry("kinds", "kind", BUILTIN)

_built: dict[str, TrainableKind] = {}


def load_kind(path: str) -> TrainableKind:
    """The kind at a registry entry (`module:Class`), imported and built once per process."""
    if path not in _built:
        cls = load_target(path)
        if not (isinstance(cls, type) and issubclass(cls, TrainableKind)):
            raise TypeError(f"{path} is not a TrainableKind subclass (trainables.kinds.base)")
        _built[path] = cls()
    return _built[path]


def get_kind(name: str, key: str = "trainable") -> TrainableKind:
    return load_kind(KINDS.entry(name, key).target)


__all__ = ["BUILTIN", "KINDS", "TrainableKind", "get_kind", "load_kind"]
