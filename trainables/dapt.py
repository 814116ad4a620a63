"""The `dapt` trainable: domain-adaptive pretraining, then truncated fine-tuning from the adapted
weights.

Stage 1 continues pretraining the encoder on unlabeled text: masked language modelling
(transformers' MLM collator, 15 % masking; the prediction head is tied to the input
embeddings, freshly initialized when the checkpoint has none), or for ELECTRA discriminators
replaced-token detection (a small generator, sharing the discriminator's embeddings, fills
the masked positions with sampled tokens; the discriminator learns which tokens were replaced). Warmup and decay count
optimizer steps, not micro-batches. The adapted encoder is a cached stage: one pretraining per
distinct stage configuration, however many trials use it. Stage 2 is `finetune`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from pydantic import Field
from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

from trainables import finetune
from trainables.batching import tokenize
from trainables.contract import Report, parse_config
from trainables.data import corpus_sentences
from trainables.errors import TrainingDivergedError, UserInputError
from trainables.finetune import FinetuneConfig
from trainables.models import load_config, load_tokenizer, resolve_model_path
from trainables.runtime import resolve_device, seed_everything
from trainables.stages import get_or_build

DAPT_FIELDS = ("dapt_corpus", "dapt_objective", "dapt_steps", "dapt_lr", "dapt_batch_size", "dapt_grad_accum",
               "dapt_warmup_ratio", "dapt_max_seq_length", "dapt_mlm_probability", "dapt_seed", "dapt_generator",
               "dapt_rtd_weight")
OBJECTIVES = ("mlm", "rtd", "simcse", "micse")


class DaptConfig(FinetuneConfig):
    dapt_corpus: str = Field("unlabeled_en", description="unlabeled_en, task (the task's train sentences), "
                                                         "task+dev, or a path to a text file (one sentence a line)")
    dapt_objective: str = Field("mlm", description="mlm (any encoder), rtd (ELECTRA discriminators), or the "
                                                   "unsupervised contrastive simcse / micse (with this pooling)")
    dapt_generator: str | None = Field(None, description="rtd: a generator hub id or folder; default a fresh "
                                                         "generator a quarter of the discriminator's width")
    dapt_rtd_weight: float = Field(50.0, gt=0, description="rtd: weight of the discriminator loss (ELECTRA: 50)")
    dapt_steps: int = Field(200, ge=0, description="optimizer steps; 0 skips adaptation (plain fine-tuning), "
                                                   "so `ablate: {dapt_steps: [0, 200]}` compares the two")
    dapt_lr: float = Field(5e-5, gt=0)
    dapt_batch_size: int = Field(32, ge=1)
    dapt_grad_accum: int = Field(1, ge=1)
    dapt_warmup_ratio: float = Field(0.1, ge=0, le=1)
    dapt_max_seq_length: int = Field(128, ge=8)
    dapt_mlm_probability: float = Field(0.15, gt=0, lt=1)
    dapt_seed: int = 0
    transductive: bool = Field(False, description="allow test sentences in the corpus (recorded on the run)")
    cache_dir: str | None = None


def dapt_corpus(cfg: DaptConfig) -> list[str]:
    return corpus_sentences(cfg.dapt_corpus, cfg.task, cfg.language, cfg.data_dir, cfg.transductive, "dapt_corpus")


def dapt_schedule(optimizer: torch.optim.Optimizer, steps: int, warmup_ratio: float):
    """Linear warmup then linear decay, both counted in optimizer steps (the reference code
    counted micro-batches, so most of its training was warmup)."""
    return get_linear_schedule_with_warmup(optimizer, round(warmup_ratio * steps), steps)


class MLMObjective(torch.nn.Module):
    """Masked language modelling with the encoder's MLM head."""

    def __init__(self, cfg: DaptConfig):
        super().__init__()
        self.model = AutoModelForMaskedLM.from_pretrained(resolve_model_path(cfg.model))

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(**batch).loss

    def encoder(self):
        return self.model.base_model


