"""The `distill` trainable: Trans-Encoder (Liu et al., ICLR 2022) self- and mutual-distillation
between bi- and cross-encoders on unlabeled pairs, and plain teacher -> student distillation.

One cycle of `mode: self`: the bi-encoder scores every pair by cosine (clipped to [0, 1]); the
cross-encoder trains on those scores (BCE); it relabels the pairs (sigmoid); the bi-encoder
trains on them (MSE on cosine). `mode: mutual` runs two bi-/cross-encoder pairs (two layers or
two models) that both learn from the average of their pseudo-labels. `mode: teacher` trains a
cross-encoder on the task's gold train labels once (a cached stage), and its scores of the
unlabeled pairs teach the bi-encoder. Dev of both encoders is reported after every cycle; the
cycle is chosen on the bi-encoder's dev Spearman only. Replicate runs also score test after
every cycle for the per-cycle table (flat `cycle{n}_*` metrics in the last report); the run's
`test_*` are the dev-selected cycle's. Every cycle's pseudo-labels are kept in the checkpoint
and logged as the MLflow artifact `pseudo_labels.csv`.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from safetensors.torch import load_file, save_file
from transformers import get_linear_schedule_with_warmup

from trainables.batching import TokenCache
from trainables.checkpoints import PREDICTIONS, PSEUDO_LABELS
from trainables.contract import Report, TrainingConfig, parse_config
from trainables.cross_encoder import CROSS_LOSSES, CrossEncoder, PairTokens, fit_cross_encoder, predict, score_split
from trainables.data import TaskData, load_sts_task, load_task
from trainables.errors import TrainingDivergedError, UserInputError, one_of
from trainables.evaluation import Embedder, STSEvaluator, pair_cosines
from trainables.finetune import build_optimizer, epoch_batches, train_step, write_predictions
from trainables.models import SentenceEncoder, build_sentence_encoder, count_parameters, load_tokenizer
from trainables.objectives import CosineMSELoss
from trainables.runtime import prepare, seed_everything
from trainables.stages import get_or_build

MODES = ("self", "mutual", "teacher")
STATE = "distill_state.json"
WEIGHTS = "models.safetensors"
BEST = "best.safetensors"


class DistillConfig(TrainingConfig):
    model: str = Field(description="the bi-encoder to start from (Trans-Encoder: an unsupervised SimCSE model)")
    mode: str = Field("self", description="self, mutual (two encoder pairs, averaged labels) or teacher")
    cross_model: str | None = Field(None, description="the cross-encoder's backbone; null is `model`")
    partner_model: str | None = Field(None, description="mutual: the second bi-encoder; null is `model`")
    partner_layer: int | None = Field(None, ge=0, description="mutual: the second bi-encoder's layer")
    partner_cross_model: str | None = Field(None, description="mutual: the second cross backbone")
    task: str = Field("stsb", description="the STS task: its dev split selects cycles; its pairs are unlabeled")
    language: str | None = None
    pairs: str = Field("task", description="task (train pairs, labels dropped), task+dev, task+test "
                                           "(transductive), or a TSV file of two sentence columns")
    layer: int | None = Field(None, ge=0)
    pooling: str = "mean"
    cross_layer: int | None = Field(None, ge=0)
    cross_pooling: str = "cls"
    pretrain: str | None = Field(None, description="simcse, micse or mlm: first adapt `model` on "
                                                    "`pretrain_corpus` (a cached stage shared by the study), as "
                                                    "Trans-Encoder starts from an unsupervised SimCSE model")
    pretrain_corpus: str = "unlabeled_en"
    pretrain_steps: int = Field(200, ge=1)
    pretrain_lr: float = Field(3e-5, gt=0)
    pretrain_batch_size: int = Field(64, ge=2)
    cycles: int = Field(3, ge=1)
    bi_epochs: int = Field(10, ge=1)
    bi_lr: float = Field(5e-5, gt=0)
    bi_batch_size: int = Field(128, ge=2)
    bi_max_seq_length: int = Field(32, ge=2)
    cross_epochs: int = Field(1, ge=1)
    cross_lr: float = Field(2e-5, gt=0)
    cross_batch_size: int = Field(32, ge=1)
    cross_max_seq_length: int = Field(64, ge=4, description="the same at training and test time")
    cross_loss: str = "bce"
    restart_each_cycle: bool = Field(False, description="both encoders restart from their initial weights every "
                                                        "cycle, so only the labels carry over")
    transductive: bool = False
    max_train_samples: int | None = Field(None, ge=1, description="at most this many unlabeled pairs")
    cache_dir: str | None = None

    def num_reports(self) -> int:
        return 1 if self.mode == "teacher" else self.cycles


@dataclass
class Side:
    """One bi-encoder and its cross-encoder; `prefix` names its metrics ('' or 'partner_')."""

    prefix: str
    bi_name: str
    bi_layer: int | None
    cross_name: str
    bi: SentenceEncoder
    cross: CrossEncoder
    bi_tokens: TokenCache
    cross_tokens: PairTokens


@dataclass
class DistillState:
    cycle: int = 0
    best_cycle: int = 0
    best_dev: float | None = None
    per_cycle: dict[str, float] = field(default_factory=dict)  # cycle{n}_* of every finished cycle


def unlabeled_pairs(cfg: DistillConfig, data: TaskData) -> pd.DataFrame:
    """Distinct (sentence1, sentence2) pairs without labels; test pairs only when transductive."""
    source = cfg.pairs
    if source in ("task", "task+dev", "task+test"):
        if source == "task+test" and not cfg.transductive:
            raise UserInputError("pairs", source, "test pairs train only with transductive: true")
        full = load_task(cfg.task, cfg.language, cfg.data_dir)
        frames = [full.train] + ([full.dev] if source != "task" else []) + ([full.test] if source == "task+test"
                                                                            else [])
        frame = pd.concat([f[["sentence1", "sentence2"]] for f in frames], ignore_index=True)
    elif Path(source).expanduser().is_file():
        frame = pd.read_csv(Path(source).expanduser(), sep="\t", header=None, quoting=3, usecols=[0, 1],
                            names=["sentence1", "sentence2"], dtype=str, keep_default_na=False)
    else:
        raise UserInputError("pairs", source, "use task, task+dev, task+test (transductive) or the path of a TSV "
                                              "file with two sentence columns")
    frame = frame[(frame.sentence1.str.strip() != "") & (frame.sentence2.str.strip() != "")]
    frame = frame.drop_duplicates().reset_index(drop=True)
    if cfg.max_train_samples is not None and cfg.max_train_samples < len(frame):
        frame = frame.sample(n=cfg.max_train_samples, random_state=0).sort_index().reset_index(drop=True)
    if len(frame) < 2:
        raise UserInputError("pairs", source, "fewer than 2 pairs")
    return frame


def fit_bi_encoder(model: SentenceEncoder, tokens: TokenCache, frame: pd.DataFrame, epochs: int, lr: float,
                   batch_size: int, seed: int, device, dtype, where: str) -> list[float]:
    """MSE between cosine and the pseudo-label of each pair (Trans-Encoder's bi-encoder step)."""
    first, second = list(frame["sentence1"]), list(frame["sentence2"])
    tokens.add(first + second)
    targets = torch.as_tensor(frame["score"].to_numpy(dtype=np.float32).copy())
    lengths = [max(len(tokens[a]), len(tokens[b])) for a, b in zip(first, second, strict=True)]
    loss_fn = CosineMSELoss()
    optimizer = build_optimizer(list(model.named_parameters()), lr, 0.01)
    total = math.ceil(len(frame) / batch_size) * epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, round(0.1 * total), total)
    model.train()
    losses = []
    for epoch in range(1, epochs + 1):
        torch.manual_seed(seed * 1_000 + epoch)
        epoch_loss = []
        for batch in epoch_batches(lengths, batch_size, seed * 1_000 + epoch, True):
            token_lists = [tokens[first[i]] for i in batch] + [tokens[second[i]] for i in batch]
            loss = train_step(model, loss_fn, optimizer, scheduler, token_lists, targets[batch], tokens.pad_id,
                              device, dtype, 1.0).item()
            if not math.isfinite(loss):
                raise TrainingDivergedError(f"bi-encoder loss became {loss} at {where}, epoch {epoch} (bi_lr={lr}); "
                                            "lower bi_lr")
            epoch_loss.append(loss)
        losses.append(float(np.mean(epoch_loss)))
    return losses


