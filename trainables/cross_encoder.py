"""The `cross_encoder` trainable: both sentences in one input to a (truncated) encoder with a
regression head; the score of a pair is the sigmoid of the head's logit.

Trained with BCE on scores in [0, 1] (targets are clipped there: a cosine below 0 is no
probability) or MSE of the sigmoid; scored by Spearman and Pearson (x100) of its predictions.
Each epoch trains, scores dev, reports and checkpoints; test is scored once with the best-dev
weights, as in `finetune`. The distill trainable reuses the model, the trainer and the scorer.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from scipy.stats import pearsonr, spearmanr
from torch import nn
from transformers import get_linear_schedule_with_warmup

from trainables.batching import EVAL_TOKENS_PER_CHUNK, length_chunks, pad
from trainables.checkpoints import PREDICTIONS, load_checkpoint, save_checkpoint
from trainables.contract import Report, TrainingConfig, parse_config
from trainables.data import load_sts_task
from trainables.errors import TrainingDivergedError, one_of
from trainables.finetune import TrainerState, build_optimizer, epoch_batches, write_predictions
from trainables.models import (
    POOLINGS,
    count_parameters,
    last_hidden_state,
    load_encoder,
    load_tokenizer,
    pool,
    truncate_encoder,
)
from trainables.runtime import autocast, prepare, seed_everything

CROSS_LOSSES = ("bce", "mse")


class CrossEncoderConfig(TrainingConfig):
    model: str
    task: str = "stsb"
    language: str | None = None
    layer: int | None = Field(None, ge=0, description="keep the first k layers; null keeps all")
    pooling: str = "cls"
    loss: str = Field("bce", description="bce on the logit, or mse of the sigmoid")
    lr: float = Field(2e-5, gt=0)
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    max_seq_length: int = Field(128, ge=4, description="tokens of the joined pair")
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    group_by_length: bool = True


class CrossEncoder(nn.Module):
    """A (truncated) encoder over the joined pair, pooled, and a linear head to one logit."""

    def __init__(self, name: str, layer: int | None = None, pooling: str = "cls"):
        super().__init__()
        if pooling not in POOLINGS:
            raise one_of("pooling", pooling, POOLINGS)
        self.encoder = load_encoder(name)
        if layer is not None:
            truncate_encoder(self.encoder, layer)
        self.pooling = pooling
        self.head = nn.Linear(self.encoder.config.hidden_size, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = last_hidden_state(self.encoder, input_ids, attention_mask)
        return self.head(pool(hidden, attention_mask, self.pooling)).squeeze(-1)


class PairTokens:
    """Token ids of each distinct (sentence1, sentence2) pair, joined with the tokenizer's
    separators, truncated to the longest-first `max_length`; tokenized once."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self._ids: dict[tuple[str, str], list[int]] = {}

    def lookup(self, first: Sequence[str], second: Sequence[str]) -> list[list[int]]:
        pairs = list(zip(first, second, strict=True))
        new = list(dict.fromkeys(p for p in pairs if p not in self._ids))
        if new:
            encoded = self.tokenizer([a for a, _ in new], [b for _, b in new], truncation="longest_first",
                                     max_length=self.max_length)["input_ids"]
            self._ids.update(zip(new, encoded, strict=True))
        return [self._ids[p] for p in pairs]

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


def predict(model: CrossEncoder, token_lists: list[list[int]], pad_id: int, device, dtype) -> np.ndarray:
    """Sigmoid scores of every pair, in length-sorted chunks, in input order."""
    was_training = model.training
    model.eval()
    scores = np.empty(len(token_lists), dtype=np.float64)
    try:
        with torch.inference_mode(), autocast(device, dtype):
            for chunk in length_chunks([len(t) for t in token_lists], EVAL_TOKENS_PER_CHUNK, max_chunk=256):
                input_ids, mask = pad([token_lists[i] for i in chunk], pad_id, device)
                scores[chunk] = torch.sigmoid(model(input_ids, mask).float()).cpu().numpy()
    finally:
        model.train(was_training)
    return scores


