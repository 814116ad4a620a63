"""What a kind's config says about the `pretrain:` stage, importable without torch: the settings
(`PretrainFields`), the closed names, and whether and with which seed a config runs the stage.
The stage itself is `trainables.stages.pretrain`."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from trainables.errors import UserInputError, one_of

OBJECTIVES = ("mlm", "rtd", "simcse", "micse", "mntp")
STAGE_SEEDS = ("per_seed", "shared")
STAGE_FIELDS = ("pretrain", "pretrain_corpus", "pretrain_steps", "pretrain_lr", "pretrain_batch_size",
                "pretrain_grad_accum", "pretrain_warmup_ratio", "pretrain_max_seq_length", "pretrain_mlm_probability",
                "pretrain_generator", "pretrain_rtd_weight")


class PretrainFields(BaseModel):
    """The `pretrain:` stage's settings, shared by every kind that may start from it."""

    pretrain: str | None = Field(None, description="mlm, rtd (ELECTRA), simcse, micse or mntp (LLM2Vec's masked "
                                                    "next-token prediction, for a decoder with bidirectional: true): "
                                                    "first adapt `model` on `pretrain_corpus` (a cached stage); null "
                                                    "fine-tunes directly")
    pretrain_corpus: str = Field("unlabeled_en", description="unlabeled_en, task (the task's train sentences), "
                                                             "task+dev, task+test (transductive) or a text file")
    pretrain_steps: int = Field(200, ge=0, description="optimizer steps; 0 skips the stage, so `ablate: "
                                                       "{pretrain_steps: [0, 300]}` compares with and without")
    pretrain_lr: float = Field(5e-5, gt=0)
    pretrain_batch_size: int = Field(32, ge=1)
    pretrain_grad_accum: int = Field(1, ge=1)
    pretrain_warmup_ratio: float = Field(0.1, ge=0, le=1)
    pretrain_max_seq_length: int = Field(128, ge=8)
    pretrain_mlm_probability: float = Field(0.15, gt=0, lt=1, description="mlm, rtd and mntp: the share of tokens "
                                                                          "masked (LLM2Vec's mntp configs: 0.2)")
    pretrain_generator: str | None = Field(None, description="rtd: a generator hub id or folder; default a fresh "
                                                             "generator a quarter of the discriminator's width")
    pretrain_rtd_weight: float = Field(50.0, gt=0, description="rtd: weight of the detection loss (ELECTRA: 50)")
    stage_seed: str = Field("per_seed", description="per_seed: one stage per trial seed (the spread over seeds "
                                                    "covers the stage); shared: one stage, seed pretrain_seed")
    pretrain_seed: int = Field(0, description="the stage's seed with stage_seed: shared")
    transductive: bool = Field(False, description="allow test sentences in the corpus (recorded on the run)")
    cache_dir: str | None = None


def uses_stage(cfg) -> bool:
    return cfg.pretrain is not None and cfg.pretrain_steps > 0


def stage_seed_of(cfg) -> int:
    if cfg.stage_seed not in STAGE_SEEDS:
        raise one_of("stage_seed", cfg.stage_seed, STAGE_SEEDS)
    return cfg.seed if cfg.stage_seed == "per_seed" else cfg.pretrain_seed


def check_pretrain(cfg, key_of: Callable[[str], str]) -> None:
    """The stage's settings as `validate` checks them, one line each: a known objective, a known stage seed, and
    `mntp` only where it applies (a bi-encoder's decoder made to attend both ways, as LLM2Vec trains it)."""
    if cfg.pretrain is not None and cfg.pretrain not in OBJECTIVES:
        raise one_of(key_of("pretrain"), cfg.pretrain, OBJECTIVES)
    stage_seed_of(cfg)
    if cfg.pretrain == "mntp" and not decoder(cfg.model):
        raise UserInputError(key_of("pretrain"), "mntp", "masked next-token prediction is for a decoder (LLM2Vec); "
                                                         "this model attends both ways already: use mlm")
    if cfg.pretrain == "mntp" and not getattr(cfg, "bidirectional", False):
        fix = ("set bidirectional: true" if hasattr(cfg, "bidirectional") else
               "this kind has no bidirectional setting: use mntp with finetune or distill, or mlm here")
        raise UserInputError(key_of("pretrain"), "mntp", f"masked next-token prediction trains a decoder made to "
                                                         f"attend both ways (LLM2Vec): {fix}")


def decoder(model: str) -> bool:
    """Whether `model` attends causally (read from its `config.json`); True where that cannot be read, so that
    the model's own check says why."""
    from trainables.models.architectures import is_causal
    from trainables.models.files import model_config

    try:
        return is_causal(model_config(model))
    except UserInputError:
        return True


def stage_params(cfg, pooling: str = "mean") -> dict:
    """Everything that determines the stage's output, its seed included: its cache key."""
    contrastive = cfg.pretrain in ("simcse", "micse")
    return {"model": cfg.model, "task": cfg.task if cfg.pretrain_corpus.startswith("task") or contrastive else None,
            "language": cfg.language, "transductive": cfg.transductive, "seed": stage_seed_of(cfg),
            **{k: getattr(cfg, k) for k in STAGE_FIELDS}, **({"pooling": pooling} if contrastive else {})}
