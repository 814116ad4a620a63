"""The one checkpoint format (safetensors plus JSON, no pickles): weights, the best-dev weights,
every optimizer's moments and schedule, and the loop's and the learner's bookkeeping, so a trial
resumes exactly where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"
BEST_WEIGHTS = "best.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "trainer_state.json"
PREDICTIONS = "test_predictions.csv"  # written with the last checkpoint of a run that scores test
PSEUDO_LABELS = "pseudo_labels.csv"  # distill: every cycle's labels, in every checkpoint
MODEL_DIR = "model"  # the run's model in sentence-transformers format, written when `save:` asks for it
ARTIFACTS = (PREDICTIONS, PSEUDO_LABELS)  # files of a trial's last checkpoint that are logged to MLflow

Optimizers = list[tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]]


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in tensors.items()}


def save_checkpoint(folder: str | Path, weights: dict[str, torch.Tensor], optimizers: Optimizers, state: dict,
                    best_weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write one checkpoint; `best_weights` only when they differ from `weights`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_contiguous(weights), folder / WEIGHTS)
    if best_weights is not None:
        save_file(_contiguous(best_weights), folder / BEST_WEIGHTS)
    flat, groups = {}, []
    for number, (optimizer, scheduler) in enumerate(optimizers):
        saved = optimizer.state_dict()
        flat.update({f"{number}.{index}.{name}": value if torch.is_tensor(value) else torch.tensor(value)
                     for index, slots in saved["state"].items() for name, value in slots.items()})
        groups.append({"param_groups": saved["param_groups"], "scheduler": scheduler.state_dict()})
    save_file(_contiguous(flat), folder / OPTIMIZER)
    (folder / STATE).write_text(json.dumps({"state": state, "optimizers": groups}, indent=1, default=list))
    return folder


class DamagedCheckpointError(ValueError):
    """A checkpoint that cannot be read whole (cut short by a crash or a full disk)."""


def load_checkpoint(folder: str | Path, optimizers: Optimizers) -> tuple[dict, dict, dict]:
    """Restore optimizers and schedulers in place; return (weights, best_weights, state). Every file
    is read before anything is restored, so a damaged one changes nothing (`DamagedCheckpointError`)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / STATE).read_text())
        flat = load_file(folder / OPTIMIZER)
        weights = load_file(folder / WEIGHTS)
        best = load_file(folder / BEST_WEIGHTS) if (folder / BEST_WEIGHTS).exists() else weights
        saved_groups = [meta["optimizers"][number] for number in range(len(optimizers))]
        state = meta["state"]
    except (OSError, ValueError, KeyError, IndexError, TypeError, SafetensorError) as exc:
        raise DamagedCheckpointError(f"{folder}: {type(exc).__name__}: {exc}") from exc
    slots: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for key, value in flat.items():
        number, index, name = key.split(".", 2)
        slots.setdefault(int(number), {}).setdefault(int(index), {})[name] = value
    for number, (optimizer, scheduler) in enumerate(optimizers):
        groups = saved_groups[number]
        optimizer.load_state_dict({"state": slots.get(number, {}), "param_groups": groups["param_groups"]})
        scheduler.load_state_dict(groups["scheduler"])
    return weights, best, state