def sts_metrics(split: str, scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    return {f"{split}_spearman": 100 * float(spearmanr(scores, gold).statistic),
            f"{split}_pearson": 100 * float(pearsonr(scores, gold).statistic)}


def cross_loss(name: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    targets = targets.clamp(0.0, 1.0).to(logits.dtype)
    if name == "bce":
        return nn.functional.binary_cross_entropy_with_logits(logits, targets)
    return nn.functional.mse_loss(torch.sigmoid(logits), targets)


def train_cross_epoch(model: CrossEncoder, optimizer, scheduler, token_lists: list[list[int]], targets: torch.Tensor,
                      batches: list[list[int]], loss_name: str, pad_id: int, device, dtype,
                      max_grad_norm: float | None, where: str) -> float:
    """One pass over `batches`; returns the mean loss. A non-finite loss ends the trial."""
    model.train()
    total = 0.0
    for step, batch in enumerate(batches, start=1):
        input_ids, mask = pad([token_lists[i] for i in batch], pad_id, device)
        with autocast(device, dtype):
            logits = model(input_ids, mask).float()
        loss = cross_loss(loss_name, logits, targets[batch].to(device))
        if not torch.isfinite(loss):
            raise TrainingDivergedError(f"cross-encoder loss became {loss.item()} at {where}, step {step}; "
                                        "lower the learning rate")
        loss.backward()
        if max_grad_norm:
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        total += loss.item()
    return total / max(1, len(batches))


def fit_cross_encoder(model: CrossEncoder, tokens: PairTokens, frame: pd.DataFrame, epochs: int, lr: float,
                      batch_size: int, seed: int, loss_name: str, device, dtype, warmup_ratio: float = 0.1,
                      where: str = "cross-encoder") -> list[float]:
    """Train on `frame`'s (sentence1, sentence2, score) for `epochs`; the mean loss per epoch."""
    token_lists = tokens.lookup(list(frame["sentence1"]), list(frame["sentence2"]))
    targets = torch.as_tensor(frame["score"].to_numpy(dtype=np.float32).copy())
    optimizer = build_optimizer(list(model.named_parameters()), lr, 0.01)
    total = math.ceil(len(frame) / batch_size) * epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, round(warmup_ratio * total), total)
    losses = []
    for epoch in range(1, epochs + 1):
        torch.manual_seed(seed * 1_000 + epoch)
        batches = epoch_batches([len(t) for t in token_lists], batch_size, seed * 1_000 + epoch, True)
        losses.append(train_cross_epoch(model, optimizer, scheduler, token_lists, targets, batches, loss_name,
                                        tokens.pad_id, device, dtype, 1.0, f"{where} epoch {epoch}"))
    return losses


def score_split(model: CrossEncoder, tokens: PairTokens, frame: pd.DataFrame, split: str, device,
                dtype) -> tuple[dict[str, float], np.ndarray]:
    scores = predict(model, tokens.lookup(list(frame["sentence1"]), list(frame["sentence2"])), tokens.pad_id,
                     device, dtype)
    return sts_metrics(split, scores, frame["score"].to_numpy(dtype=np.float64)), scores


def run(config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
    """Train a cross-encoder on a labeled STS task; report every epoch; test once at the end."""
    cfg = parse_config(CrossEncoderConfig, config)
    if cfg.loss not in CROSS_LOSSES:
        raise one_of("loss", cfg.loss, CROSS_LOSSES)
    device, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    data = load_sts_task(cfg.task, cfg.language, cfg.data_dir, "the cross-encoder", cfg.max_train_samples,
                         cfg.max_eval_samples)
    seed_everything(cfg.seed)
    model = CrossEncoder(cfg.model, cfg.layer, cfg.pooling).to(device)
    tokens = PairTokens(load_tokenizer(cfg.model), cfg.max_seq_length)
    token_lists = tokens.lookup(list(data.train["sentence1"]), list(data.train["sentence2"]))
    targets = torch.as_tensor(data.train["score"].to_numpy(dtype=np.float32).copy())
    optimizer = build_optimizer(list(model.named_parameters()), cfg.lr, cfg.weight_decay)
    total = math.ceil(len(token_lists) / cfg.batch_size) * cfg.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * total), total)
    state, best = TrainerState(), None
    if checkpoint_dir:
        weights, best_weights, saved = load_checkpoint(checkpoint_dir, optimizer, scheduler)
        model.load_state_dict(weights)
        state, best = TrainerState(**saved), {k: v.clone() for k, v in best_weights.items()}

    params = count_parameters(model)
    metrics: dict = {}
    for epoch in range(state.epoch + 1, cfg.epochs + 1):
        torch.manual_seed(cfg.seed * 1_000 + epoch)
        batches = epoch_batches([len(t) for t in token_lists], cfg.batch_size, cfg.seed * 1_000 + epoch,
                                cfg.group_by_length)
        train_loss = train_cross_epoch(model, optimizer, scheduler, token_lists, targets, batches, cfg.loss,
                                       tokens.pad_id, device, dtype, cfg.max_grad_norm, f"epoch {epoch}")
        state.epoch = epoch
        dev, _ = score_split(model, tokens, data.dev, "dev", device, dtype)
        current = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        if state.best_dev is None or dev["dev_spearman"] > state.best_dev:
            state.best_dev, state.best_epoch, best = dev["dev_spearman"], epoch, current
        metrics = {"epoch": epoch, "train_loss": train_loss, **dev, "best_epoch": state.best_epoch,
                   "best_dev_spearman": state.best_dev, "params": params}
        with tempfile.TemporaryDirectory(prefix="cross-ckpt-") as folder:
            save_checkpoint(folder, current, optimizer, scheduler, asdict(state),
                            best if state.best_epoch != epoch else None)
            if epoch == cfg.epochs and cfg.score_test:
                model.load_state_dict({k: v.to(device) for k, v in best.items()})
                test, scores = score_split(model, tokens, data.test, "test", device, dtype)
                metrics.update({**test, "test_epoch": state.best_epoch})
                write_predictions(Path(folder) / PREDICTIONS, data.test, scores)
            report(metrics, checkpoint_dir=folder)
    return metrics
