"""The `contrastive` trainable: unsupervised SimCSE and miCSE on a (truncated) encoder.

SimCSE (Gao et al., 2021): every sentence of a batch goes through the encoder twice in one pass;
dropout is the only augmentation, the two views of a sentence are positives and the other
sentences of the batch negatives (InfoNCE over cosine / temperature). miCSE (Klein & Nabi, 2023)
adds a term that aligns the self-attention of the two views. Dev STS is scored every
`eval_every` optimizer steps (one report each, so ASHA can act); test once, at the end, with the
best-dev weights, and with `suite: true` the whole STS suite (STS12-16, STS-B, SICK-R).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from pydantic import Field
from torch import nn
from transformers import get_linear_schedule_with_warmup

from trainables.batching import TokenCache, pad
from trainables.checkpoints import PREDICTIONS, load_checkpoint, save_checkpoint
from trainables.contract import Report, TrainingConfig, parse_config
from trainables.data import corpus_sentences, load_sts_task
from trainables.errors import TrainingDivergedError, UserInputError, one_of
from trainables.evaluation import Embedder, make_evaluator
from trainables.finetune import TrainerState, build_optimizer, write_predictions
from trainables.models import (
    SentenceEncoder,
    build_sentence_encoder,
    count_parameters,
    encoder_depth,
    load_tokenizer,
    pool,
)
from trainables.runtime import autocast, prepare, seed_everything
from trainables.sts_suite import load_suite, score_suite, suite_metrics

METHODS = ("simcse", "micse")


class ContrastiveConfig(TrainingConfig):
    model: str
    method: str = Field("simcse", description="simcse, or micse (plus attention alignment of the two views)")
    task: str = Field("stsb", description="the STS task whose dev split selects steps, trials and layers")
    language: str | None = None
    corpus: str = Field("unlabeled_en", description="unlabeled_en, task (the task's train sentences), task+dev, "
                                                    "task+test (transductive only), or a text file")
    layer: int | None = Field(None, ge=0, description="keep the first k layers; null keeps all")
    pooling: str = "cls"
    mlp_head: bool = Field(True, description="a Linear+tanh head over the pooled vector while training only, "
                                             "as SimCSE's unsupervised models")
    temperature: float = Field(0.05, gt=0)
    attention_weight: float = Field(1.0, ge=0, description="micse: weight of the attention-alignment term")
    attention_layers: list[int] | None = Field(None, description="micse: which kept layers (1-based) align their "
                                                                 "attention; null is the last kept layer")
    lr: float = Field(3e-5, gt=0)
    steps: int = Field(250, ge=1, description="optimizer steps")
    eval_every: int = Field(125, ge=1, description="score dev and report every this many steps")
    batch_size: int = Field(64, ge=2)
    max_seq_length: int = Field(32, ge=2)
    warmup_ratio: float = Field(0.0, ge=0, le=1)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    suite: bool = Field(False, description="also score the STS suite (STS12-16, STS-B, SICK-R) at the end")
    transductive: bool = Field(False, description="allow test sentences in the corpus (recorded on the run)")
    max_train_samples: int | None = Field(None, ge=1, description="at most this many corpus sentences")

    def num_reports(self) -> int:
        return math.ceil(self.steps / self.eval_every)


def info_nce(first: torch.Tensor, second: torch.Tensor, temperature: float) -> torch.Tensor:
    """Row i of `first` should be closest to row i of `second` among all rows (in-batch negatives)."""
    logits = nn.functional.cosine_similarity(first.unsqueeze(1), second.unsqueeze(0), dim=-1) / temperature
    return nn.functional.cross_entropy(logits, torch.arange(len(first), device=first.device))


def attention_alignment(first: list[torch.Tensor], second: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """miCSE's term: per sentence, 1 - the Pearson correlation of the two views' log attention
    probabilities over every head and every (query, key) pair of real tokens in the chosen layers
    (entries dropped by attention dropout in either view left out), averaged over sentences.
    Zero for identical attention, positive otherwise. Raising that correlation raises the views'
    Gaussian mutual information, -1/2 log(1 - rho^2), which miCSE estimates on sampled entries;
    the bounded form keeps the loss finite."""
    pair_mask = (mask.unsqueeze(2) * mask.unsqueeze(1)).bool()  # (batch, query, key)
    x = torch.stack([a.float() for a in first], dim=1)  # (batch, layers, heads, query, key)
    y = torch.stack([a.float() for a in second], dim=1)
    # entries that attention dropout zeroed in either view are left out, as miCSE does
    valid = (pair_mask[:, None, None] & (x > 0) & (y > 0)).reshape(len(x), -1)
    x = torch.log(x.clamp_min(1e-9)).reshape(len(x), -1)
    y = torch.log(y.clamp_min(1e-9)).reshape(len(y), -1)
    count = valid.sum(dim=1).clamp_min(1)
    x_centered = torch.where(valid, x - (x * valid).sum(1, keepdim=True) / count[:, None], 0.0)
    y_centered = torch.where(valid, y - (y * valid).sum(1, keepdim=True) / count[:, None], 0.0)
    covariance = (x_centered * y_centered).sum(1)
    scale = (x_centered.square().sum(1) * y_centered.square().sum(1)).sqrt()
    correlation = torch.where(scale > 1e-12, covariance / scale.clamp_min(1e-12), torch.ones_like(scale))
    return (1 - correlation).mean()


class ContrastiveModel(nn.Module):
    """A SentenceEncoder and, while training, SimCSE's MLP head over its pooled vectors."""

    def __init__(self, encoder: SentenceEncoder, mlp_head: bool):
        super().__init__()
        self.sentence_encoder = encoder
        hidden = encoder.encoder.config.hidden_size
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if mlp_head else nn.Identity()

    def views(self, input_ids: torch.Tensor, mask: torch.Tensor, attention_layers: list[int] | None):
        """Pooled (and head-projected) vectors of each row; with `attention_layers`, also the
        attention probabilities of those layers (0-based)."""
        if not attention_layers:
            return self.head(self.sentence_encoder(input_ids, mask)), []
        output = self.sentence_encoder.encoder(input_ids=input_ids, attention_mask=mask, output_attentions=True)
        vectors = self.head(pool(output.last_hidden_state, mask, self.sentence_encoder.pooling))
        return vectors, [output.attentions[k] for k in attention_layers]


