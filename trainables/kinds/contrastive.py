"""`contrastive`: unsupervised SimCSE and miCSE on a (truncated) encoder (see
`trainables.contrastive_objectives`). A round is `eval_every` optimizer steps, so ASHA can act
between rounds. Training truncates sentences at `max_seq_length` (SimCSE: 32); dev, test and the
STS suite are encoded untruncated (up to the model's limit), as SimCSE evaluates, unless
`eval_max_seq_length` says otherwise. With `suite: true` the STS suite is scored once with test.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import nn

from trainables.batching import TokenCache
from trainables.bi_encoder import build_optimizer, check_finite
from trainables.contract import TrainingConfig
from trainables.contrastive_objectives import (
    ATTENTION_LOSSES,
    METHODS,
    ContrastiveModel,
    contrastive_step,
    resolve_attention_layers,
    step_batches,
)
from trainables.data import corpus_sentences, load_sts_task
from trainables.errors import UserInputError, one_of
from trainables.evaluation import Embedder, make_evaluator
from trainables.kinds.base import Learner, TrainingKind
from trainables.models import POOLINGS, build_sentence_encoder, count_parameters, encoder_depth, load_tokenizer
from trainables.runtime import linear_schedule, scoring_dtype
from trainables.sts_suite import load_suite, score_suite, suite_metrics

MODEL_MAX_LENGTH = 512


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
    attention_loss: str = Field("mi", description="micse: mi (the reference's negative Gaussian mutual information "
                                                  "on sampled entries) or correlation (1 - rho, this project's "
                                                  "earlier variant)")
    attention_weight: float = Field(5e-4, ge=0, description="micse: weight of the attention term (the reference's "
                                                            "runs use 1e-4 to 5e-4)")
    attention_layers: list[int] | None = Field(None, description="micse: kept layers (1-based) whose attention is "
                                                                 "aligned; null is the reference's k-4..k-1")
    lr: float = Field(3e-5, gt=0)
    steps: int = Field(250, ge=1, description="optimizer steps")
    eval_every: int = Field(125, ge=1, description="score dev and report every this many steps")
    batch_size: int = Field(64, ge=2)
    max_seq_length: int = Field(32, ge=2, description="training truncation")
    eval_max_seq_length: int | None = Field(None, ge=2, description="evaluation truncation; null is the model's "
                                                                    f"limit (at most {MODEL_MAX_LENGTH})")
    warmup_ratio: float = Field(0.0, ge=0, le=1)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    suite: bool = Field(False, description="also score the STS suite (STS12-16, STS-B, SICK-R) at the end")
    transductive: bool = Field(False, description="allow test sentences in the corpus (recorded on the run)")
    max_train_samples: int | None = Field(None, ge=1, description="at most this many corpus sentences")

    def num_reports(self) -> int:
        return math.ceil(self.steps / self.eval_every)


def evaluation_length(cfg: ContrastiveConfig, tokenizer) -> int:
    if cfg.eval_max_seq_length is not None:
        return cfg.eval_max_seq_length
    return min(MODEL_MAX_LENGTH, int(getattr(tokenizer, "model_max_length", MODEL_MAX_LENGTH)))


class ContrastiveLearner(Learner):
    metric = "dev_spearman"

    def __init__(self, cfg: ContrastiveConfig, device, dtype):
        if cfg.attention_loss not in ATTENTION_LOSSES:
            raise one_of("attention_loss", cfg.attention_loss, ATTENTION_LOSSES)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.data = load_sts_task(cfg.task, cfg.language, cfg.data_dir, "contrastive",
                                  max_eval_samples=cfg.max_eval_samples)
        sentences = corpus_sentences(cfg.corpus, cfg.task, cfg.language, cfg.data_dir, cfg.transductive, key="corpus")
        if cfg.max_train_samples is not None and cfg.max_train_samples < len(sentences):
            keep = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(0))[: cfg.max_train_samples]
            sentences = [sentences[i] for i in sorted(keep.tolist())]
        if len(sentences) < 2:
            raise UserInputError("corpus", cfg.corpus, "the corpus has fewer than 2 sentences")
        self.sentences = sentences
        encoder = build_sentence_encoder(cfg.model, cfg.layer, cfg.pooling, seed=cfg.seed)
        self.attention_layers = resolve_attention_layers(cfg.method, cfg.attention_layers,
                                                         encoder_depth(encoder.encoder.config))
        if self.attention_layers:
            encoder.encoder.set_attn_implementation("eager")  # fused attention kernels return no probabilities
        self.model = ContrastiveModel(encoder, cfg.mlp_head).to(device)
        tokenizer = load_tokenizer(cfg.model)
        self.tokens = TokenCache(tokenizer, cfg.max_seq_length)
        self.tokens.add(sentences)
        self.eval_tokens = TokenCache(tokenizer, evaluation_length(cfg, tokenizer))
        self.evaluator = make_evaluator("sts", {"dev": self.data.dev, "test": self.data.test})
        self.embed = Embedder(self.model.sentence_encoder, self.eval_tokens, device,  # the head: training only
                              scoring_dtype(cfg.eval_precision, dtype))
        batch_size = min(cfg.batch_size, len(sentences))
        self.batches = step_batches(len(sentences), batch_size, cfg.seed, cfg.steps)
        self.optimizer = build_optimizer(list(self.model.named_parameters()), cfg.lr, cfg.weight_decay)
        self.scheduler = linear_schedule(self.optimizer, round(cfg.warmup_ratio * cfg.steps), cfg.steps)
        self.test_frame = self.data.test
        self.info = {"params": count_parameters(self.model.sentence_encoder), "corpus_sentences": len(sentences),
                     "transductive": int(cfg.transductive)}

    def modules(self):
        return {"model": self.model}

    def optimizers(self):
        return [(self.optimizer, self.scheduler)]

    def train_round(self, round_: int) -> dict[str, float]:
        cfg = self.cfg
        losses, parts_sum = [], {}
        self.model.train()
        first, last = (round_ - 1) * cfg.eval_every, min(cfg.steps, round_ * cfg.eval_every)
        for step in range(first, last):
            torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout stream per step: resumes reproduce it
            batch = self.batches[step]
            loss, parts = contrastive_step(self.model, [self.tokens[self.sentences[i]] for i in batch],
                                           self.tokens.pad_id, self.device, self.dtype, cfg.temperature,
                                           self.attention_layers, cfg.attention_weight, cfg.attention_loss)
            check_finite(loss.item(), f"step {step + 1} (lr={cfg.lr})",
                         "lower the learning rate or raise the temperature")
            loss.backward()
            if cfg.max_grad_norm:
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            for name, value in parts.items():
                parts_sum[name] = parts_sum.get(name, 0.0) + value.item()
        return {"train_loss": sum(losses) / len(losses), "step": last,
                **{k: v / len(losses) for k, v in parts_sum.items()}}

    def evaluate(self, split: str):
        metrics = self.evaluator.evaluate(self.embed, split)
        return metrics, self.evaluator.last_scores[split]

    def test_extras(self) -> dict[str, float]:
        if not self.cfg.suite:
            return {}
        frames = load_suite("sts", self.cfg.data_dir, self.cfg.max_eval_samples)
        return suite_metrics(score_suite(self.embed, frames))

    def sentence_model(self):
        return self.model.sentence_encoder, self.tokens.tokenizer, self.eval_tokens.max_length


class ContrastiveKind(TrainingKind):
    example = {"layer": 2, "steps": 6, "eval_every": 2, "batch_size": 16, "corpus": "task",
               "max_train_samples": 120, "method": "micse", "pooling": "mean"}  # a random tiny BERT's CLS is collapsed
    Config = ContrastiveConfig
    exports_models = True
    round_name = "round"

    names = {"pooling": POOLINGS, "attention_loss": ATTENTION_LOSSES, "method": METHODS}

    def build(self, cfg, device, dtype) -> Learner:
        return ContrastiveLearner(cfg, device, dtype)

    def check_names(self, cfg, key_of) -> None:
        from trainables.models import load_config

        super().check_names(cfg, key_of)
        kept = cfg.layer if cfg.layer is not None else encoder_depth(load_config(cfg.model))
        try:
            resolve_attention_layers(cfg.method, cfg.attention_layers, kept)
        except UserInputError as exc:
            raise UserInputError(key_of(exc.key), exc.value, exc.fix) from None
