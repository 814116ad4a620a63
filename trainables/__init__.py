"""Trial-side code: data, models, objectives, evaluators and one module per trainable kind.

`TRAINABLES` maps each kind's YAML name to its `run(config, report, checkpoint_dir=None)`.
"""

from __future__ import annotations

from collections.abc import Callable


def _finetune(*args, **kwargs):
    from trainables.finetune import run

    return run(*args, **kwargs)


def _probe(*args, **kwargs):
    from trainables.probe import run

    return run(*args, **kwargs)


def _dapt(*args, **kwargs):
    from trainables.dapt import run

    return run(*args, **kwargs)


def _contrastive(*args, **kwargs):
    from trainables.contrastive import run

    return run(*args, **kwargs)


def _cross_encoder(*args, **kwargs):
    from trainables.cross_encoder import run

    return run(*args, **kwargs)


def _distill(*args, **kwargs):
    from trainables.distill import run

    return run(*args, **kwargs)


TRAINABLES: dict[str, Callable] = {"finetune": _finetune, "probe": _probe, "dapt": _dapt, "contrastive": _contrastive,
                                   "cross_encoder": _cross_encoder, "distill": _distill}
