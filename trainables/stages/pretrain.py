"""The `dapt` stage: domain-adaptive pretraining that any kind with `pretrain:` fields may use.

Objectives: masked language modelling (transformers' MLM collator, 15 % masking; the prediction
head tied to the input embeddings, fresh when the checkpoint has none), ELECTRA's replaced-token
detection (a small generator whose embeddings *and* output layer are the discriminator's shared
embedding table fills masked positions with sampled tokens; the discriminator learns which were
replaced), and the unsupervised contrastive SimCSE / miCSE (the `contrastive` kind run as a stage).
Warmup and decay count optimizer steps, not micro-batches. The adapted encoder is cached under the
study's storage, keyed by everything that determines it, its own seed included: with
`stage_seed: per_seed` (the default) each replicate seed builds its own stage, so the spread over
seeds covers the whole procedure; `shared` builds one (seed `pretrain_seed`) for every trial.
"""

from __future__ import annotations

import copy
import importlib
import math
import time
from pathlib import Path

import torch

from trainables.data.tasks import corpus_sentences
from trainables.errors import TrainingDivergedError, UserInputError
from trainables.models.architectures import attend_both_ways, native_bidirectional
from trainables.models.batching import tokenize
from trainables.models.encoder import load_config, load_tokenizer, resolve_model_path
from trainables.runtime import (
    linear_schedule,
    optimizer_step,
    resolve_device,
    seed_everything,
    without_cudnn_attention,
)
from trainables.stages import get_or_build
from trainables.stages.fields import (  # noqa: F401 (re-exported)
    OBJECTIVES,
    STAGE_FIELDS,
    STAGE_SEEDS,
    PretrainFields,
    check_pretrain,
    stage_params,
    stage_seed_of,
    uses_stage,
)


def schedule(optimizer: torch.optim.Optimizer, steps: int, warmup_ratio: float):
    """Linear warmup then linear decay, both counted in optimizer steps (the reference code
    counted micro-batches, so most of its training was warmup)."""
    return linear_schedule(optimizer, round(warmup_ratio * steps), steps)


