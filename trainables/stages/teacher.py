"""The `teacher` stage of `distill`'s `mode: teacher`: a cross-encoder trained on the task's gold
train labels (both orders of each pair), and its scores of the unlabeled pairs (averaged over both
orders). Cached like every stage, keyed with its own seed (per trial seed, or one shared)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from safetensors.torch import load_file, save_file

from trainables.runtime import seed_everything
from trainables.stages import get_or_build
from trainables.stages.fields import stage_seed_of
from trainables.training.cross_encoder import (
    CrossEncoder,
    PairTokens,
    both_orders,
    fit_cross_encoder,
    score_both_orders,
)

TEACHER_WEIGHTS = "models.safetensors"
TEACHER_FIELDS = ("task", "language", "pairs", "max_train_samples", "max_eval_samples", "transductive", "cross_layer",
                  "cross_pooling", "cross_head", "cross_epochs", "cross_lr", "cross_batch_size",
                  "cross_max_seq_length", "cross_loss")


def teacher_params(cfg, cross_name: str) -> dict:
    """Everything that determines the teacher, its seed included: its cache key."""
    return {"cross_model": cross_name, "seed": stage_seed_of(cfg), **{k: getattr(cfg, k) for k in TEACHER_FIELDS}}


def teacher_labels(cfg, cross_name: str, cross: CrossEncoder, cross_tokens: PairTokens, restart: Callable[[], None],
                   train: pd.DataFrame, pairs: pd.DataFrame, device, dtype) -> tuple[np.ndarray, dict]:
    """The teacher's labels of `pairs` and what to report about the stage; its weights go into
    `cross` (`restart` gives `cross` its initial weights before the teacher learns)."""
    seed = stage_seed_of(cfg)

    def build(folder: Path) -> dict:
        seed_everything(seed)
        restart()
        losses = fit_cross_encoder(cross, cross_tokens, both_orders(train), cfg.cross_epochs, cfg.cross_lr,
                                   cfg.cross_batch_size, seed, cfg.cross_loss, device, dtype, where="teacher")
        save_file({k: v.contiguous().cpu() for k, v in cross.state_dict().items()}, folder / TEACHER_WEIGHTS)
        pairs.assign(score=score_both_orders(cross, cross_tokens, pairs, device, dtype)).to_csv(
            folder / "labels.csv", index=False)
        return {"loss_curve": losses, "first_loss": losses[0], "last_loss": losses[-1], "pairs": len(pairs)}

    folder, record, built = get_or_build(cfg.cache_dir, "teacher", teacher_params(cfg, cross_name), build)
    if not built:
        cross.load_state_dict(load_file(folder / TEACHER_WEIGHTS))
    labels = pd.read_csv(folder / "labels.csv", keep_default_na=False)["score"].to_numpy(dtype=np.float64)
    return labels, {"teacher_stage_dir": str(folder), "teacher_cache_key": record["key"],
                    "teacher_cache_hit": int(not built),
                    "teacher_train_loss": record["last_loss"], "stage_seed": seed}