def contrastive_step(model: ContrastiveModel, token_lists: list[list[int]], pad_id: int, device, dtype,
                     cfg: ContrastiveConfig, attention_layers: list[int] | None) -> tuple[torch.Tensor, dict]:
    """The loss of one batch: every sentence twice in one pass, so dropout gives two views."""
    input_ids, mask = pad(token_lists + token_lists, pad_id, device)
    with autocast(device, dtype):
        vectors, attentions = model.views(input_ids, mask, attention_layers)
    half = len(token_lists)
    loss = contrastive = info_nce(vectors[:half].float(), vectors[half:].float(), cfg.temperature)
    parts = {"contrastive_loss": contrastive.detach()}
    if attention_layers:
        alignment = attention_alignment([a[:half] for a in attentions], [a[half:] for a in attentions], mask[:half])
        loss = loss + cfg.attention_weight * alignment
        parts["attention_loss"] = alignment.detach()
    return loss, parts


def resolve_attention_layers(cfg: ContrastiveConfig, kept: int) -> list[int] | None:
    """0-based indices of the layers whose attention miCSE aligns; None for SimCSE."""
    if cfg.method not in METHODS:
        raise one_of("method", cfg.method, METHODS)
    if cfg.method == "simcse":
        return None
    if kept == 0:
        raise UserInputError("layer", 0, "micse aligns attention, and layer 0 has none: use layer >= 1 or simcse")
    layers = cfg.attention_layers or [kept]
    bad = [k for k in layers if not 1 <= k <= kept]
    if bad:
        raise UserInputError("attention_layers", layers, f"the encoder keeps {kept} layers: use numbers in 1..{kept}")
    return [k - 1 for k in sorted(set(layers))]