def bi_scores(side: Side, frame: pd.DataFrame, device, dtype) -> np.ndarray:
    return pair_cosines(Embedder(side.bi, side.bi_tokens, device, dtype), frame)


def cross_scores(side: Side, frame: pd.DataFrame, device, dtype) -> np.ndarray:
    tokens = side.cross_tokens.lookup(list(frame["sentence1"]), list(frame["sentence2"]))
    return predict(side.cross, tokens, side.cross_tokens.pad_id, device, dtype)


def build_side(cfg: DistillConfig, prefix: str, bi_name: str, bi_layer: int | None, cross_name: str, device) -> Side:
    bi = build_sentence_encoder(bi_name, bi_layer, cfg.pooling, seed=cfg.seed).to(device)
    cross = CrossEncoder(cross_name, cfg.cross_layer, cfg.cross_pooling).to(device)
    return Side(prefix, bi_name, bi_layer, cross_name, bi, cross, TokenCache(load_tokenizer(bi_name),
                cfg.bi_max_seq_length), PairTokens(load_tokenizer(cross_name), cfg.cross_max_seq_length))


def _restart(side: Side, cfg: DistillConfig, device, bi: bool = True, cross: bool = True) -> None:
    if bi:
        fresh = build_sentence_encoder(side.bi_name, side.bi_layer, cfg.pooling, seed=cfg.seed)
        side.bi.load_state_dict(fresh.state_dict())
    if cross:
        side.cross.load_state_dict(CrossEncoder(side.cross_name, cfg.cross_layer, cfg.cross_pooling).state_dict())


