"""The `contrastive` kind run as the `dapt` stage's SimCSE / miCSE objective (`pretrain: simcse`): the
stage (`trainables.stages.pretrain`) names this function by its path and caches what it saves."""

from __future__ import annotations

import math
import time
from pathlib import Path

from trainables.contract import collect
from trainables.kinds.contrastive import ContrastiveKind
from trainables.training.loop import train


def contrastive_pretrain(cfg, seed: int, pooling: str, folder: Path) -> dict:
    """SimCSE / miCSE on the whole encoder with the trial's pooling, run by the `contrastive` kind
    (the task's dev split picks the best of four evaluation points); saves encoder and tokenizer."""
    kind = ContrastiveKind()
    stage = kind.parse({
        "model": cfg.model, "method": cfg.pretrain, "task": cfg.task, "language": cfg.language,
        "corpus": cfg.pretrain_corpus, "pooling": pooling, "lr": cfg.pretrain_lr, "steps": cfg.pretrain_steps,
        "eval_every": max(1, math.ceil(cfg.pretrain_steps / 4)), "batch_size": cfg.pretrain_batch_size,
        "max_seq_length": cfg.pretrain_max_seq_length, "warmup_ratio": cfg.pretrain_warmup_ratio,
        "score_test": False, "transductive": cfg.transductive, "seed": seed, "precision": cfg.precision,
        "device": cfg.device, "data_dir": cfg.data_dir, "max_eval_samples": cfg.max_eval_samples})
    started, curve = time.perf_counter(), []
    learner, last = train(kind, stage, collect(curve))
    encoder, tokenizer, _ = learner.sentence_model()  # the best-dev weights: train() loaded them
    encoder.encoder.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return {"loss_curve": [m["train_loss"] for m in curve], "corpus_sentences": last["corpus_sentences"],
            "seconds": time.perf_counter() - started, "first_loss": curve[0]["train_loss"],
            "last_loss": curve[-1]["train_loss"], "stage_dev_spearman": last["best_dev_spearman"],
            "stage_best_step": last["best_epoch"] * stage.eval_every}
