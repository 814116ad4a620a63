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
from trainables.runtime import autocast, linear_schedule, optimizer_step
from trainables.training.optimizer import RowAdamW


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


def no_duplicate_batches(rows: list[tuple[str, ...]], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """sentence-transformers' NoDuplicatesBatchSampler (`base/sampler.py`, 6.2): the rows in a random order
    (`torch.randperm` from a generator seeded `seed + epoch`, as there), each batch filled greedily with the next
    rows none of whose sentences it holds already; a row that would repeat one waits, in its place, for a later
    batch. No sentence twice in a batch, so no in-batch negative is a copy of an anchor or a positive; the last
    batches may be smaller (their drop_last=False)."""
    generator = torch.Generator().manual_seed(seed + epoch)
    remaining = torch.randperm(len(rows), generator=generator, dtype=torch.int32).tolist()
    batches = []
    while remaining:
        batch: list[int] = []
        held: set[str] = set()
        waiting: list[int] = []
        for position, row in enumerate(remaining):
            if held.intersection(rows[row]):
                waiting.append(row)
                continue
            batch.append(row)
            if len(batch) == batch_size:
                waiting.extend(remaining[position + 1:])
                break
            held.update(rows[row])
        batches.append(batch)
        remaining = waiting
    return batches


def layer_lr_scales(model: torch.nn.Module, decay: float) -> dict[str, float]:
    """ELECTRA's layer-wise learning-rate decay (google-research/electra, model/optimization.py
    `_get_layer_lrs`) for a SentenceEncoder as cut: each parameter's factor on the lr,
    `decay ** (n + 2 - depth)`, n the blocks the model keeps, by name. Depth 0 is the embeddings and
    whatever else of the encoder feeds the blocks, block i (from 0) is depth i + 1, and what comes
    after the blocks (a pre-LN model's final norm, the unread pooler, the projection) is the head, depth
    n + 2: its factor is 1, as is that of any parameter not named here (the loss module's)."""
    from trainables.errors import UserInputError
    from trainables.models.architectures import architecture_of, final_norm, stack, stack_depth

    encoder = model.encoder
    if architecture_of(encoder).shared_blocks:
        raise UserInputError("layer_lr_decay", decay, f"{encoder.config.model_type} runs one shared block at every "
                                                      "depth, so a layer has no learning rate of its own: use 1.0")
    n = stack_depth(encoder)
    depth = {id(p): 0 for p in encoder.parameters()}
    for i, block in enumerate(stack(encoder)):
        depth.update({id(p): i + 1 for p in block.parameters()})
    after = [final_norm(encoder), *getattr(model, "unread_modules", list)()]
    depth.update({id(p): n + 2 for module in after if module is not None for p in module.parameters()})
    return {name: decay ** (n + 2 - depth.get(id(p), n + 2)) for name, p in model.named_parameters()}


def build_optimizer(params: list[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float,
                    lr_scales: dict[str, float] | None = None) -> torch.optim.AdamW:
    """AdamW without decay on biases and normalization weights; the fused kernel (one pass over
    all parameters) halves the step time of a small truncated model on CPU. RowAdamW: torch's numbers,
    with a word table's untouched rows left to the decay alone (trainables.training.optimizer).
    `lr_scales` (layer_lr_scales) splits both groups by factor, lowest first, each at lr * factor; a
    parameter it does not name takes lr. The schedule then scales every group's lr by the same ratio."""
    if not lr_scales:
        no_decay = [p for _, p in params if p.ndim < 2]
        decay = [p for _, p in params if p.ndim >= 2]
        return RowAdamW([{"params": decay, "weight_decay": weight_decay},
                         {"params": no_decay, "weight_decay": 0.0}], lr=lr, fused=True)
    groups: dict[tuple[float, bool], list[torch.nn.Parameter]] = {}
    for name, p in params:
        groups.setdefault((lr_scales.get(name, 1.0), p.ndim < 2), []).append(p)
    return RowAdamW([{"params": ps, "weight_decay": 0.0 if flat else weight_decay, "lr": lr * scale}
                     for (scale, flat), ps in sorted(groups.items())], lr=lr, fused=True)


def train_step(model, loss_fn, optimizer, scheduler, token_lists: list[list[int]], targets: torch.Tensor,
               pad_id: int, device, dtype, max_grad_norm: float | None, cache: int | None = None,
               packed: bool = False) -> torch.Tensor:
    """One optimizer step on a batch of `len(targets)` pairs: the first `len(targets)` of `token_lists` are
    one side (`u`), the rest the other (`v`: the second sentences, or a pairs loss's positives then its hard
    negatives). `cache`: encode at most this many sentences at once with gradients (`cached_step`). Returns
    the loss; nothing is updated when it is not finite. `packed`: padding-free rows (trainables.models.padding_free)."""
    first = len(targets)
    if cache is not None:
        loss = cached_step(model, loss_fn, token_lists, targets, pad_id, device, dtype, cache, packed)
    else:
        with autocast(device, dtype):
            vectors = _at_least_fp32(encode_tokens(model, token_lists, pad_id, device, packed=packed))
            loss = loss_fn(vectors[:first], vectors[first:], targets.to(device))
        if torch.isfinite(loss):
            loss.backward()
    if not torch.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    optimizer_step(model.parameters(), optimizer, scheduler, max_grad_norm)
    return loss.detach()


def _at_least_fp32(vectors: torch.Tensor) -> torch.Tensor:
    """Vectors for the loss: bf16/fp16 ones in fp32 (the loss's softmax and cosines), fp32 and fp64 as they are."""
    return vectors.to(torch.promote_types(vectors.dtype, torch.float32))


def _rng_state(device) -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if torch.device(device).type == "cuda" else None


def _set_rng_state(state: tuple, device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached_step(model, loss_fn, token_lists: list[list[int]], targets: torch.Tensor, pad_id: int, device, dtype,
                mini_batch: int, packed: bool = False) -> torch.Tensor:
    """GradCache (Gao et al. 2021), as sentence-transformers' Cached* losses compute it: every sentence encoded
    without a graph, `mini_batch` at a time; the loss and its gradient on those vectors; then each mini-batch
    encoded again with the random state it had (the same dropout masks) and its share of the gradient
    back-propagated. The parameters' gradients are the whole batch's, while activations are kept for one
    mini-batch at a time: a batch of in-batch negatives as large as the loss wants, in a mini-batch's memory.
    Leaves the gradients in place (not finite: none) and returns the loss."""
    pieces = [list(range(i, min(i + mini_batch, len(token_lists)))) for i in range(0, len(token_lists), mini_batch)]
    states, encoded = [], []
    with torch.no_grad():
        for piece in pieces:
            states.append(_rng_state(device))
            with autocast(device, dtype):
                encoded.append(_at_least_fp32(encode_tokens(model, [token_lists[i] for i in piece], pad_id, device,
                                                            packed=packed)))
    vectors = torch.cat(encoded).requires_grad_()
    first = len(targets)
    with autocast(device, dtype):
        loss = loss_fn(vectors[:first], vectors[first:], targets.to(device))
    if not torch.isfinite(loss):
        return loss.detach()
    loss.backward()
    after = _rng_state(device)
    for piece, state, grad in zip(pieces, states, vectors.grad.split([len(p) for p in pieces]), strict=True):
        _set_rng_state(state, device)
        with autocast(device, dtype):
            again = _at_least_fp32(encode_tokens(model, [token_lists[i] for i in piece], pad_id, device,
                                                 packed=packed))
        again.backward(grad)
    _set_rng_state(after, device)  # the stream goes on as if each sentence had been encoded once
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
    optimizer = build_optimizer([(n, p) for n, p in model.named_parameters() if p.requires_grad], lr, 0.01)  # LoRA
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
