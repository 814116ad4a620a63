"""The one training protocol, for every kind that trains.

Seed; then per round (an epoch, `eval_every` steps, a distillation cycle): reseed (so a resumed
trial draws the same dropout and batch order), train, score dev, keep the best-dev weights,
checkpoint, report. After the last round, test is scored once, with the best-dev weights, and
its per-pair predictions are written beside the checkpoint. A NaN or infinite training loss ends
the trial (`TrainingDivergedError`); a dev score that is not a number (constant embeddings give
an undefined correlation) is reported as `degenerate` and never selected, and a trial with no
round scored on dev is not tested at all (`test_degenerate`: no weights were selected, so any
test number would come from arbitrary ones). Selection only ever
looks at dev; `test_every_round: true` is an opt-in diagnostic that scores test after every round
(`<round><n>_test_*`), never used for anything.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trainables.contract import Report
from trainables.errors import TrainingDivergedError
from trainables.models.encoder import save_sentence_transformer
from trainables.runtime import prepare, seed_everything
from trainables.training.bi_encoder import write_predictions
from trainables.training.checkpoints import (
    MODEL_DIR,
    PREDICTIONS,
    DamagedCheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from trainables.training.learner import BuildsLearners, Learner


@dataclass
class LoopState:
    round: int = 0
    best_round: int = 0
    best_dev: float | None = None
    per_round: dict[str, float] = field(default_factory=dict)  # <round><n>_* of every finished round


def seed_round(seed: int, round_: int) -> None:
    """Python, NumPy and torch streams of one round, the same in a resumed and an uninterrupted run."""
    seed_everything(seed * 1_000 + round_)


def weights_of(learner: Learner) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v for name, module in learner.modules().items() for k, v in module.state_dict().items()}


def load_weights(learner: Learner, weights: dict[str, torch.Tensor]) -> None:
    for name, module in learner.modules().items():
        head = f"{name}."
        module.load_state_dict({k[len(head):]: v for k, v in weights.items() if k.startswith(head)})


def snapshot(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


def is_number(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def improves(value: float, best: float | None, greater_is_better: bool) -> bool:
    return best is None or (value > best if greater_is_better else value < best)


def restore(kind: BuildsLearners, cfg, learner: Learner, checkpoint_dir: str, device, dtype
            ) -> tuple[Learner, LoopState, dict | None]:
    """A trial's learner, loop state and best-dev weights from its checkpoint; a checkpoint cut short by a crash
    or a full disk starts the trial again from its first round (same seed, same numbers) instead of failing it."""
    try:
        weights, best_weights, saved = load_checkpoint(checkpoint_dir, learner.optimizers())
        load_weights(learner, weights)
        learner.load_extra(Path(checkpoint_dir))
        state = LoopState(**saved)
        return learner, state, snapshot(best_weights) if state.best_round else None  # no dev score yet: none
    except (DamagedCheckpointError, OSError, ValueError, KeyError, RuntimeError) as exc:
        logging.getLogger("trainables").warning("%s; the trial starts again from its first %s", exc,
                                                kind.round_name)
        seed_everything(cfg.seed)
        return kind.build(cfg, device, dtype), LoopState(), None


def train(kind: BuildsLearners, cfg, report: Report, checkpoint_dir: str | None = None) -> tuple[Learner, dict]:
    """Run one trial of `kind`; returns the learner (holding its best-dev weights) and the last metrics."""
    device, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    seed_everything(cfg.seed)
    learner = kind.build(cfg, device, dtype)
    rounds = kind.num_reports(cfg)
    state, best = LoopState(), None
    if checkpoint_dir:
        learner, state, best = restore(kind, cfg, learner, checkpoint_dir, device, dtype)
    metrics: dict = {}
    for round_ in range(state.round + 1, rounds + 1):
        started = time.perf_counter()
        seed_round(cfg.seed, round_)
        trained = check_round(kind, learner.train_round(round_), round_)
        metrics, best = end_round(kind, cfg, learner, state, best, round_, trained, time.perf_counter() - started,
                                  report)
    if best is not None:
        load_weights(learner, best)
    return learner, metrics


def check_round(kind: BuildsLearners, trained: dict, round_: int) -> dict:
    """A round's training metrics, or TrainingDivergedError when its loss is not a number."""
    if not is_number(trained["train_loss"]):
        raise TrainingDivergedError(f"loss became {trained['train_loss']} in {kind.round_name} {round_}; lower "
                                    "the learning rate or use precision fp32")
    return trained


def end_round(kind: BuildsLearners, cfg, learner: Learner, state: LoopState, best: dict | None, round_: int,
              trained: dict, train_seconds: float, report: Report) -> tuple[dict, dict | None]:
    """After a round's training: score dev, keep the best-dev weights, checkpoint, and after the last round
    score test once with the best-dev weights (and save the model); report. Returns (metrics, best)."""
    name, rounds = kind.round_name, kind.num_reports(cfg)
    dev, _ = learner.evaluate("dev")
    value = dev.get(learner.metric)
    degenerate = not is_number(value)
    state.round = round_
    current = weights_of(learner)
    if not degenerate and improves(value, state.best_dev, learner.greater_is_better):
        state.best_dev, state.best_round, best = value, round_, snapshot(current)
    if cfg.test_every_round:  # diagnostic only: selection above has already happened
        state.per_round.update({f"{name}{round_}_{k}": v for k, v in learner.evaluate("test")[0].items()})
    if kind.round_table:
        state.per_round.update({f"{name}{round_}_{k}": v for k, v in dev.items()})
    metrics = {"epoch": round_, **({name: round_} if name != "epoch" else {}), **trained, **dev,
               "degenerate": int(degenerate), "best_epoch": state.best_round,
               f"best_{learner.metric}": state.best_dev, "train_seconds": train_seconds, **learner.info}
    with tempfile.TemporaryDirectory(prefix="trial-ckpt-") as folder:
        save_checkpoint(folder, current, learner.optimizers(), asdict(state),
                        best if best is not None and state.best_round != round_ else None)
        learner.save_extra(Path(folder))
        if round_ == rounds and best is not None and (cfg.score_test or cfg.export_model):
            load_weights(learner, best)  # what the run is scored on and saves: the best-dev weights
        if round_ == rounds and cfg.score_test:
            metrics.update(score_test(learner, best, state, Path(folder)))
        if round_ == rounds and cfg.export_model:
            encoder, tokenizer, length = learner.sentence_model()
            save_sentence_transformer(encoder, tokenizer, Path(folder) / MODEL_DIR, length,
                                      getattr(cfg, "prompt", ""), learner.postprocess_map())
        report(metrics, checkpoint_dir=folder)
    return metrics, best


def score_test(learner: Learner, best: dict | None, state: LoopState, folder: Path) -> dict:
    """Test, once, with the weights the learner holds: the best-dev ones. Without a round that had
    a dev score there are none to test (`test_degenerate`, `test_epoch` 0, no test metrics)."""
    if best is None:
        logging.getLogger("trainables").warning("none of the %d rounds had a dev score (constant output): "
                                                "test is not scored", state.round)
        return {"test_epoch": 0, "test_degenerate": 1, **state.per_round}
    test, scores = learner.evaluate("test")
    if scores is not None:
        write_predictions(folder / PREDICTIONS, learner.test_frame, scores)
    return {**test, **learner.test_extras(), "test_epoch": state.best_round, **state.per_round,
            **({"test_degenerate": 1} if not all(is_number(v) for v in test.values()) else {})}
