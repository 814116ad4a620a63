"""`contrastive`: unsupervised SimCSE and miCSE on a (truncated) encoder (see
`trainables.objectives.contrastive`). A round is `eval_every` optimizer steps, so ASHA can act
between rounds. Training truncates sentences at `max_seq_length` (SimCSE: 32); dev, test and the
STS suite are encoded untruncated (up to the model's limit), as SimCSE evaluates, unless
`eval_max_seq_length` says otherwise. With `suite: true` the STS suite is scored once with test.
"""

from __future__ import annotations

import math

from pydantic import Field

from trainables.contract import LoraFields, PoolingLayersFields, PostprocessFields, PromptFields, TrainingConfig
from trainables.data.declaration import TaskRef
from trainables.errors import UserInputError, one_of
from trainables.kinds.base import (
    PILOT_STEPS,
    PilotSpec,
    TrainingKind,
    check_lora,
    check_pooling_layers,
    check_postprocess,
    check_special_tokens,
)
from trainables.models.files import model_depth
from trainables.names import ATTENTION_LOSSES, METHODS
from trainables.poolings import POOLINGS
from trainables.stages.fields import PretrainFields, check_pretrain

MODEL_MAX_LENGTH = 512


class ContrastiveConfig(TrainingConfig, PromptFields, PoolingLayersFields, LoraFields, PostprocessFields,
                        PretrainFields):
    model: str
    method: str = Field("simcse", description="simcse, or micse (plus attention alignment of the two views)")
    task: TaskRef = Field("stsb", description="the STS task whose dev split selects steps, trials and layers")
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


def default_attention_layers(kept: int) -> list[int]:
    """The reference's layers scaled to a truncated encoder: 1-based k-4..k-1 (8..11 of 12)."""
    return list(range(max(1, kept - 4), max(1, kept - 1) + 1))


def resolve_attention_layers(method: str, requested: list[int] | None, kept: int,
                             key: str = "attention_layers") -> list[int] | None:
    """0-based indices of the layers whose attention miCSE aligns; None for SimCSE."""
    if method not in METHODS:
        raise one_of("method", method, METHODS)
    if method == "simcse":
        return None
    if kept == 0:
        raise UserInputError("layer", 0, "micse aligns attention, and layer 0 has none: use layer >= 1 or simcse")
    layers = requested or default_attention_layers(kept)
    bad = [k for k in layers if not 1 <= k <= kept]
    if bad:
        raise UserInputError(key, layers, f"the encoder keeps {kept} layers: use numbers in 1..{kept}")
    return [k - 1 for k in sorted(set(layers))]



class ContrastiveKind(TrainingKind):
    example = {"layer": 2, "steps": 6, "eval_every": 2, "batch_size": 16, "corpus": "task",
               "max_train_samples": 120, "method": "micse", "pooling": "mean"}  # a random tiny BERT's CLS is collapsed
    Config = ContrastiveConfig
    learner = "trainables.kinds.contrastive.learner:ContrastiveLearner"
    exports_models = True
    round_name = "round"

    names = {"pooling": POOLINGS, "attention_loss": ATTENTION_LOSSES, "method": METHODS}

    def tables(self, cfg) -> tuple[str, ...]:
        return super().tables(cfg) + (("suite",) if cfg.suite else ())

    def pilot(self, cfg):
        """A round is `eval_every` optimizer steps: time a few."""
        return PilotSpec({"steps": PILOT_STEPS, "eval_every": PILOT_STEPS}, PILOT_STEPS, cfg.eval_every, "step")

    def check_names(self, cfg, key_of) -> None:
        super().check_names(cfg, key_of)
        kept = cfg.layer if cfg.layer is not None else model_depth(cfg.model)
        try:
            resolve_attention_layers(cfg.method, cfg.attention_layers, kept)
        except UserInputError as exc:
            raise UserInputError(key_of(exc.key), exc.value, exc.fix) from None
        check_pooling_layers(cfg, key_of)
        check_special_tokens(cfg, key_of)
        check_postprocess(cfg, key_of)
        check_lora(cfg, key_of)
        if cfg.pretrain in ("simcse", "micse"):
            raise UserInputError(key_of("pretrain"), cfg.pretrain, "contrastive is that training already: adapt "
                                                                   "the model first with mlm, rtd or mntp (LLM2Vec: "
                                                                   "mntp, then simcse), or remove pretrain")
        check_pretrain(cfg, key_of)
