"""The `distill` kind's learner: one Trans-Encoder cycle (or the teacher's labels) per round."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from trainables.data.tasks import load_sts_task, unlabeled_pairs
from trainables.errors import one_of
from trainables.evaluation.evaluators import Embedder, STSEvaluator, pair_cosines
from trainables.evaluation.postprocess import FittedOnTrain
from trainables.kinds.distill import MODES, DistillConfig
from trainables.models.batching import TokenCache
from trainables.models.encoder import (
    SentenceEncoder,
    build_sentence_encoder,
    load_tokenizer,
    special_ids,
    used_parameter_count,
)
from trainables.models.lora import adapter_parameter_count, add_lora
from trainables.runtime import scoring_dtype, seed_everything
from trainables.stages.pretrain import pretrained_start
from trainables.stages.teacher import teacher_labels
from trainables.training.bi_encoder import fit_bi_encoder
from trainables.training.checkpoints import PSEUDO_LABELS
from trainables.training.cross_encoder import (
    CROSS_LOSSES,
    CrossEncoder,
    PairTokens,
    both_orders,
    fit_cross_encoder,
    score_both_orders,
    score_split,
)
from trainables.training.learner import Learner


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
    postprocess: FittedOnTrain | None = None  # the bi-encoder's `postprocess` map (set by the learner)


def build_side(cfg: DistillConfig, prefix: str, bi_name: str, bi_layer: int | None, cross_name: str, device) -> Side:
    """The bi-encoder takes the prompt and LoRA's adapters (`lora_rank`: after the cut, its weights frozen);
    the cross-encoder reads each pair as it is and trains whole."""
    bi_tokens = TokenCache(load_tokenizer(bi_name, cfg.append_eos), cfg.bi_max_seq_length, cfg.prompt)
    bi = build_sentence_encoder(bi_name, bi_layer, cfg.pooling, seed=cfg.seed, dropout_masks=cfg.dropout_masks,
                                prompt_tokens=0 if cfg.include_prompt else bi_tokens.prompt_length,
                                pooling_layers=cfg.pooling_layers, bidirectional=cfg.bidirectional,
                                skipped_ids=None if cfg.pool_special_tokens else special_ids(bi_tokens.tokenizer))
    with_adapters(bi, cfg)
    bi = bi.to(device)
    cross = CrossEncoder(cross_name, cfg.cross_layer, cfg.cross_pooling, cfg.dropout_masks, cfg.cross_head).to(device)
    return Side(prefix, bi_name, bi_layer, cross_name, bi, cross, bi_tokens,
                PairTokens(load_tokenizer(cross_name), cfg.cross_max_seq_length))


def with_adapters(bi: SentenceEncoder, cfg: DistillConfig) -> SentenceEncoder:
    """LoRA's adapters on the bi-encoder's cut encoder when `lora_rank` is set. peft draws lora_A from torch's
    global generator: drawn here from the trial's seed on a generator of their own (the global one is left as
    it was), so a restarted bi-encoder gets the adapters it started with."""
    if cfg.lora_rank is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            add_lora(bi.encoder, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    return bi


def restart_bi(side: Side, cfg: DistillConfig) -> None:
    skipped = None if cfg.pool_special_tokens else special_ids(side.bi_tokens.tokenizer)
    fresh = build_sentence_encoder(side.bi_name, side.bi_layer, cfg.pooling, seed=cfg.seed,
                                   pooling_layers=cfg.pooling_layers, bidirectional=cfg.bidirectional,
                                   skipped_ids=skipped)
    side.bi.load_state_dict(with_adapters(fresh, cfg).state_dict())


def restart_cross(side: Side, cfg: DistillConfig) -> None:
    fresh = CrossEncoder(side.cross_name, cfg.cross_layer, cfg.cross_pooling, head=cfg.cross_head)
    side.cross.load_state_dict(fresh.state_dict())


def bi_scores(side: Side, frame: pd.DataFrame, device, dtype) -> np.ndarray:
    return pair_cosines(Embedder(side.bi, side.bi_tokens, device, dtype), frame)


def cross_scores(side: Side, frame: pd.DataFrame, device, dtype) -> np.ndarray:
    """The cross-encoder's score of each pair, averaged over both orders (it learned both)."""
    return score_both_orders(side.cross, side.cross_tokens, frame, device, dtype)


