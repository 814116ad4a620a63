"""A trainable kind defined only in the test suite: it proves that a kind is one module plus one
registry entry (the tests add `toy` to `trainables.kinds.KINDS`), and it runs in milliseconds.

Its "model" is one number that drifts by a seeded random step per round; dev and test scores are
fixed functions of it, so the loop's protocol (selection on dev, one test, resume) is visible."""

from __future__ import annotations

import math
import os
import time

import torch
from pydantic import Field

from trainables.contract import TrainingConfig
from trainables.kinds.base import Learner, TrainingKind


class ToyConfig(TrainingConfig):
    model: str = "toy"
    task: str = "stsb"
    language: str | None = None
    epochs: int = Field(3, ge=1)
    lr: float = Field(0.5, gt=0)
    sleep_s: float = Field(0.0, ge=0, description="seconds each round takes (a known wall time for the compute tests)")


class ToyLearner(Learner):
    metric = "dev_spearman"

    def __init__(self, cfg: ToyConfig):
        self.cfg, self.weight = cfg, torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.weight.weight)
        self.test_frame, self.info = None, {"params": 1}

    def modules(self):
        return {"model": self.weight}

    def train_round(self, round_: int) -> dict[str, float]:
        time.sleep(self.cfg.sleep_s)
        with torch.no_grad():
            self.weight.weight += self.cfg.lr * torch.randn(1, 1)  # the loop seeded this round's stream
        return {"train_loss": float(self.weight.weight.detach().abs())}

    def evaluate(self, split: str):
        w = float(self.weight.weight.detach())
        value = 100 * math.tanh(w) if split == "dev" else 100 * math.tanh(w) - 1.0
        return {f"{split}_spearman": value}, None


class ToyKind(TrainingKind):
    example = {"epochs": 4}
    Config = ToyConfig

    def build(self, cfg, device, dtype) -> Learner:
        return ToyLearner(cfg)


class FullDiskLearner(ToyLearner):
    def train_round(self, round_: int) -> dict[str, float]:
        full = os.environ.get("TOY_FULL_DISK", "")  # a file that says the disk is full (the driver's env)
        if round_ == 2 and self.cfg.lr >= 1.0 and full and os.path.exists(full):
            raise OSError(28, "No space left on device")
        return super().train_round(round_)


class FullDiskToyKind(ToyKind):
    """The toy whose trials of lr >= 1 fail on their second round with ENOSPC while $TOY_FULL_DISK exists."""

    def build(self, cfg, device, dtype) -> Learner:
        return FullDiskLearner(cfg)


class PackedLearner(ToyLearner):
    """Notes the GPUs Ray gave its trial, then waits until $TOY_PACKING holds one note per trial of
    the study ($TOY_PACKING_TRIALS): it finishes only if all of them ran at the same time."""

    def train_round(self, round_: int) -> dict[str, float]:
        import json
        import time
        from pathlib import Path

        folder, trials = Path(os.environ["TOY_PACKING"]), int(os.environ["TOY_PACKING_TRIALS"])
        if round_ == 1:
            note = {"seed": self.cfg.seed, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "device": self.cfg.device}
            (folder / f"{self.cfg.seed}.json").write_text(json.dumps(note))
            deadline = time.monotonic() + 240
            while len(list(folder.glob("*.json"))) < trials:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(list(folder.glob('*.json')))} of {trials} trials ran together")
                time.sleep(0.2)
        return super().train_round(round_)


class PackedToyKind(ToyKind):
    def build(self, cfg, device, dtype) -> Learner:
        return PackedLearner(cfg)
