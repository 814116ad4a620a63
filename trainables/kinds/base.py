"""The extension point: a trainable kind, as data the orchestrator reads without running a trial.

A kind says what the orchestrator may ask without running a trial (its config schema, the metric
that selects rounds, trials and layers, how many reports a trial makes, the shared stages it uses,
a deep check of a resolved config). A training kind builds a `Learner` (models, one round of
training, evaluation of a split); `trainables.training.loop` runs the protocol around it, the same way for
every kind.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any, ClassVar

from trainables.contract import Report, TrialConfig, parse_config
from trainables.errors import UserInputError, one_of
from trainables.models.files import model_depth
from trainables.names import DROPOUT_MASKS, EVAL_PRECISIONS, PRECISIONS, primary_metric
from trainables.registry import Registry
from trainables.stages.fields import stage_params, uses_stage
from trainables.training.learner import Learner

if TYPE_CHECKING:  # the base class imports almost nothing: reading the registry loads no torch
    import torch

KeyOf = Callable[[str], str]  # a config field -> the YAML key path it came from
PILOT_STEPS = 3  # optimizer steps a step-timed pilot runs


@dataclass(frozen=True)
class PilotSpec:
    """How the estimate times a trial of this config: it builds the trial with `overrides` (a short
    trial whose work costs the same per unit), times one round of it — `units` units of work — and
    one dev and one test evaluation; a round of the real trial does `per_round` units. Shared stages
    are priced apart (the pilot skips them)."""

    overrides: dict[str, Any] = dataclass_field(default_factory=dict)
    units: float = 1.0
    per_round: float = 1.0
    unit: str = "round"  # what a unit is, for the printout: an optimizer step, a pair, a whole round


@dataclass(frozen=True)
class PilotTimes:
    """Seconds measured by a pilot: building the trial, one unit of a round's work, one dev and one
    test evaluation."""

    build_s: float
    unit_s: float
    eval_s: float
    test_s: float


@dataclass(frozen=True)
class StageCost:
    """A shared stage a trial uses, as the estimate prices it: once per `key` (what the cache is keyed
    by), `steps` steps at the time the stage's pilot measures for `cfg` (`trainables.stages.PILOTS`),
    measured once per `shape`."""

    name: str
    key: str
    shape: str
    steps: int
    cfg: Any


class TrainableKind(ABC):
    """One kind of trial: `Config` is its schema; `run(config, report, checkpoint_dir)` runs it."""

    Config: ClassVar[type[TrialConfig]]
    exports_models: ClassVar[bool] = False  # its learner has a sentence encoder that `save:` can keep
    round_name: ClassVar[str] = "epoch"  # what one report covers: an epoch, a cycle, an evaluation round
    round_table: ClassVar[bool] = False  # the last report also carries every round's dev as <round><n>_*
    # config fields whose values come from a registry (poolings: `trainables.poolings.POOLINGS`) or a closed set
    names: ClassVar[dict[str, Collection[str]]] = {}
    # a tiny config of this kind, seconds to run: the contract tests run it for every registered kind (a
    # kind without one fails CI); they fill in `model`, `data_dir`, `cache_dir`, `seed` and the device
    example: ClassVar[dict[str, Any] | None] = None
    # config fields that may differ between the members of one fused array (`run_array`): its optimizer scalars
    fused_scalars: ClassVar[tuple[str, ...]] = ()

    def parse(self, values: dict) -> Any:
        return parse_config(self.Config, values)

    def metric(self, cfg) -> tuple[str, str]:
        """The dev metric and mode that select rounds, trials and layers: the evaluator's own."""
        from trainables.data.tasks import task_kind

        name, greater_is_better = primary_metric(task_kind(cfg.task), getattr(cfg, "select", None))
        return f"dev_{name}", "max" if greater_is_better else "min"

    def num_reports(self, cfg) -> int:
        """How many reports a full trial makes (the pruner's resource)."""
        return cfg.num_reports()

    def relative_cost(self, cfg) -> float:
        """A trial's cost relative to other cells of its study, to start the costliest first: its
        reports times the encoder layers it runs (the whole model when `layer` is unset)."""
        layer = getattr(cfg, "layer", None)
        if layer is None and isinstance(getattr(cfg, "model", None), str):
            try:
                layer = model_depth(cfg.model)
            except (UserInputError, OSError, ValueError):
                layer = 0
        return float(self.num_reports(cfg) * ((layer or 0) + 1))

    def stages(self, cfg) -> tuple[str, ...]:
        """The shared stages a trial of this config uses (`dapt`, `teacher`): by default the
        pretraining stage of a config with `pretrain:` set and steps to run."""
        return ("dapt",) if hasattr(cfg, "pretrain") and uses_stage(cfg) else ()

    def tables(self, cfg) -> tuple[str, ...]:
        """The report's extra tables a trial of this config feeds (beyond the ablation, headline and
        tuning tables every study gets): `rounds` (every round's dev, for a `round_table` kind), `suite`
        (the STS suite), `layers` (every layer of one training), `sizes` (every size of its vectors) or
        `layer_sizes` (both: 2D Matryoshka). The report builds exactly what the study record lists."""
        return ("rounds",) if self.round_table else ()

    def layer_bounds(self, cfg) -> list[tuple[str, Any, str]]:
        """Every layer-like field: (field, its value or values, the model whose depth bounds it);
        by default the `layer` a config cuts its `model` at."""
        return [("layer", cfg.layer, cfg.model)] if "layer" in type(cfg).model_fields else []

    def check(self, cfg, key_of: KeyOf = lambda key: key) -> None:
        """Deep checks of a resolved config before launch: layer-like keys against the depth of the
        model they cut, then the kind's own closed names."""
        for key, value, model in self.layer_bounds(cfg):
            if value is None:
                continue
            values = value if isinstance(value, list | tuple) else [value]
            try:
                depth = model_depth(model)
            except UserInputError as exc:
                raise UserInputError(key_of("model"), model, exc.fix) from None
            if any(not 0 <= int(v) <= depth for v in values):
                raise UserInputError(key_of(key), value, f"{model} has {depth} layers: use numbers in 0..{depth}")
        self.check_names(cfg, key_of)

    def check_names(self, cfg, key_of: KeyOf) -> None:
        """Names inside the config that must come from a closed registry (`names`: poolings,
        losses, modes, ...); kinds add checks that need more than one field."""
        common = {"precision": PRECISIONS, "eval_precision": EVAL_PRECISIONS, "dropout_masks": DROPOUT_MASKS}
        for field, valid in {**{k: v for k, v in common.items() if hasattr(cfg, k)}, **self.names}.items():
            if isinstance(valid, Registry):  # an open registry: its message names each plugin's package
                valid.entry(getattr(cfg, field), key_of(field))
            elif getattr(cfg, field) not in valid:
                raise one_of(key_of(field), getattr(cfg, field), valid)

    def pilot(self, cfg) -> PilotSpec | None:
        """How `plan --estimate` and `budget:` time a trial of this config; None: they cannot."""
        return None

    def stage_costs(self, cfg) -> list[StageCost]:
        """The shared stages a trial of this config builds, as the estimate prices them: the `dapt`
        stage, piloted for a few steps in a scratch folder (a `teacher` round is timed by the pilot)."""
        if "dapt" not in self.stages(cfg):
            return []
        pooling = getattr(cfg, "pooling", "mean")
        return [StageCost("dapt", repr(sorted(stage_params(cfg, pooling).items())),
                          repr((cfg.model, cfg.pretrain, cfg.pretrain_batch_size, cfg.pretrain_max_seq_length)),
                          cfg.pretrain_steps, cfg)]

    @abstractmethod
    def run(self, config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
        """Run one trial; report once per round; return the last metrics."""

    def fuse_refusal(self, cfg) -> str | None:
        """Why trials of this config cannot train as one fused array (`resources.fuse`), or None when they can:
        by default a kind trains each trial alone."""
        return f"the {type(self).__name__.removesuffix('Kind').lower()} kind trains each trial alone"

    def run_array(self, configs: list[dict], labels: list[str], report, checkpoint_dirs: list[str | None],
                  probe: bool = False) -> None:
        """Run the trials `configs` of one cell as one fused array: `report(label, metrics, checkpoint_dir)` once
        per member and round, as each trial alone reports. Only a kind whose `fuse_refusal` can be None runs it.
        `probe` (`resources.fuse: auto`): measure first how many members train fused, on the device it got."""
        raise NotImplementedError(f"{type(self).__name__} does not train fused arrays")


class TrainingKind(TrainableKind):
    """A kind that trains: it builds a learner and the one loop runs it. `learner` names the
    learner's class (`module:Class`), imported only when a trial is built, so that reading the
    kind (validate, plan, status, report) never imports torch."""

    learner: ClassVar[str | None] = None

    def pilot(self, cfg) -> PilotSpec:
        """By default the pilot is the trial's own first round (exact, and as long as a round);
        kinds shorten it. A `pretrain:` stage is skipped (the same encoder shape, priced apart)."""
        return PilotSpec(self.stage_free(cfg))

    def stage_free(self, cfg) -> dict[str, Any]:
        """The override that makes a pilot skip a `pretrain:` stage (the same encoder shape)."""
        return {"pretrain_steps": 0} if "pretrain_steps" in type(cfg).model_fields else {}

    def measure_pilot(self, config: dict[str, Any], spec: PilotSpec) -> PilotTimes:
        """Run the pilot `spec` declares for a trial `config`: build, one round, one dev and one test
        evaluation, timed on the trial's own resources; stages and caches in a scratch folder."""
        import tempfile
        import time

        from trainables.runtime import prepare, seed_everything

        with tempfile.TemporaryDirectory(prefix="orchestrator-pilot-") as scratch:
            scratch_dirs = {"cache_dir": scratch} if "cache_dir" in self.Config.model_fields else {}
            cfg = self.parse({**config, **spec.overrides, **scratch_dirs, "score_test": False})
            device, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
            seed_everything(cfg.seed)
            marks = [time.perf_counter()]
            learner = self.build(cfg, device, dtype)
            marks.append(time.perf_counter())
            learner.train_round(1)
            marks.append(time.perf_counter())
            learner.evaluate("dev")
            marks.append(time.perf_counter())
            learner.evaluate("test")
            marks.append(time.perf_counter())
        build_s, round_s, eval_s, test_s = (b - a for a, b in zip(marks, marks[1:], strict=False))
        return PilotTimes(build_s, round_s / spec.units, eval_s, test_s)

    def epoch_pilot(self, cfg, train_pairs: int) -> PilotSpec:
        """A round is an epoch of `batch_size` batches over `train_pairs`: time a few steps."""
        kept = min(train_pairs, PILOT_STEPS * cfg.batch_size)
        return PilotSpec({**self.stage_free(cfg), "epochs": 1, "max_train_samples": kept},
                         math.ceil(kept / cfg.batch_size), math.ceil(train_pairs / cfg.batch_size), "step")

    def build(self, cfg, device: torch.device, dtype: torch.dtype) -> Learner:
        """Data, models, optimizers and evaluators of one trial (seeded by the loop)."""
        if not self.learner:
            raise TypeError(f"{type(self).__name__} declares no learner: set learner = 'module:Class' "
                            "or override build()")
        module, name = self.learner.split(":")
        return getattr(importlib.import_module(module), name)(cfg, device, dtype)

    def run(self, config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
        from trainables.training.loop import train

        return train(self, self.parse(config), report, checkpoint_dir)[1]


def check_head_pooling(head: str, pooling: str, key: str, head_key: str = "head") -> None:
    """`head: pretrained` reads the first token through the model's pooler: no other pooling."""
    if head == "pretrained" and pooling != "cls":
        raise UserInputError(key, pooling, f"{head_key}: pretrained reads the first token through the model's "
                                           f"pooler: use {key.rsplit('.', 1)[-1]}: cls, or {head_key}: linear")


TOKEN_POOLINGS = ("cls", "last_token")  # they read one token's state, not an average over the tokens


def check_special_tokens(cfg, key_of: Callable[[str], str]) -> None:
    """`pool_special_tokens: false` averages over the sentence's own tokens: a pooling that reads one token
    (`cls`: [CLS] itself, `last_token`: an appended EOS) would read another one, so it is refused."""
    if getattr(cfg, "pool_special_tokens", True) is False and cfg.pooling in TOKEN_POOLINGS:
        raise UserInputError(key_of("pool_special_tokens"), False, f"{cfg.pooling} reads one token, not an average "
                                                                   "over the tokens: use mean, max or "
                                                                   "mean_sqrt_len, or pool_special_tokens: true")


def check_pooling_layers(cfg, key_of: Callable[[str], str], scored: list[int] | None = None) -> None:
    """`pooling_layers` one of its names or a list of layers whose deepest is the cut (`cfg.layer`, the model's
    depth when it keeps every layer). `scored`: the probe's layers, each scored with the mix at its own cut:
    scalar_mix (its weights learned in training) is refused there, and a list needs the one layer it ends at."""
    from trainables.models.pooling_layers import LEARNED, problem

    spec = cfg.pooling_layers
    key = key_of("pooling_layers")
    found = problem(spec, None)
    if found:
        raise UserInputError(key, spec, found)
    if scored is None and isinstance(spec, str):
        return
    if scored is not None:
        if spec == LEARNED:
            raise UserInputError(key, spec, "scalar_mix learns its weights in training; the probe has none to "
                                            "learn: use all (the same layers with equal weights), or finetune")
        if isinstance(spec, str):
            return
        if scored != [max(spec)]:
            raise UserInputError(key, spec, f"a list of layers is one cut, at its deepest ({max(spec)}): score "
                                            f"{key_of('layers')}: [{max(spec)}], or use a name (first_last, top2, "
                                            f"all) that follows each layer")
        return
    try:
        cut = cfg.layer if cfg.layer is not None else model_depth(cfg.model)
    except UserInputError:
        return  # the model's own check says why
    found = problem(spec, cut, f"{key_of('layer')}" if cfg.layer is not None else "the model's last layer")
    if found:
        raise UserInputError(key, spec, found)


def refuse_unused(cfg, key_of: Callable[[str], str], switch: str, settings: tuple[tuple[str, Any], ...],
                  why: Callable[[str], str]) -> None:
    """Settings read only when `switch` is on (`lora_rank`, `adaptive_layers`), set while it is off, would be
    silently unused: one line for the first, `why(name)` its fix. A study that ablates or tunes the switch uses
    them in the cells that turn it on."""
    if key_of(switch).startswith(("ablate.", "tune.")):
        return
    for name, default in settings:
        if getattr(cfg, name) != default:
            raise UserInputError(key_of(name), getattr(cfg, name), why(name))


LORA_SETTINGS = (("lora_alpha", None), ("lora_dropout", 0.0), ("lora_targets", None))


def check_lora(cfg, key_of: Callable[[str], str]) -> None:
    """LoRA's settings in a study that never sets `lora_rank` would be silently unused: refused (a study that
    ablates or tunes it, `lora_rank: [null, 8]`, uses them in the cells that have a rank). With a rank, the
    layers it adapts must be the model's (checked on its config, before any trial)."""
    if cfg.lora_rank is None:
        refuse_unused(cfg, key_of, "lora_rank", LORA_SETTINGS,
                      lambda name: f"LoRA is off without {key_of('lora_rank')}: set lora_rank (8 is common), or "
                                   f"remove {name}")
        return
    from trainables.models.lora import check_targets

    check_targets(cfg.model, cfg.lora_targets, key_of("lora_targets"))


def check_postprocess(cfg, key_of: Callable[[str], str]) -> None:
    """`postprocess` one of its names, and a dimension only where the map has one."""
    from trainables.evaluation.postprocess import POSTPROCESSES

    if cfg.postprocess not in POSTPROCESSES:
        raise one_of(key_of("postprocess"), cfg.postprocess, POSTPROCESSES)
    if cfg.postprocess_dim is not None and cfg.postprocess in ("none", "zscore"):
        raise UserInputError(key_of("postprocess_dim"), cfg.postprocess_dim,
                             f"postprocess {cfg.postprocess} has no dimension: remove postprocess_dim")