class RTDObjective(torch.nn.Module):
    """ELECTRA's replaced-token detection: generator MLM loss + weight x discriminator BCE."""

    def __init__(self, cfg: DaptConfig):
        super().__init__()
        from transformers import AutoConfig, ElectraForMaskedLM, ElectraForPreTraining

        if load_config(cfg.model).model_type != "electra":
            raise UserInputError("dapt_objective", "rtd", "replaced-token detection needs an ELECTRA "
                                                          "discriminator; use mlm for this model")
        self.discriminator = ElectraForPreTraining.from_pretrained(resolve_model_path(cfg.model))
        if cfg.dapt_generator:
            self.generator = ElectraForMaskedLM.from_pretrained(resolve_model_path(cfg.dapt_generator))
        else:
            config = AutoConfig.from_pretrained(resolve_model_path(cfg.model))
            config.hidden_size = max(config.num_attention_heads, config.hidden_size // 4)
            config.intermediate_size = max(4, config.intermediate_size // 4)
            self.generator = ElectraForMaskedLM(config)
        self.generator.electra.embeddings = self.discriminator.electra.embeddings  # shared, as in ELECTRA
        self.weight = cfg.dapt_rtd_weight

    def forward(self, batch: dict) -> torch.Tensor:
        labels = batch["labels"]
        masked = labels != -100
        generated = self.generator(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   labels=labels)
        with torch.no_grad():
            sampled = torch.distributions.Categorical(logits=generated.logits[masked].float()).sample()
        replaced_input = batch["input_ids"].clone()
        replaced_input[masked] = sampled
        original = torch.where(masked, labels, batch["input_ids"])
        is_replaced = (replaced_input != original).float()
        logits = self.discriminator(input_ids=replaced_input, attention_mask=batch["attention_mask"]).logits
        active = batch["attention_mask"].bool()
        detection = torch.nn.functional.binary_cross_entropy_with_logits(logits[active], is_replaced[active])
        return generated.loss + self.weight * detection

    def encoder(self):
        return self.discriminator.electra


def pretrain(cfg: DaptConfig, sentences: list[str], folder: Path) -> dict:
    """Continue pretraining with the configured objective; save the encoder (safetensors) and the
    tokenizer to `folder`."""
    seed_everything(cfg.dapt_seed)
    device = resolve_device(cfg.device)
    tokenizer = load_tokenizer(cfg.model)
    objective = (RTDObjective(cfg) if cfg.dapt_objective == "rtd" else MLMObjective(cfg)).to(device).train()
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=cfg.dapt_mlm_probability)
    encoded = tokenize(tokenizer, sentences, cfg.dapt_max_seq_length)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=cfg.dapt_lr, weight_decay=0.01)
    scheduler = dapt_schedule(optimizer, cfg.dapt_steps, cfg.dapt_warmup_ratio)
    generator = torch.Generator().manual_seed(cfg.dapt_seed)
    order: list[int] = []
    losses, started = [], time.perf_counter()
    for step in range(cfg.dapt_steps):
        step_loss = 0.0
        for _ in range(cfg.dapt_grad_accum):
            if len(order) < cfg.dapt_batch_size:
                order += torch.randperm(len(encoded), generator=generator).tolist()
            batch_ids, order = order[: cfg.dapt_batch_size], order[cfg.dapt_batch_size:]
            batch = collator([{"input_ids": encoded[i]} for i in batch_ids])
            loss = objective({k: v.to(device) for k, v in batch.items()}) / cfg.dapt_grad_accum
            if not torch.isfinite(loss):
                raise TrainingDivergedError(f"DAPT loss became {loss.item()} at step {step + 1} "
                                            f"(dapt_lr={cfg.dapt_lr}); lower dapt_lr")
            loss.backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
    objective.encoder().save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return {"loss_curve": losses, "corpus_sentences": len(sentences), "seconds": time.perf_counter() - started,
            "first_loss": float(sum(losses[:10]) / max(1, len(losses[:10]))),
            "last_loss": float(sum(losses[-10:]) / max(1, len(losses[-10:])))}


