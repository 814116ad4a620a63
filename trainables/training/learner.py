"""What one trial of a training kind is made of: the `Learner` that `trainables.training.loop` drives.
A kind names its learner's class (`TrainingKind.learner`); the loop builds it through the kind."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import torch


class Learner(ABC):
    """What one trial of a training kind is made of; `trainables.training.loop` drives it.

    `metric` and `greater_is_better` come from the evaluator; `test_frame` holds the test pairs'
    gold column for the per-pair predictions; `info` is reported with every round."""

    metric: str
    greater_is_better: bool = True
    test_frame: pd.DataFrame
    info: dict

    @abstractmethod
    def train_round(self, round_: int) -> dict[str, float]:
        """Train one round (an epoch, `eval_every` steps, a distillation cycle); at least `train_loss`."""

    @abstractmethod
    def evaluate(self, split: str) -> tuple[dict[str, float], np.ndarray | None]:
        """Split-prefixed metrics and the per-pair scores of the primary model."""

    @abstractmethod
    def modules(self) -> dict[str, torch.nn.Module]:
        """The named modules whose weights make a checkpoint and the best-dev snapshot."""

    def optimizers(self) -> list[tuple[torch.optim.Optimizer, Any]]:
        """(optimizer, scheduler) pairs that live across rounds and are checkpointed."""
        return []

    def save_extra(self, folder: Path) -> None:  # noqa: B027 (optional hook)
        """Files beside the weights that a resume needs (e.g. every cycle's pseudo-labels)."""

    def load_extra(self, folder: Path) -> None:  # noqa: B027 (optional hook)
        """Read back what `save_extra` wrote."""

    def sentence_model(self) -> tuple[Any, Any, int]:
        """(SentenceEncoder, tokenizer, evaluation length) of the model the run scores, for
        `save:`; kinds without a sentence encoder (cross-encoders) have none."""
        raise NotImplementedError(f"{type(self).__name__} has no sentence encoder to save")

    def postprocess_map(self) -> Any:
        """The affine map (trainables.evaluation.postprocess.Affine) the run's vectors go through before the
        cosine, fitted for the weights it holds now; None without `postprocess`. `save:` stores it."""
        return None

    def test_extras(self) -> dict[str, float]:
        """More test metrics scored once with the best-dev weights (e.g. the STS suite)."""
        return {}


class OneModelLearner(Learner):
    """A learner that trains one module, `model`, with one optimizer and its schedule."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model}

    def optimizers(self) -> list[tuple[torch.optim.Optimizer, Any]]:
        return [(self.optimizer, self.scheduler)]


class BuildsLearners(Protocol):
    """What the loop asks of a training kind (`trainables.kinds.base.TrainingKind` is one): the kind calls the
    loop and the loop only calls back into it, so it names this shape instead of importing the kinds."""

    round_name: str  # what one report covers: an epoch, a cycle, an evaluation round
    round_table: bool  # the last report also carries every round's dev as <round><n>_*

    def build(self, cfg: Any, device: torch.device, dtype: torch.dtype) -> Learner: ...

    def num_reports(self, cfg: Any) -> int: ...