class DistillLearner(Learner):
    metric = "dev_spearman"

    def __init__(self, cfg: DistillConfig, device, dtype):
        if cfg.mode not in MODES:
            raise one_of("mode", cfg.mode, MODES)
        if cfg.cross_loss not in CROSS_LOSSES:
            raise one_of("cross_loss", cfg.cross_loss, CROSS_LOSSES)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.data = load_sts_task(cfg.task, cfg.language, cfg.data_dir, "distillation",
                                  max_eval_samples=cfg.max_eval_samples)
        self.pairs = unlabeled_pairs(cfg.pairs, cfg.task, cfg.language, cfg.data_dir, cfg.transductive,
                                     cfg.max_train_samples)
        start, stage = pretrained_start(cfg, cfg.pooling)
        seed_everything(cfg.seed)
        self.sides = [build_side(cfg, "", start, cfg.layer, cfg.cross_model or start, device)]
        if cfg.mode == "mutual":
            partner = cfg.partner_model or cfg.model
            self.sides.append(build_side(cfg, "partner_", partner, cfg.partner_layer,
                                         cfg.partner_cross_model or partner, device))
        self.history = pd.DataFrame(columns=["cycle", "step", "pair", "label"])
        sentences = list(self.pairs["sentence1"]) + list(self.pairs["sentence2"])  # the pairs it trains on
        scoring = scoring_dtype(cfg.eval_precision, dtype)
        for side in self.sides:  # each bi-encoder's own map, fitted for the weights it holds
            side.postprocess = FittedOnTrain(cfg.postprocess, cfg.postprocess_dim, side.bi,
                                             Embedder(side.bi, side.bi_tokens, device, scoring), sentences)
        self.test_frame = self.data.test
        self.info = {**stage, "pairs": len(self.pairs), "transductive": int(cfg.transductive),
                     "params": used_parameter_count(self.sides[0].bi) - adapter_parameter_count(self.sides[0].bi),
                     "cross_params": used_parameter_count(self.sides[0].cross)}
        if cfg.lora_rank is not None:  # the bi-encoder's size is the merged one's; what trained in it, beside it
            self.info["trained_params"] = sum(p.numel() for p in self.sides[0].bi.parameters() if p.requires_grad)

    def modules(self):
        return {f"{s.prefix}{part}": module for s in self.sides for part, module in (("bi", s.bi), ("cross", s.cross))}

    def _record(self, cycle: int, step: str, labels: np.ndarray) -> None:
        rows = pd.DataFrame({"cycle": cycle, "step": step, "pair": np.arange(len(labels)), "label": labels})
        self.history = rows if self.history.empty else pd.concat([self.history, rows], ignore_index=True)

    def train_round(self, cycle: int) -> dict[str, float]:
        cfg, sides, device, dtype = self.cfg, self.sides, self.device, self.dtype
        restart = cfg.restart_each_cycle and cycle > 1
        if cfg.mode == "teacher":
            side = sides[0]
            cross_labels, teacher = teacher_labels(cfg, side.cross_name, side.cross, side.cross_tokens,
                                                   lambda: restart_cross(side, cfg), self.data.train, self.pairs,
                                                   device, dtype)
            self.info.update(teacher)
            cross_loss = teacher["teacher_train_loss"]
        else:
            # labels from the bi-encoders the previous cycle trained, before any restart
            bi_labels = np.mean([np.clip(bi_scores(s, self.pairs, device, dtype), 0.0, 1.0) for s in sides], axis=0)
            self._record(cycle, "bi_to_cross", bi_labels)
            labeled = both_orders(self.pairs.assign(score=bi_labels))
            losses = []
            for side in sides:
                if restart:
                    restart_cross(side, cfg)
                losses.append(fit_cross_encoder(side.cross, side.cross_tokens, labeled, cfg.cross_epochs, cfg.cross_lr,
                                                cfg.cross_batch_size, cfg.seed * 100 + cycle, cfg.cross_loss, device,
                                                dtype, where=f"cycle {cycle}")[-1])
            cross_loss = float(np.mean(losses))
            cross_labels = np.mean([cross_scores(s, self.pairs, device, dtype) for s in sides], axis=0)
        self._record(cycle, "cross_to_bi", cross_labels)
        labeled = self.pairs.assign(score=cross_labels)
        losses = []
        for side in sides:
            if restart:
                restart_bi(side, cfg)
            losses.append(fit_bi_encoder(side.bi, side.bi_tokens, labeled, cfg.bi_epochs, cfg.bi_lr, cfg.bi_batch_size,
                                         cfg.seed * 100 + cycle, device, dtype, f"cycle {cycle}")[-1])
        bi_loss = float(np.mean(losses))
        return {"train_loss": bi_loss, "bi_train_loss": bi_loss, "cross_train_loss": cross_loss}

    def evaluate(self, split: str):
        """Both encoders of every side: `dev_spearman` (bi), `cross_dev_spearman`, `partner_...`."""
        metrics, main_scores = {}, None
        frame, dtype = self.data.split(split), scoring_dtype(self.cfg.eval_precision, self.dtype)
        for side in self.sides:
            evaluator = STSEvaluator({split: frame})
            bi = evaluator.evaluate(side.postprocess.embedder(), split)
            cross, _ = score_split(side.cross, side.cross_tokens, frame, split, self.device, dtype)
            metrics.update({f"{side.prefix}{k}": v for k, v in bi.items()})
            metrics.update({f"{side.prefix}cross_{k}": v for k, v in cross.items()})
            main_scores = evaluator.last_scores[split] if main_scores is None else main_scores
        return metrics, main_scores

    def save_extra(self, folder: Path) -> None:
        self.history.to_csv(folder / PSEUDO_LABELS, index=False)

    def load_extra(self, folder: Path) -> None:
        self.history = pd.read_csv(folder / PSEUDO_LABELS)

    def sentence_model(self):
        return self.sides[0].bi, self.sides[0].bi_tokens.tokenizer, self.cfg.bi_max_seq_length

    def postprocess_map(self):
        return self.sides[0].postprocess()