def contrastive_pretrain(cfg: DaptConfig, folder: Path) -> dict:
    """An unsupervised SimCSE / miCSE stage on the whole encoder, with the study's pooling; the
    task's dev split picks the best of four evaluation points. Saves the encoder and tokenizer."""
    from trainables.contract import collect
    from trainables.contrastive import ContrastiveConfig, train

    stage = ContrastiveConfig(
        model=cfg.model, method=cfg.dapt_objective, task=cfg.task, language=cfg.language, corpus=cfg.dapt_corpus,
        pooling=cfg.pooling, lr=cfg.dapt_lr, steps=cfg.dapt_steps, eval_every=max(1, math.ceil(cfg.dapt_steps / 4)),
        batch_size=cfg.dapt_batch_size, max_seq_length=cfg.dapt_max_seq_length, warmup_ratio=cfg.dapt_warmup_ratio,
        score_test=False, transductive=cfg.transductive, seed=cfg.dapt_seed, precision=cfg.precision,
        device=cfg.device, data_dir=cfg.data_dir, max_eval_samples=cfg.max_eval_samples)
    started, curve = time.perf_counter(), []
    model, last = train(stage, collect(curve))
    model.sentence_encoder.encoder.save_pretrained(folder, safe_serialization=True)
    load_tokenizer(cfg.model).save_pretrained(folder)
    return {"loss_curve": [m["train_loss"] for m in curve], "corpus_sentences": last["corpus_sentences"],
            "seconds": time.perf_counter() - started, "first_loss": curve[0]["train_loss"],
            "last_loss": curve[-1]["train_loss"], "stage_dev_spearman": last["best_dev_spearman"],
            "stage_best_step": last["best_step"]}


def adapt(cfg: DaptConfig) -> tuple[Path, dict, bool]:
    """The adapted encoder for this stage configuration, from the cache or built now."""
    if cfg.dapt_objective not in OBJECTIVES:
        raise UserInputError("dapt_objective", cfg.dapt_objective, "use mlm (any encoder), rtd (ELECTRA), "
                                                                   "simcse or micse")
    contrastive = cfg.dapt_objective in ("simcse", "micse")
    if contrastive and cfg.dapt_grad_accum != 1:
        raise UserInputError("dapt_grad_accum", cfg.dapt_grad_accum, "contrastive objectives take their negatives "
                                                                     "from the batch: use 1 and a larger batch")
    params = {"model": cfg.model, "corpus": cfg.dapt_corpus, "task": cfg.task if cfg.dapt_corpus.startswith("task")
              or contrastive else None, "language": cfg.language, "transductive": cfg.transductive,
              **{k: getattr(cfg, k) for k in DAPT_FIELDS}, **({"pooling": cfg.pooling} if contrastive else {})}
    build = (lambda folder: contrastive_pretrain(cfg, folder)) if contrastive else \
        (lambda folder: pretrain(cfg, dapt_corpus(cfg), folder))
    return get_or_build(cfg.cache_dir, "dapt", params, build)


def run(config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
    """Adapt (or reuse the cached adaptation), then fine-tune from the adapted weights."""
    cfg = parse_config(DaptConfig, config)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    finetune_config = {k: v for k, v in cfg.model_dump().items() if k in FinetuneConfig.model_fields}
    if cfg.dapt_steps == 0:  # the baseline of a DAPT ablation: the same fine-tuning, no adaptation
        return finetune.run(finetune_config, report, checkpoint_dir)
    folder, stage, built = adapt(cfg)
    stage_info = {"dapt_cache_key": stage["key"], "dapt_cache_hit": int(not built), "dapt_stage_dir": str(folder),
                  "dapt_first_loss": stage["first_loss"], "dapt_last_loss": stage["last_loss"],
                  "transductive": int(cfg.transductive)}
    if not math.isfinite(stage["last_loss"]):
        raise TrainingDivergedError("the cached DAPT stage ended with a non-finite loss")

    def with_stage(metrics: dict, checkpoint_dir: str | None = None) -> None:
        report({**metrics, **stage_info}, checkpoint_dir=checkpoint_dir)

    return {**finetune.run({**finetune_config, "model": str(folder)}, with_stage, checkpoint_dir), **stage_info}
