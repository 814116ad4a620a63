"""What every trainable kind shares: the report callable, config parsing and the kind's metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainables.errors import UserInputError, UserInputErrors


class Report(Protocol):
    """Called once per epoch (or cycle). A given `checkpoint_dir` is persisted before it returns,
    so the trainable may delete it afterwards."""

    def __call__(self, metrics: dict, checkpoint_dir: str | None = None) -> None: ...


class TrialConfig(BaseModel):
    """Base of every trainable's config: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def num_reports(self) -> int:
        """How many times a trial reports (epochs, evaluation rounds): the pruner's resource."""
        return int(getattr(self, "epochs", 1))


class TrainingConfig(TrialConfig):
    """Fields every training trial has; the orchestrator sets them (seed per replicate, threads per
    granted CPUs, the data folder, the study's caps, test scoring off for tuning trials)."""

    score_test: bool = Field(True, description="score test at the end (tuning trials do not)")
    export_model: bool = Field(False, description="save the best-dev model in sentence-transformers format beside "
                                                  "the last checkpoint (`model/`); the orchestrator sets it")
    test_every_round: bool = Field(False, description="diagnostic: also score test after every round "
                                                      "(<round><n>_test_*); never used for selection")
    seed: int = 0
    precision: str = Field("auto", description="training precision: auto (bf16 autocast where the hardware runs it "
                                                "fast), fp32 or bf16")
    eval_precision: str = Field("fp32", description="dev/test scoring precision: fp32 (the saved model reproduces "
                                                    "the test number in sentence-transformers) or same (as training)")
    dropout_masks: str = Field("fast", description="how dropout draws its masks: fast (15-bit integer draws, "
                                                   "four per random word; p rounded to 1/32768) or torch "
                                                   "(bernoulli_, as runs made before it)")
    device: str = "auto"
    num_threads: int | None = Field(None, ge=1)
    data_dir: str | None = None
    max_train_samples: int | None = Field(None, ge=1)
    max_eval_samples: int | None = Field(None, ge=1)


class PromptFields(BaseModel):
    """A prompt before every sentence a bi-encoder embeds (E5's 'query: ', an instruction), as
    sentence-transformers' `encode(prompt=...)` and `Pooling(include_prompt=...)`: kinds with a sentence
    encoder take it; a cross-encoder, which reads both sentences in one input, does not."""

    prompt: str = Field("", description="text put before every sentence's text before tokenization, as "
                                        "sentence-transformers' encode(prompt=...) (E5: 'query: '); its tokens count "
                                        "toward the max sequence length; '' is none. Quote it in YAML")
    include_prompt: bool = Field(True, description="false: the prompt's tokens (and the first special token) are "
                                                   "left out of the pooling but still attended to, as "
                                                   "sentence-transformers' Pooling(include_prompt=False) (INSTRUCTOR)")
    bidirectional: bool = Field(False, description="true: a causal decoder attends both ways, every token seeing the "
                                                   "whole sentence (LLM2Vec's first step; Gemma 3's own "
                                                   "use_bidirectional_attention); an encoder already does")
    pool_special_tokens: bool = Field(True, description="false: the tokenizer's special tokens (BOS, [CLS], [SEP], "
                                                        "EOS) are left out of the pooling but still attended to; "
                                                        "for mean, max and mean_sqrt_len (a decoder's BOS, an "
                                                        "attention sink, would otherwise weigh in the mean)")
    append_eos: bool = Field(False, description="true: every input ends with the tokenizer's EOS token (within "
                                                "the max sequence length), as decoder embedding recipes ask "
                                                "(E5-Mistral, LLM2Vec): last_token then pools the EOS; a tokenizer "
                                                "that appends it already is left as it is")


class LoraFields(BaseModel):
    """LoRA through peft (trainables/models/lora.py): low-rank adapters on the cut encoder's linear layers,
    its own weights frozen. `lora_rank` null (the default) trains the whole encoder."""

    lora_rank: int | None = Field(None, ge=1, description="LoRA's rank r: adapters on the cut encoder, its weights "
                                                          "frozen; null trains the whole encoder")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA's alpha: the adapters scaled by alpha / rank; "
                                                             "null is the rank (a scale of 1)")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input (peft's lora_dropout)")
    lora_targets: list[str] | str | None = Field(None, description="the linear layers LoRA adapts, by name "
                                                                   "([query, value]) or all-linear; null: peft's "
                                                                   "default for the model type")


class PostprocessFields(BaseModel):
    """An affine map of the sentence vectors before the cosine, fitted on the train split's sentences
    (trainables/evaluation/postprocess.py)."""

    postprocess: str = Field("none", description="none, whiten, abtt or zscore: the vectors mapped by a transform "
                                                 "fitted on the train split's sentences, applied to dev and test")
    postprocess_dim: int | None = Field(None, ge=1, description="whiten: the dimensions kept; abtt: the top "
                                                                "directions removed (d / 100 by default)")


class PoolingLayersFields(BaseModel):
    """Several layers' token states averaged before the pooling (trainables/models/layer_mix.py)."""

    pooling_layers: str | list[int] = Field("last", description="last (the cut layer), first_last (layers 1 and k, "
                                                                "SimCSE's), top2 (k-1 and k), all (0..k), "
                                                                "scalar_mix (0..k, ELMo's learned weights) or a "
                                                                "list of layers whose deepest is the cut")


ConfigT = TypeVar("ConfigT", bound=TrialConfig)


def parse_config(schema: type[ConfigT], values: dict) -> ConfigT:
    """`values` checked against `schema`; each problem becomes one UserInputError line (UserInputErrors
    when there are several, so a study file's mistakes are said together)."""
    try:
        return schema(**values)
    except ValidationError as exc:
        errors = [_explained(schema, error) for error in exc.errors()]
        raise (errors[0] if len(errors) == 1 else UserInputErrors(errors)) from None


def _explained(schema: type[BaseModel], error: dict) -> UserInputError:
    key = ".".join(str(part) for part in error["loc"]) or "config"
    if error["type"] == "extra_forbidden":
        valid = ", ".join(sorted(schema.model_fields))
        return UserInputError(key, error.get("input"), f"unknown key; valid keys are: {valid}")
    if error["type"] == "string_type" and isinstance(error.get("input"), dict):  # `prompt: query: ` unquoted
        return UserInputError(key, error.get("input"), "input should be a valid string: quote it in YAML "
                                                       "(\"query: \"), where an unquoted ': ' makes a mapping")
    return UserInputError(key, error.get("input"), error["msg"].lower())


def collect(into: list[dict]) -> Callable[..., None]:
    """A report callable that keeps every metrics dict in `into` (for tests and the CLI)."""

    def report(metrics: dict, checkpoint_dir: str | None = None) -> None:
        into.append(dict(metrics))

    return report
