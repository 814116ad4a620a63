"""The `cross_encoder` kind's learner: one epoch of joined pairs per round."""

from __future__ import annotations

import math

import numpy as np
import torch

from trainables.data.tasks import load_sts_task
from trainables.errors import one_of
from trainables.kinds.cross_encoder import CrossEncoderConfig
from trainables.models.encoder import load_tokenizer, used_parameter_count
from trainables.runtime import linear_schedule, scoring_dtype
from trainables.stages.pretrain import pretrained_start
from trainables.training.bi_encoder import build_optimizer, epoch_batches
from trainables.training.cross_encoder import CROSS_LOSSES, CrossEncoder, PairTokens, score_split, train_cross_epoch
from trainables.training.learner import OneModelLearner


class CrossEncoderLearner(OneModelLearner):
    metric = "dev_spearman"

    def __init__(self, cfg: CrossEncoderConfig, device, dtype):
        if cfg.loss not in CROSS_LOSSES:
            raise one_of("loss", cfg.loss, CROSS_LOSSES)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.data = load_sts_task(cfg.task, cfg.language, cfg.data_dir, "the cross-encoder", cfg.max_train_samples,
                                  cfg.max_eval_samples)
        start, stage = pretrained_start(cfg, cfg.pooling)
        self.model = CrossEncoder(start, cfg.layer, cfg.pooling, cfg.dropout_masks, cfg.head).to(device)
        self.tokens = PairTokens(load_tokenizer(start), cfg.max_seq_length)
        self.token_lists = self.tokens.lookup(list(self.data.train["sentence1"]), list(self.data.train["sentence2"]))
        self.targets = torch.as_tensor(self.data.train["score"].to_numpy(dtype=np.float32).copy())
        self.optimizer = build_optimizer(list(self.model.named_parameters()), cfg.lr, cfg.weight_decay)
        total = math.ceil(len(self.token_lists) / cfg.batch_size) * cfg.epochs
        self.scheduler = linear_schedule(self.optimizer, round(cfg.warmup_ratio * total), total)
        self.test_frame = self.data.test
        self.info = {"params": used_parameter_count(self.model), **stage}

    def train_round(self, round_: int) -> dict[str, float]:
        cfg = self.cfg
        batches = epoch_batches([len(t) for t in self.token_lists], cfg.batch_size, cfg.seed * 1_000 + round_,
                                cfg.group_by_length)
        loss = train_cross_epoch(self.model, self.optimizer, self.scheduler, self.token_lists, self.targets, batches,
                                 cfg.loss, self.tokens.pad_id, self.device, self.dtype, cfg.max_grad_norm,
                                 f"epoch {round_}")
        return {"train_loss": loss}

    def evaluate(self, split: str):
        return score_split(self.model, self.tokens, self.data.split(split), split, self.device,
                           scoring_dtype(self.cfg.eval_precision, self.dtype))
