"""Trial-side code: data, models, objectives, evaluators and one module per trainable kind.

`TRAINABLES` maps each kind's YAML name to its `run(config, report, checkpoint_dir=None)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def _lazy(module: str) -> Callable:
    """`trainables.<module>.run`, imported on first call (Ray workers import only their kind)."""

    def run(*args, **kwargs):
        return importlib.import_module(f"trainables.{module}").run(*args, **kwargs)

    run.__name__ = module
    return run


TRAINABLES: dict[str, Callable] = {kind: _lazy(kind) for kind in
                                   ("finetune", "probe", "dapt", "contrastive", "cross_encoder", "distill")}
