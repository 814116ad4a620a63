"""The registry of training objectives (`train.loss` of `finetune`): names -> `Objective`
declarations (`base.py`), the built-in ones in `builtin.py` with their modules in `sts.py`,
`classification.py` and `ranking.py`; an installed package adds objectives under the entry-point group
`ablation_orchestrator.objectives`. The unsupervised contrastive objectives (SimCSE, miCSE) are the
`contrastive` kind's own building blocks (`contrastive.py`), not entries of this registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainables.errors import UserInputError
from trainables.objectives.base import Objective
from trainables.registry import Registry, build_module

if TYPE_CHECKING:
    from torch import nn

BUILTIN = {
    "cosine_mse": "trainables.objectives.builtin:COSINE_MSE",
    "cosent": "trainables.objectives.builtin:COSENT",
    "angle": "trainables.objectives.builtin:ANGLE",
    "softmax": "trainables.objectives.builtin:SOFTMAX",
    "cosine_bce": "trainables.objectives.builtin:COSINE_BCE",
    "cosine_bce_affine": "trainables.objectives.builtin:COSINE_BCE_AFFINE",
    "mnrl": "trainables.objectives.builtin:MNRL",
    "mnrl_symmetric": "trainables.objectives.builtin:MNRL_SYMMETRIC",
    "gte": "trainables.objectives.builtin:GTE",
    "cached_mnrl": "trainables.objectives.builtin:CACHED_MNRL",
    "gist": "trainables.objectives.builtin:GIST",
    "softmax_nli": "trainables.objectives.builtin:SOFTMAX_NLI",
}
OBJECTIVES = Registry("objectives", "objective", BUILTIN)


def objective(name: str, key: str = "train.loss") -> Objective:
    """The declaration registered as `name` (a plugin's: its declaration module is imported, nothing more)."""
    return OBJECTIVES.declared(name, key, Objective, "an Objective (trainables.objectives.base)")


def loss_tasks() -> dict[str, str]:
    """Every objective that can be imported -> the task kind it trains (sts, classification or pairs)."""
    out = {}
    for name in OBJECTIVES:
        try:
            out[name] = objective(name).task_kind
        except UserInputError:
            continue  # a broken plugin is named where it is used, not in every listing
    return out


def check_loss(name: str, task_kind: str, task: str, key: str = "train.loss") -> Objective:
    """The objective `name`, which must train tasks of `task_kind`; `task` says what it trains on, as a
    message names it ("task mrpc", "train_data sick_nli")."""
    declared = objective(name, key)
    if declared.task_kind != task_kind:
        if declared.task_kind == "pairs":
            article = "an" if task_kind == "sts" else "a"
            raise UserInputError(key, name, f"it trains on (anchor, positive) pairs with in-batch negatives; {task} is "
                                            f"{article} {task_kind} task: name training pairs as train.train_data "
                                            "(sick_nli, or a data set of type pairs or triplets) and keep the task to "
                                            "select and score on")
        fitting = OBJECTIVES.listing([n for n, k in loss_tasks().items() if k == task_kind], sort=False)
        raise UserInputError(key, name, f"it trains {declared.task_kind} tasks; {task} needs one of: {fitting}")
    return declared


def build_loss(name: str, task_kind: str, dim: int, key: str = "train.loss") -> nn.Module:
    """The objective `name` for vectors of size `dim`; it must suit the task's kind."""
    declared = objective(name, key)
    if declared.task_kind != task_kind:
        fitting = ", ".join(n for n, k in loss_tasks().items() if k == task_kind)
        raise UserInputError(key, name, f"it trains {declared.task_kind} tasks; for a {task_kind} task use one of: "
                                        f"{fitting}")
    module = build_module(declared.build, dim, key, name, declared.loss, "a PairLoss", "trainables.objectives.base")
    module.register_forward_hook(_one_number(key, name, declared.loss))
    return module


def _one_number(key: str, name: str, target: str):
    """A forward hook: what the loss returned must be one finite-typed number (a 0-dim floating tensor),
    or training would back-propagate something else (or fail deep inside autograd)."""
    import torch

    def check(module, inputs, output) -> None:
        if not (isinstance(output, torch.Tensor) and output.dim() == 0 and output.is_floating_point()):
            shown = (f"a {output.dtype} tensor of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor)
                     else f"a {type(output).__name__}")
            raise UserInputError(key, name, f"its module {target} returned {shown} for a batch of {len(inputs[0])} "
                                            "pairs; a PairLoss returns the batch's loss as one number (a 0-dim "
                                            "floating tensor, e.g. its .mean())")
    return check


__all__ = ["BUILTIN", "OBJECTIVES", "Objective", "build_loss", "check_loss", "loss_tasks", "objective"]
