"""The `contrastive` kind's learner: `eval_every` SimCSE / miCSE steps per round."""

from __future__ import annotations

import torch

from trainables.data.tasks import corpus_sentences, load_sts_task
from trainables.errors import UserInputError, one_of
from trainables.evaluation.evaluators import Embedder, make_evaluator
from trainables.evaluation.postprocess import FittedOnTrain
from trainables.evaluation.sts_suite import load_suite, score_suite, suite_metrics
from trainables.kinds.contrastive import (
    MODEL_MAX_LENGTH,
    ContrastiveConfig,
    resolve_attention_layers,
)
from trainables.models.attention import INFERENCE as INFERENCE_ATTENTION
from trainables.models.batching import TokenCache
from trainables.models.dropout import ATTENTION as FAST_ATTENTION
from trainables.models.encoder import (
    build_sentence_encoder,
    encoder_depth,
    load_tokenizer,
    special_ids,
    used_parameter_count,
)
from trainables.models.lora import adapter_parameter_count, add_lora
from trainables.names import ATTENTION_LOSSES
from trainables.objectives.contrastive import ContrastiveModel, contrastive_step, step_batches
from trainables.runtime import linear_schedule, optimizer_step, scoring_dtype
from trainables.stages.pretrain import pretrained_start
from trainables.training.bi_encoder import build_optimizer, check_finite
from trainables.training.learner import OneModelLearner


def evaluation_length(cfg: ContrastiveConfig, tokenizer) -> int:
    if cfg.eval_max_seq_length is not None:
        return cfg.eval_max_seq_length
    return min(MODEL_MAX_LENGTH, int(getattr(tokenizer, "model_max_length", MODEL_MAX_LENGTH)))


def uses_eager_attention(aligns_attention: bool, implementation: str, device: torch.device) -> bool:
    """Whether training runs eager attention, so that SimCSE and miCSE of one seed draw the same
    dropout masks (a paired comparison). miCSE needs the attention probabilities, which fused kernels
    do not return: with `dropout_masks: fast` the fast attention function returns them (both methods
    keep it); with `torch` masks miCSE runs eager attention, and on the CPU SimCSE's SDPA draws the
    same Bernoulli masks through its math path, but CUDA's fused kernels draw their own, so there
    SimCSE runs eager attention too."""
    if implementation == FAST_ATTENTION:
        return False
    return aligns_attention or (device.type != "cpu" and implementation in ("sdpa", INFERENCE_ATTENTION))


POSTPROCESS_FIT = 20_000  # corpus sentences a `postprocess` map is fitted on, at most (a wiki1m corpus is 1M)


def fit_sample(sentences: list[str]) -> list[str]:
    """The corpus sentences `postprocess` is fitted on: all of them up to POSTPROCESS_FIT, else a fixed random
    subset of that many (the same in every trial and at every evaluation), so a refit costs a bounded pass."""
    distinct = list(dict.fromkeys(sentences))
    if len(distinct) <= POSTPROCESS_FIT:
        return distinct
    keep = torch.randperm(len(distinct), generator=torch.Generator().manual_seed(0))[:POSTPROCESS_FIT]
    return [distinct[i] for i in sorted(keep.tolist())]


class ContrastiveLearner(OneModelLearner):
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
        start, stage = pretrained_start(cfg, cfg.pooling)  # model, or model adapted first (LLM2Vec: mntp)
        tokenizer = load_tokenizer(start, cfg.append_eos)
        self.tokens = TokenCache(tokenizer, cfg.max_seq_length, cfg.prompt)
        self.tokens.add(sentences)
        self.eval_tokens = TokenCache(tokenizer, evaluation_length(cfg, tokenizer), cfg.prompt)
        encoder = build_sentence_encoder(start, cfg.layer, cfg.pooling, seed=cfg.seed,
                                         dropout_masks=cfg.dropout_masks,
                                         prompt_tokens=0 if cfg.include_prompt else self.tokens.prompt_length,
                                         pooling_layers=cfg.pooling_layers, bidirectional=cfg.bidirectional,
                                         skipped_ids=None if cfg.pool_special_tokens else special_ids(tokenizer))
        if cfg.lora_rank is not None:  # after the cut: adapters on the blocks kept, the encoder's weights frozen
            add_lora(encoder.encoder, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
        self.attention_layers = resolve_attention_layers(cfg.method, cfg.attention_layers,
                                                         encoder_depth(encoder.encoder.config))
        if uses_eager_attention(bool(self.attention_layers), encoder.encoder.config._attn_implementation, device):
            encoder.encoder.set_attn_implementation("eager")
        self.model = ContrastiveModel(encoder, cfg.mlp_head).to(device)
        self.evaluator = make_evaluator("sts", {"dev": self.data.dev, "test": self.data.test})
        self.embed = Embedder(self.model.sentence_encoder, self.eval_tokens, device,  # the head: training only
                              scoring_dtype(cfg.eval_precision, dtype))
        self.postprocess = FittedOnTrain(cfg.postprocess, cfg.postprocess_dim, self.model.sentence_encoder,
                                         self.embed, fit_sample(sentences))  # the corpus it trains on
        batch_size = min(cfg.batch_size, len(sentences))
        self.batches = step_batches(len(sentences), batch_size, cfg.seed, cfg.steps)
        trained = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]  # LoRA: adapters, head
        self.optimizer = build_optimizer(trained, cfg.lr, cfg.weight_decay)
        self.scheduler = linear_schedule(self.optimizer, round(cfg.warmup_ratio * cfg.steps), cfg.steps)
        self.test_frame = self.data.test
        self.info = {"params": used_parameter_count(self.model.sentence_encoder)
                     - adapter_parameter_count(self.model.sentence_encoder), "corpus_sentences": len(sentences),
                     "transductive": int(cfg.transductive), **stage}
        if cfg.lora_rank is not None:  # the encoder's size is the merged one's; what trained, beside it
            self.info["trained_params"] = sum(p.numel() for _, p in trained)

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
            optimizer_step(self.model.parameters(), self.optimizer, self.scheduler, cfg.max_grad_norm)
            losses.append(loss.item())
            for name, value in parts.items():
                parts_sum[name] = parts_sum.get(name, 0.0) + value.item()
        return {"train_loss": sum(losses) / len(losses), "step": last,
                **{k: v / len(losses) for k, v in parts_sum.items()}}

    def evaluate(self, split: str):
        metrics = self.evaluator.evaluate(self.postprocess.embedder(), split)
        return metrics, self.evaluator.last_scores[split]

    def postprocess_map(self):
        return self.postprocess()

    def test_extras(self) -> dict[str, float]:
        if not self.cfg.suite:
            return {}
        frames = load_suite("sts", self.cfg.data_dir, self.cfg.max_eval_samples)
        return suite_metrics(score_suite(self.postprocess.embedder(), frames))

    def sentence_model(self):
        return self.model.sentence_encoder, self.tokens.tokenizer, self.eval_tokens.max_length