def _weights(sides: list[Side]) -> dict[str, torch.Tensor]:
    return {f"{s.prefix}{part}.{k}": v.detach().to("cpu", copy=True).contiguous()
            for s in sides for part, module in (("bi", s.bi), ("cross", s.cross))
            for k, v in module.state_dict().items()}


def _load_weights(sides: list[Side], weights: dict[str, torch.Tensor]) -> None:
    for s in sides:
        for part, module in (("bi", s.bi), ("cross", s.cross)):
            head = f"{s.prefix}{part}."
            module.load_state_dict({k[len(head):]: v for k, v in weights.items() if k.startswith(head)})


def _evaluate(sides: list[Side], data: TaskData, split: str, device, dtype) -> tuple[dict[str, float], dict]:
    """Both encoders of every side on `split`: `dev_spearman` (bi), `cross_dev_spearman`, ...; and
    the per-pair scores of the main side's bi-encoder."""
    metrics, scores = {}, {}
    for side in sides:
        evaluator = STSEvaluator({split: data.split(split)})
        bi = evaluator.evaluate(Embedder(side.bi, side.bi_tokens, device, dtype), split)
        cross, _ = score_split(side.cross, side.cross_tokens, data.split(split), split, device, dtype)
        metrics.update({f"{side.prefix}{k}": v for k, v in bi.items()})
        metrics.update({f"{side.prefix}cross_{k}": v for k, v in cross.items()})
        scores[side.prefix] = evaluator.last_scores[split]
    return metrics, scores