def step_batches(count: int, batch_size: int, seed: int, steps: int, done: int = 0) -> list[list[int]]:
    """Row indices of the batches of steps done+1..steps: passes over the corpus in seeded random
    orders (a short last batch, with too few negatives, is dropped), so a resumed run sees the
    same batches as an uninterrupted one."""
    per_pass = max(1, count // batch_size)
    orders: dict[int, list[int]] = {}
    out: list[list[int]] = []
    for step in range(done, steps):
        epoch, index = divmod(step, per_pass)
        if epoch not in orders:
            generator = torch.Generator().manual_seed(seed * 1_000 + epoch)
            orders[epoch] = torch.randperm(count, generator=generator).tolist()
        out.append(orders[epoch][index * batch_size: (index + 1) * batch_size])
    return out


def run(config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
    """Train with SimCSE or miCSE; report dev every `eval_every` steps; returns the final metrics."""
    return train(parse_config(ContrastiveConfig, config), report, checkpoint_dir)[1]


def train(cfg: ContrastiveConfig, report: Report, checkpoint_dir: str | None = None) -> tuple[ContrastiveModel, dict]:
    """The training loop; returns the model holding its best-dev weights, and the last metrics."""
    device, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    data = load_sts_task(cfg.task, cfg.language, cfg.data_dir, "contrastive", max_eval_samples=cfg.max_eval_samples)
    sentences = corpus_sentences(cfg.corpus, cfg.task, cfg.language, cfg.data_dir, cfg.transductive, key="corpus")
    if cfg.max_train_samples is not None and cfg.max_train_samples < len(sentences):
        keep = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(0))[: cfg.max_train_samples]
        sentences = [sentences[i] for i in sorted(keep.tolist())]
    if len(sentences) < 2:
        raise UserInputError("corpus", cfg.corpus, "the corpus has fewer than 2 sentences")

    seed_everything(cfg.seed)
    encoder = build_sentence_encoder(cfg.model, cfg.layer, cfg.pooling, seed=cfg.seed)
    attention_layers = resolve_attention_layers(cfg, encoder_depth(encoder.encoder.config))
    if attention_layers:
        encoder.encoder.set_attn_implementation("eager")  # fused attention kernels return no probabilities
    model = ContrastiveModel(encoder, cfg.mlp_head).to(device)
    tokens = TokenCache(load_tokenizer(cfg.model), cfg.max_seq_length)
    tokens.add(sentences)
    evaluator = make_evaluator("sts", {"dev": data.dev, "test": data.test})
    embed = Embedder(model.sentence_encoder, tokens, device, dtype)  # the head is for training only
    batch_size = min(cfg.batch_size, len(sentences))

    optimizer = build_optimizer(list(model.named_parameters()), cfg.lr, cfg.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * cfg.steps), cfg.steps)
    state, best = TrainerState(), None
    if checkpoint_dir:
        weights, best_weights, saved = load_checkpoint(checkpoint_dir, optimizer, scheduler)
        model.load_state_dict(weights)
        state, best = TrainerState(**saved), {k: v.clone() for k, v in best_weights.items()}

    params = count_parameters(model.sentence_encoder)
    metrics: dict = {}
    batches = step_batches(len(sentences), batch_size, cfg.seed, cfg.steps, state.step)
    while state.step < cfg.steps:
        started, losses, parts_sum = time.perf_counter(), [], {}
        model.train()
        stop = min(cfg.steps, (state.epoch + 1) * cfg.eval_every)
        while state.step < stop:
            torch.manual_seed(cfg.seed * 1_000_003 + state.step)  # dropout stream per step: resumes reproduce it
            batch = batches.pop(0)
            loss, parts = contrastive_step(model, [tokens[sentences[i]] for i in batch], tokens.pad_id, device,
                                           dtype, cfg, attention_layers)
            if not torch.isfinite(loss):
                raise TrainingDivergedError(f"loss became {loss.item()} at step {state.step + 1} (lr={cfg.lr}); "
                                            "lower the learning rate or raise the temperature")
            loss.backward()
            if cfg.max_grad_norm:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            losses.append(loss.item())
            for name, value in parts.items():
                parts_sum[name] = parts_sum.get(name, 0.0) + value.item()
        state.epoch += 1  # an evaluation round is the pruner's epoch
        train_seconds = time.perf_counter() - started
        dev = evaluator.evaluate(embed, "dev")
        current = model.state_dict()
        if state.best_dev is None or dev["dev_spearman"] > state.best_dev:
            state.best_dev, state.best_epoch = dev["dev_spearman"], state.epoch
            best = {k: v.detach().to("cpu", copy=True) for k, v in current.items()}
        metrics = {"epoch": state.epoch, "step": state.step, "train_loss": sum(losses) / len(losses),
                   **{k: v / len(losses) for k, v in parts_sum.items()}, **dev, "best_epoch": state.best_epoch,
                   "best_dev_spearman": state.best_dev, "best_step": state.best_epoch * cfg.eval_every,
                   "params": params, "train_seconds": train_seconds, "corpus_sentences": len(sentences),
                   "transductive": int(cfg.transductive)}
        with tempfile.TemporaryDirectory(prefix="contrastive-ckpt-") as folder:
            save_checkpoint(folder, current, optimizer, scheduler, asdict(state),
                            best if state.best_epoch != state.epoch else None)
            if state.step == cfg.steps and cfg.score_test:  # test once, with the best-dev weights
                model.load_state_dict({k: v.to(device) for k, v in best.items()})
                metrics.update(evaluator.evaluate(embed, "test"))
                metrics["test_epoch"] = state.best_epoch
                write_predictions(Path(folder) / PREDICTIONS, data.test, evaluator.last_scores["test"])
                if cfg.suite:
                    frames = load_suite("sts", cfg.data_dir, cfg.max_eval_samples)
                    metrics.update(suite_metrics(score_suite(embed, frames)))
            report(metrics, checkpoint_dir=folder)
    if best is not None:
        model.load_state_dict({k: v.to(device) for k, v in best.items()})
    return model, metrics