class MLMObjective(torch.nn.Module):
    """Masked language modelling with the encoder's MLM head."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import AutoModelForMaskedLM

        self.model = AutoModelForMaskedLM.from_pretrained(resolve_model_path(cfg.model), trust_remote_code=False)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(**batch).loss

    def encoder(self):
        return self.model.base_model


class RTDObjective(torch.nn.Module):
    """ELECTRA's replaced-token detection: generator MLM loss + weight x discriminator BCE. The
    generator reads and writes through the discriminator's embedding table, as ELECTRA does."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import AutoConfig, ElectraForMaskedLM, ElectraForPreTraining

        if load_config(cfg.model).model_type != "electra":
            raise UserInputError("pretrain", "rtd", "replaced-token detection needs an ELECTRA discriminator; "
                                                    "use mlm for this model")
        self.discriminator = ElectraForPreTraining.from_pretrained(resolve_model_path(cfg.model))
        if cfg.pretrain_generator:
            self.generator = ElectraForMaskedLM.from_pretrained(resolve_model_path(cfg.pretrain_generator))
        else:
            config = AutoConfig.from_pretrained(resolve_model_path(cfg.model), trust_remote_code=False)
            config.hidden_size = max(config.num_attention_heads, config.hidden_size // 4)
            config.intermediate_size = max(4, config.intermediate_size // 4)
            self.generator = ElectraForMaskedLM(config)
        shared = self.discriminator.electra.embeddings
        self.generator.electra.embeddings = shared
        self.generator.generator_lm_head.weight = shared.word_embeddings.weight  # tied output layer
        self.weight = cfg.pretrain_rtd_weight

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


class MNTPObjective(torch.nn.Module):
    """LLM2Vec's masked next-token prediction (McGill-NLP/llm2vec `experiments/run_mntp.py`, its `*BiForMNTP`
    models): a causal decoder made to attend both ways (`attend_both_ways`, or the model's own switch), its input
    masked as for MLM, and each masked token predicted by the causal LM head at the position before it (the head's
    shifted loss on the MLM labels). The whole model trains (LLM2Vec trains LoRA adapters, r = 16)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import AutoModelForCausalLM

        config = load_config(cfg.model)  # an encoder, or no bidirectional: refused by `check_pretrain` already
        native = native_bidirectional(config)
        self.switches = {k: getattr(config, k) for k in ("is_causal", "use_bidirectional_attention")
                         if hasattr(config, k)}  # the model's own, saved with the adapted weights
        if native:
            config = type(config).from_dict({**config.to_dict(), "use_bidirectional_attention": True})
        self.model = AutoModelForCausalLM.from_pretrained(resolve_model_path(cfg.model), config=config,
                                                          trust_remote_code=False)
        if not native:
            attend_both_ways(self.model)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(**batch).loss

    def encoder(self):
        """The base model (its LM head left behind), its config saying what the model's own said: a trial's
        `bidirectional: true` turns the adapted model both ways, as it did the model the stage started from."""
        base = self.model.base_model
        for key in ("is_causal", "use_bidirectional_attention"):
            if key in self.switches:
                setattr(base.config, key, self.switches[key])
            elif hasattr(base.config, key):
                delattr(base.config, key)
        return base


BLANK = "_"  # LLM2Vec's `mask_token_type: blank`, its default: a decoder's tokenizer has no mask token


def with_mask_token(tokenizer, objective: str):
    """The tokenizer as the collator masks with it: mntp gives a decoder's tokenizer LLM2Vec's blank `_` (its
    own token where the vocabulary has one, else EOS, LLM2Vec's `eos` option); the others keep theirs."""
    if objective != "mntp" or tokenizer.mask_token is not None:
        return tokenizer
    blank = tokenizer.convert_tokens_to_ids(BLANK)
    tokenizer.mask_token = BLANK if blank is not None and blank != tokenizer.unk_token_id else tokenizer.eos_token
    return tokenizer


def pretrain(cfg, seed: int, sentences: list[str], folder: Path) -> dict:
    """Continue pretraining with MLM, RTD or MNTP; save the encoder (safetensors) and tokenizer to `folder`."""
    seed_everything(seed)
    device = resolve_device(cfg.device)
    without_cudnn_attention(device)
    tokenizer = load_tokenizer(cfg.model)  # saved with the stage as it is: the mask is the collator's alone
    objectives = {"rtd": RTDObjective, "mntp": MNTPObjective}
    objective = objectives.get(cfg.pretrain, MLMObjective)(cfg).to(device).train()
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(with_mask_token(copy.deepcopy(tokenizer), cfg.pretrain),
                                               mlm_probability=cfg.pretrain_mlm_probability)
    encoded = tokenize(tokenizer, sentences, cfg.pretrain_max_seq_length)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=cfg.pretrain_lr, weight_decay=0.01)
    scheduler = schedule(optimizer, cfg.pretrain_steps, cfg.pretrain_warmup_ratio)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses, started = [], time.perf_counter()
    for step in range(cfg.pretrain_steps):
        step_loss = 0.0
        for _ in range(cfg.pretrain_grad_accum):
            if len(order) < cfg.pretrain_batch_size:
                order += torch.randperm(len(encoded), generator=generator).tolist()
            batch_ids, order = order[: cfg.pretrain_batch_size], order[cfg.pretrain_batch_size:]
            batch = collator([{"input_ids": encoded[i]} for i in batch_ids])
            loss = objective({k: v.to(device) for k, v in batch.items()}) / cfg.pretrain_grad_accum
            if not torch.isfinite(loss):
                raise TrainingDivergedError(f"DAPT loss became {loss.item()} at step {step + 1} "
                                            f"(pretrain_lr={cfg.pretrain_lr}); lower pretrain_lr")
            loss.backward()
            step_loss += loss.item()
        optimizer_step(objective.parameters(), optimizer, scheduler, 1.0)
        losses.append(step_loss)
    objective.encoder().save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return {"loss_curve": losses, "corpus_sentences": len(sentences), "seconds": time.perf_counter() - started,
            "first_loss": float(sum(losses[:10]) / max(1, len(losses[:10]))),
            "last_loss": float(sum(losses[-10:]) / max(1, len(losses[-10:])))}


# SimCSE / miCSE are the `contrastive` kind run as a stage: that code lives with the kind
# (`trainables/kinds/contrastive/stage.py`), named here by its path as `PILOTS` names the pilots, so
# that no module of stages/ imports the kinds above it
CONTRASTIVE_STAGE = "trainables.kinds.contrastive.stage:contrastive_pretrain"


def contrastive_pretrain(cfg, seed: int, pooling: str, folder: Path) -> dict:
    """The contrastive kind's stage (`CONTRASTIVE_STAGE`), imported when a stage of it is built."""
    module, function = CONTRASTIVE_STAGE.split(":")
    return getattr(importlib.import_module(module), function)(cfg, seed, pooling, folder)


def pilot_stage_step(cfg, steps: int = 3) -> float:
    """Seconds per optimizer step of this stage, from a few steps into a scratch folder (the
    estimate's pilot; the cache is not touched)."""
    import tempfile

    short = cfg.model_copy(update={"pretrain_steps": steps})
    with tempfile.TemporaryDirectory(prefix="stage-pilot-") as folder:
        started = time.perf_counter()
        if cfg.pretrain in ("simcse", "micse"):
            contrastive_pretrain(short, stage_seed_of(cfg), getattr(cfg, "pooling", "mean"), Path(folder))
        else:
            sentences = corpus_sentences(cfg.pretrain_corpus, cfg.task, cfg.language, cfg.data_dir, cfg.transductive,
                                         "pretrain_corpus")
            pretrain(short, stage_seed_of(cfg), sentences, Path(folder))
        return (time.perf_counter() - started) / steps


def adapt(cfg, pooling: str = "mean") -> tuple[Path, dict, bool]:
    """The adapted encoder for this stage configuration, from the cache or built now."""
    check_pretrain(cfg, lambda key: key)
    contrastive = cfg.pretrain in ("simcse", "micse")
    if contrastive and cfg.pretrain_grad_accum != 1:
        raise UserInputError("pretrain_grad_accum", cfg.pretrain_grad_accum, "contrastive objectives take their "
                                                                             "negatives from the batch: use 1 and a "
                                                                             "larger batch")
    seed = stage_seed_of(cfg)
    params = stage_params(cfg, pooling)

    def build(folder: Path) -> dict:
        if contrastive:
            return contrastive_pretrain(cfg, seed, pooling, folder)
        sentences = corpus_sentences(cfg.pretrain_corpus, cfg.task, cfg.language, cfg.data_dir, cfg.transductive,
                                     "pretrain_corpus")
        return pretrain(cfg, seed, sentences, folder)

    return get_or_build(cfg.cache_dir, "dapt", params, build)


def pretrained_start(cfg, pooling: str = "mean") -> tuple[str, dict]:
    """The encoder a trial starts from: `model`, or `model` adapted by the `pretrain` stage; and
    what to report about the stage."""
    if not uses_stage(cfg):
        return cfg.model, {}
    folder, record, built = adapt(cfg, pooling)
    if not math.isfinite(record["last_loss"]):
        raise TrainingDivergedError("the cached pretraining stage ended with a non-finite loss")
    return str(folder), {"dapt_stage_dir": str(folder), "dapt_cache_key": record["key"],
                         "dapt_cache_hit": int(not built), "dapt_first_loss": record["first_loss"],
                         "dapt_last_loss": record["last_loss"], "stage_seed": record["params"]["seed"],
                         "transductive": int(cfg.transductive)}