def teacher_labels(cfg: DistillConfig, side: Side, data: TaskData, pairs: pd.DataFrame, device,
                   dtype) -> tuple[np.ndarray, dict]:
    """A cross-encoder trained once on the task's gold train labels (a cached stage shared by every
    trial and seed) and its scores of the unlabeled pairs; loads its weights into `side.cross`."""
    fields = ("task", "language", "pairs", "max_train_samples", "max_eval_samples", "transductive", "cross_layer",
              "cross_pooling", "cross_epochs", "cross_lr", "cross_batch_size", "cross_max_seq_length", "cross_loss")
    params = {"cross_model": side.cross_name, **{k: getattr(cfg, k) for k in fields}}

    def build(folder: Path) -> dict:
        seed_everything(0)
        losses = fit_cross_encoder(side.cross, side.cross_tokens, data.train, cfg.cross_epochs, cfg.cross_lr,
                                   cfg.cross_batch_size, 0, cfg.cross_loss, device, dtype, where="teacher")
        save_file(_weights([side]), folder / WEIGHTS)
        pairs.assign(score=cross_scores(side, pairs, device, dtype)).to_csv(folder / "labels.csv", index=False)
        return {"loss_curve": losses, "first_loss": losses[0], "last_loss": losses[-1], "pairs": len(pairs)}

    folder, record, built = get_or_build(cfg.cache_dir, "teacher", params, build)
    if not built:
        _load_weights([side], load_file(folder / WEIGHTS))
    labels = pd.read_csv(folder / "labels.csv", keep_default_na=False)["score"].to_numpy(dtype=np.float64)
    return labels, {"teacher_cache_key": record["key"], "teacher_cache_hit": int(not built),
                    "teacher_train_loss": record["last_loss"]}


def pretrained_start(cfg: DistillConfig) -> tuple[str, dict]:
    """The bi-encoder to start from: `model`, or `model` adapted by the `pretrain` objective
    through the DAPT stage cache (the same cached stage `trainable: dapt` would build)."""
    if cfg.pretrain is None:
        return cfg.model, {}
    from trainables.dapt import OBJECTIVES, DaptConfig, adapt

    if cfg.pretrain not in OBJECTIVES:
        raise one_of("pretrain", cfg.pretrain, OBJECTIVES)
    folder, record, built = adapt(DaptConfig(
        model=cfg.model, task=cfg.task, language=cfg.language, pooling=cfg.pooling, dapt_objective=cfg.pretrain,
        dapt_corpus=cfg.pretrain_corpus, dapt_steps=cfg.pretrain_steps, dapt_lr=cfg.pretrain_lr,
        dapt_batch_size=cfg.pretrain_batch_size, dapt_max_seq_length=cfg.bi_max_seq_length,
        transductive=cfg.transductive, data_dir=cfg.data_dir, max_eval_samples=cfg.max_eval_samples,
        device=cfg.device, precision=cfg.precision, cache_dir=cfg.cache_dir))
    return str(folder), {"dapt_stage_dir": str(folder), "dapt_cache_key": record["key"],
                         "dapt_cache_hit": int(not built)}


