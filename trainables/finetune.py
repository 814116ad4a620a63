"""The `finetune` trainable: a bi-encoder truncated to its first k layers, trained on a pair task.

Each epoch: train (length-grouped batches, padding per length-sorted chunk), score dev, report,
checkpoint. The best-dev epoch's weights are kept; test is scored once, at the end, with them.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from pydantic import Field
from transformers import get_linear_schedule_with_warmup
from transformers.trainer_pt_utils import get_length_grouped_indices

from trainables.batching import TokenCache, encode_tokens
from trainables.checkpoints import PREDICTIONS, load_checkpoint, save_checkpoint
from trainables.contract import Report, TrainingConfig, parse_config
from trainables.data import TaskData, load_task
from trainables.errors import TrainingDivergedError, UserInputError
from trainables.evaluation import Embedder, PairEvaluator, make_evaluator
from trainables.models import SentenceEncoder, build_sentence_encoder, count_parameters, load_tokenizer
from trainables.objectives import build_loss
from trainables.runtime import autocast, prepare, seed_everything


class FinetuneConfig(TrainingConfig):
    model: str
    task: str = "stsb"
    language: str | None = None
    layer: int | None = Field(None, ge=0, description="keep the first k layers; null keeps all")
    pooling: str = "mean"
    projection_dim: int | None = Field(None, ge=1)
    random_init: bool = False
    loss: str = "cosine_mse"
    lr: float = Field(2e-5, gt=0)
    epochs: int = Field(4, ge=1)
    batch_size: int = Field(32, ge=2)
    max_seq_length: int = Field(128, ge=2)
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    group_by_length: bool = True


@dataclass
class TrainerState:
    epoch: int = 0
    step: int = 0
    best_epoch: int = 0
    best_dev: float | None = None


def primary_metric(task_kind: str) -> tuple[str, str]:
    """The metric and mode that select epochs, trials and layers for a task kind."""
    return ("dev_spearman", "max") if task_kind == "sts" else ("dev_accuracy", "max")


def epoch_batches(lengths: list[int], batch_size: int, seed: int, group_by_length: bool) -> list[list[int]]:
    """Row indices per batch for one epoch; with grouping, rows of similar length share a batch
    (transformers' length-grouped order) and the batches are then shuffled."""
    generator = torch.Generator().manual_seed(seed)
    if group_by_length:
        order = get_length_grouped_indices(lengths, batch_size, generator=generator)
    else:
        order = torch.randperm(len(lengths), generator=generator).tolist()
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    if group_by_length:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def _weights(model: SentenceEncoder, loss_fn: torch.nn.Module) -> dict[str, torch.Tensor]:
    weights = {f"model.{k}": v for k, v in model.state_dict().items()}
    weights.update({f"loss.{k}": v for k, v in loss_fn.state_dict().items()})
    return weights


def _load_weights(model: SentenceEncoder, loss_fn: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    model.load_state_dict({k[6:]: v for k, v in weights.items() if k.startswith("model.")})
    loss_fn.load_state_dict({k[5:]: v for k, v in weights.items() if k.startswith("loss.")})


def _snapshot(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


def build_optimizer(params: list[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW without decay on biases and normalization weights; the fused kernel (one pass over
    all parameters) halves the step time of a small truncated model on CPU."""
    no_decay = [p for n, p in params if p.ndim < 2]
    decay = [p for n, p in params if p.ndim >= 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
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
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train_epoch(model, loss_fn, optimizer, scheduler, data: TaskData, tokens: TokenCache,
                batches: list[list[int]], cfg: FinetuneConfig, device, dtype, state: TrainerState) -> float:
    """One pass over `batches`; returns the mean loss. A non-finite loss ends the trial."""
    first, second = list(data.train["sentence1"]), list(data.train["sentence2"])
    targets = torch.as_tensor(data.train["score" if data.kind == "sts" else "label"].to_numpy().copy())
    model.train()
    total = 0.0
    for batch in batches:
        token_lists = [tokens[first[i]] for i in batch] + [tokens[second[i]] for i in batch]
        loss = train_step(model, loss_fn, optimizer, scheduler, token_lists, targets[batch], tokens.pad_id,
                          device, dtype, cfg.max_grad_norm).item()
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"loss became {loss} at epoch {state.epoch + 1}, step {state.step + 1} "
                f"(lr={cfg.lr}); lower the learning rate or use precision fp32")
        state.step += 1
        total += loss
    return total / max(1, len(batches))


def write_predictions(path: Path, frame, scores) -> None:
    """Per-pair test scores beside the gold ones: what paired bootstrap tests resample."""
    target = "score" if "score" in frame else "label"
    frame.assign(prediction=scores)[["prediction", target]].to_csv(path, index_label="pair")


def run(config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
    """Train and evaluate one configuration; returns the final metrics (also the last report)."""
    cfg = parse_config(FinetuneConfig, config)
    device, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    data = load_task(cfg.task, cfg.language, cfg.data_dir, cfg.max_train_samples, cfg.max_eval_samples)
    if data.kind == "unlabeled":
        raise UserInputError("task", cfg.task, "finetune needs a labeled pair task (stsb, sick, mrpc, ...)")

    seed_everything(cfg.seed)
    model = build_sentence_encoder(cfg.model, cfg.layer, cfg.pooling, cfg.projection_dim,
                                   cfg.random_init, cfg.seed).to(device)
    loss_fn = build_loss(cfg.loss, data.kind, model.projection[0].out_features if model.projection
                         else model.encoder.config.hidden_size).to(device)
    tokens = TokenCache(load_tokenizer(cfg.model), cfg.max_seq_length)
    tokens.add(list(data.train["sentence1"]) + list(data.train["sentence2"]))
    evaluator: PairEvaluator = make_evaluator(data.kind, {"dev": data.dev, "test": data.test})
    embed = Embedder(model, tokens, device, dtype)
    metric, _ = primary_metric(data.kind)

    lengths = [max(len(tokens[a]), len(tokens[b]))
               for a, b in zip(data.train["sentence1"], data.train["sentence2"], strict=True)]
    steps_per_epoch = math.ceil(len(lengths) / cfg.batch_size)
    named = list(model.named_parameters()) + list(loss_fn.named_parameters())
    optimizer = build_optimizer(named, cfg.lr, cfg.weight_decay)
    total_steps = steps_per_epoch * cfg.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * total_steps), total_steps)

    state, best = TrainerState(), None
    if checkpoint_dir:
        weights, best_weights, saved = load_checkpoint(checkpoint_dir, optimizer, scheduler)
        _load_weights(model, loss_fn, weights)
        state, best = TrainerState(**saved), _snapshot(best_weights)

    params = count_parameters(model)
    metrics: dict = {}
    for epoch in range(state.epoch + 1, cfg.epochs + 1):
        started = time.perf_counter()
        torch.manual_seed(cfg.seed * 1_000 + epoch)  # dropout stream per epoch: resumes reproduce it
        batches = epoch_batches(lengths, cfg.batch_size, cfg.seed * 1_000 + epoch, cfg.group_by_length)
        train_loss = train_epoch(model, loss_fn, optimizer, scheduler, data, tokens, batches, cfg, device, dtype, state)
        state.epoch = epoch
        train_seconds = time.perf_counter() - started
        dev = evaluator.evaluate(embed, "dev")
        current = _weights(model, loss_fn)
        if state.best_dev is None or dev[metric] > state.best_dev:
            state.best_dev, state.best_epoch, best = dev[metric], epoch, _snapshot(current)
        metrics = {"epoch": epoch, "train_loss": train_loss, **dev, "best_epoch": state.best_epoch,
                   f"best_{metric}": state.best_dev, "params": params, "train_seconds": train_seconds,
                   "train_samples_per_second": len(lengths) / train_seconds}
        with tempfile.TemporaryDirectory(prefix="finetune-ckpt-") as folder:
            save_checkpoint(folder, current, optimizer, scheduler, asdict(state),
                            best if state.best_epoch != epoch else None)
            if epoch == cfg.epochs and cfg.score_test:  # test once, with the best-dev epoch's weights
                _load_weights(model, loss_fn, best)
                metrics.update(evaluator.evaluate(embed, "test"))
                metrics["test_epoch"] = state.best_epoch
                write_predictions(Path(folder) / PREDICTIONS, data.test, evaluator.last_scores["test"])
            report(metrics, checkpoint_dir=folder)
    return metrics
