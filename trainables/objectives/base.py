"""The extension point for training objectives on sentence pairs: an `Objective` is what the registry
holds and `validate` reads (the task it trains, where its module is), without importing torch; the
module it builds is a `PairLoss`: `Class(dim)`, called on two batches of sentence vectors and a
target per pair, returning a scalar loss (`trainables.objectives.sts` and `.classification` hold the
built-in ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trainables.registry import load_target

if TYPE_CHECKING:  # a declaration imports no torch: reading the registry stays light
    import torch

TASKS = {"sts": "sts", "pair_classification": "classification", "pairs": "pairs",
         "nli": "nli"}  # what it trains -> the task kind it reads


class PairLoss(Protocol):
    """What `Objective.loss` builds: a torch module made from the embedding size, with its own
    trainable parameters if any (a classifier head), trained with the encoder."""

    def __call__(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of a batch: `u`, `v` (batch, dim) sentence vectors of the two sides of each pair,
        `target` (batch,) a gold score in [0, 1] (sts) or a 0/1 label (pair_classification). A `pairs`
        objective gets the anchors as `u`, the positives then any hard negatives as `v`
        (batch * (1 + negatives), dim), and as `target` the row of `v` that is each anchor's positive."""
        ...


@dataclass(frozen=True)
class Objective:
    """A training objective as the registry declares it."""

    task: str  # sts (a gold score in [0, 1]), pair_classification (a 0/1 label) or pairs (anchor, positive[, negative])
    loss: str  # `module:Class`; Class(dim) is a PairLoss
    description: str = ""
    gradient_cache: bool = False  # trained through GradCache, `mini_batch_size` sentences encoded at a time
    guided: bool = False  # reads a frozen guide model's vectors of the batch (GISTEmbed: `guide_model`)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, but got task={self.task!r}")
        if ":" not in self.loss:
            raise ValueError(f"loss must be 'module:Class', but got loss={self.loss!r}")

    @property
    def task_kind(self) -> str:
        """The kind of task data it trains on, as `trainables.data` names it: sts, classification or pairs."""
        return TASKS[self.task]

    def build(self, dim: int) -> torch.nn.Module:
        """The loss module for sentence vectors of size `dim` (imports its module: torch)."""
        return load_target(self.loss)(dim)