def run(config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
    """Distil for `cycles` (or once, from a teacher); report after each; test the dev-selected cycle."""
    cfg = parse_config(DistillConfig, config)
    if cfg.mode not in MODES:
        raise one_of("mode", cfg.mode, MODES)
    if cfg.cross_loss not in CROSS_LOSSES:
        raise one_of("cross_loss", cfg.cross_loss, CROSS_LOSSES)
    device, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    data = load_sts_task(cfg.task, cfg.language, cfg.data_dir, "distillation", max_eval_samples=cfg.max_eval_samples)
    pairs = unlabeled_pairs(cfg, data)
    start, stage = pretrained_start(cfg)
    seed_everything(cfg.seed)
    sides = [build_side(cfg, "", start, cfg.layer, cfg.cross_model or cfg.model, device)]
    if cfg.mode == "mutual":
        partner = cfg.partner_model or cfg.model
        sides.append(build_side(cfg, "partner_", partner, cfg.partner_layer, cfg.partner_cross_model or partner,
                                device))
    state, best, history = DistillState(), None, pd.DataFrame(columns=["cycle", "step", "pair", "label"])
    best_test: tuple[dict, dict] | None = None  # the dev-selected cycle's test metrics and pair scores
    if checkpoint_dir:
        _load_weights(sides, load_file(Path(checkpoint_dir) / WEIGHTS))
        best = load_file(Path(checkpoint_dir) / BEST)
        state = DistillState(**json.loads((Path(checkpoint_dir) / STATE).read_text()))
        history = pd.read_csv(Path(checkpoint_dir) / PSEUDO_LABELS)

    extra: dict = {**stage, "pairs": len(pairs), "transductive": int(cfg.transductive),
                   "params": count_parameters(sides[0].bi), "cross_params": count_parameters(sides[0].cross)}
    metrics: dict = {}
    for cycle in range(state.cycle + 1, cfg.num_reports() + 1):
        if cfg.restart_each_cycle and cycle > 1:
            for side in sides:
                _restart(side, cfg, device)
        if cfg.mode == "teacher":
            cross_labels, teacher = teacher_labels(cfg, sides[0], data, pairs, device, dtype)
            extra.update(teacher)
            cross_loss = teacher["teacher_train_loss"]
        else:
            bi_labels = np.mean([np.clip(bi_scores(s, pairs, device, dtype), 0.0, 1.0) for s in sides], axis=0)
            history = _append(history, cycle, "bi_to_cross", bi_labels)
            labeled = pairs.assign(score=bi_labels)
            cross_loss = float(np.mean([fit_cross_encoder(s.cross, s.cross_tokens, labeled, cfg.cross_epochs,
                                                          cfg.cross_lr, cfg.cross_batch_size, cfg.seed * 100 + cycle,
                                                          cfg.cross_loss, device, dtype, where=f"cycle {cycle}")[-1]
                                        for s in sides]))
            cross_labels = np.mean([cross_scores(s, pairs, device, dtype) for s in sides], axis=0)
        history = _append(history, cycle, "cross_to_bi", cross_labels)
        labeled = pairs.assign(score=cross_labels)
        bi_loss = float(np.mean([fit_bi_encoder(s.bi, s.bi_tokens, labeled, cfg.bi_epochs, cfg.bi_lr,
                                                cfg.bi_batch_size, cfg.seed * 100 + cycle, device, dtype,
                                                f"cycle {cycle}")[-1] for s in sides]))
        dev, _ = _evaluate(sides, data, "dev", device, dtype)
        state.cycle = cycle
        current = _weights(sides)
        improved = state.best_dev is None or dev["dev_spearman"] > state.best_dev
        if improved:
            state.best_dev, state.best_cycle, best = dev["dev_spearman"], cycle, current
        state.per_cycle.update({f"cycle{cycle}_{k}": v for k, v in dev.items()})
        if cfg.score_test:  # each cycle's test is for the per-cycle table; selection used dev above
            test = _evaluate(sides, data, "test", device, dtype)
            state.per_cycle.update({f"cycle{cycle}_{k}": v for k, v in test[0].items()})
            best_test = test if improved else best_test
        metrics = {"epoch": cycle, "cycle": cycle, "bi_train_loss": bi_loss, "cross_train_loss": cross_loss,
                   "train_loss": bi_loss, **dev, "best_epoch": state.best_cycle,
                   "best_dev_spearman": state.best_dev, **extra}
        with tempfile.TemporaryDirectory(prefix="distill-ckpt-") as folder:
            save_file(current, Path(folder) / WEIGHTS)
            save_file(best, Path(folder) / BEST)
            (Path(folder) / STATE).write_text(json.dumps(state.__dict__))
            history.to_csv(Path(folder) / PSEUDO_LABELS, index=False)
            if cycle == cfg.num_reports() and cfg.score_test:
                if best_test is None:  # resumed after the best cycle: score its weights again
                    _load_weights(sides, best)
                    best_test = _evaluate(sides, data, "test", device, dtype)
                test, scores = best_test
                metrics.update({**test, "test_epoch": state.best_cycle, **state.per_cycle})
                write_predictions(Path(folder) / PREDICTIONS, data.test, scores[""])
            report(metrics, checkpoint_dir=folder)
    return metrics


def _append(history: pd.DataFrame, cycle: int, step: str, labels: np.ndarray) -> pd.DataFrame:
    rows = pd.DataFrame({"cycle": cycle, "step": step, "pair": np.arange(len(labels)), "label": labels})
    return rows if history.empty else pd.concat([history, rows], ignore_index=True)
