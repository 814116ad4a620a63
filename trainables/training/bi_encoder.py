"""Bi-encoder building blocks: epoch order, the optimizer, one training step on sentence pairs,
and a whole fit on labelled pairs (what `finetune` trains per round and `distill` per cycle)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from trainables.errors import TrainingDivergedError
from trainables.models.batching import TokenCache, encode_tokens
from trainables.objectives.sts import CosineMSELoss
from trainables.training.optimizer import RowAdamW
from trainables.training.runtime import autocast, clip_gradients, linear_schedule


def epoch_batches(lengths: list[int], batch_size: int, seed: int, group_by_length: bool) -> list[list[int]]:
    """Row indices per batch for one epoch; with grouping, rows of similar length share a batch
    (transformers' length-grouped order) and the batches are then shuffled."""
    generator = torch.Generator().manual_seed(seed)
    if group_by_length:
        from transformers.trainer_pt_utils import get_length_grouped_indices  # heavy: when a trial runs

        order = get_length_grouped_indices(lengths, batch_size, generator=generator)
    else:
        order = torch.randperm(len(lengths), generator=generator).tolist()
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    if group_by_length:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def build_optimizer(params: list[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW without decay on biases and normalization weights; the fused kernel (one pass over
    all parameters) halves the step time of a small truncated model on CPU. RowAdamW: torch's numbers,
    with a word table's untouched rows left to the decay alone (trainables.training.optimizer)."""
    no_decay = [p for _, p in params if p.ndim < 2]
    decay = [p for _, p in params if p.ndim >= 2]
    return RowAdamW([{"params": decay, "weight_decay": weight_decay},
                     {"params": no_decay, "weight_decay": 0.0}], lr=lr, fused=True)


def train_step(model, loss_fn, optimizer, scheduler, token_lists: list[list[int]], targets: torch.Tensor,
               pad_id: int, device, dtype, max_grad_norm: float | None) -> torch.Tensor:
    """One optimizer step on a batch whose first half of `token_lists` pairs with its second half.
    Returns the loss; nothing is updated when it is not finite."""
    half = len(token_lists) // 2
    with autocast(device, dtype):
        vectors = encode_tokens(model, token_lists, pad_id, device).float()
        loss = loss_fn(vectors[:half], vectors[half:], targets.to(device))
    if not torch.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    loss.backward()
    if max_grad_norm:
        clip_gradients(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def check_finite(loss: float, where: str, fix: str) -> float:
    """A NaN or infinite loss ends the trial as diverged, naming where it happened."""
    if not math.isfinite(loss):
        raise TrainingDivergedError(f"loss became {loss} at {where}; {fix}")
    return loss


def pair_lengths(tokens: TokenCache, first: list[str], second: list[str]) -> list[int]:
    return [max(len(tokens[a]), len(tokens[b])) for a, b in zip(first, second, strict=True)]


def fit_bi_encoder(model, tokens: TokenCache, frame: pd.DataFrame, epochs: int, lr: float, batch_size: int,
                   seed: int, device, dtype, where: str, warmup_ratio: float = 0.1) -> list[float]:
    """MSE between cosine and the label of each pair for `epochs` with a fresh optimizer
    (Trans-Encoder's bi-encoder step); the mean loss per epoch."""
    first, second = list(frame["sentence1"]), list(frame["sentence2"])
    tokens.add(first + second)
    targets = torch.as_tensor(frame["score"].to_numpy(dtype=np.float32).copy())
    lengths = pair_lengths(tokens, first, second)
    loss_fn = CosineMSELoss()
    optimizer = build_optimizer(list(model.named_parameters()), lr, 0.01)
    total = math.ceil(len(frame) / batch_size) * epochs
    scheduler = linear_schedule(optimizer, round(warmup_ratio * total), total)
    model.train()
    losses = []
    for epoch in range(1, epochs + 1):
        torch.manual_seed(seed * 1_000 + epoch)
        epoch_loss = []
        for step, batch in enumerate(epoch_batches(lengths, batch_size, seed * 1_000 + epoch, True), start=1):
            token_lists = [tokens[first[i]] for i in batch] + [tokens[second[i]] for i in batch]
            loss = train_step(model, loss_fn, optimizer, scheduler, token_lists, targets[batch], tokens.pad_id,
                              device, dtype, 1.0).item()
            epoch_loss.append(check_finite(loss, f"{where}, bi-encoder epoch {epoch}, step {step} (lr={lr})",
                                           "lower the bi-encoder's learning rate"))
        losses.append(float(np.mean(epoch_loss)))
    return losses


def write_predictions(path, frame: pd.DataFrame, scores) -> None:
    """Per-pair test scores beside the gold ones: what paired bootstrap tests resample."""
    target = "score" if "score" in frame else "label"
    frame.assign(prediction=scores)[["prediction", target]].to_csv(path, index_label="pair")
