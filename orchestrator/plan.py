"""The plan: every ablation cell and every trial config, resolved and checked before Ray starts.

Deep checks live here (they need the model's config, the task registry and the data folder):
unknown axes, layers above the model's depth, losses that do not fit the task, missing data,
an unusable tracking URI. Each is one UserInputError naming the YAML key path.
"""

from __future__ import annotations

import difflib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import StudyConfig
from search_spaces.params import Choice, Fixed, Grid, IntRange, LogUniform, Param, Uniform, parse_ablated, parse_tuned
from search_spaces.presets import expand_language, expand_layer, expand_pooling, expand_seeds, expand_tuned_preset
from trainables.contract import TrialConfig, parse_config
from trainables.contrastive import METHODS, ContrastiveConfig, resolve_attention_layers
from trainables.cross_encoder import CROSS_LOSSES, CrossEncoderConfig
from trainables.dapt import DaptConfig
from trainables.data import load_task, resolve_language, task_spec
from trainables.distill import MODES, DistillConfig
from trainables.errors import UserInputError
from trainables.finetune import FinetuneConfig, primary_metric
from trainables.models import POOLINGS, encoder_depth, load_config
from trainables.objectives import LOSSES
from trainables.probe import ProbeConfig

SCHEMAS: dict[str, type[TrialConfig]] = {"finetune": FinetuneConfig, "probe": ProbeConfig, "dapt": DaptConfig,
                                          "contrastive": ContrastiveConfig, "cross_encoder": CrossEncoderConfig,
                                          "distill": DistillConfig}
# closed registries of names inside trial configs: field -> valid names
NAMES: dict[str, tuple[str, ...]] = {"pooling": POOLINGS, "cross_pooling": POOLINGS, "method": METHODS,
                                     "mode": MODES, "cross_loss": CROSS_LOSSES}
# keys the orchestrator sets itself; a study may not put them in train/ablate/tune
MANAGED = {"seed", "model", "task", "data_dir", "num_threads", "device", "max_train_samples", "max_eval_samples",
           "score_test", "cache_dir"}


@dataclass(frozen=True)
class Cell:
    index: int
    values: dict[str, Any]

    @property
    def key(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items()) or "all"


@dataclass(frozen=True)
class StudyPlan:
    study: StudyConfig
    cells: tuple[Cell, ...]
    tuned: dict[str, Param]
    seeds: tuple[int, ...]
    base: dict[str, Any]
    metric: str
    mode: str
    epochs: int
    origins: dict[str, str] = field(default_factory=dict)
    cell_reports: tuple[int, ...] = ()  # reports per trial of each cell (cells may ablate epochs, steps, mode)

    def reports_of(self, cell_index: int) -> int:
        """How many reports a full trial of this cell makes (what a completed trial reached)."""
        return self.cell_reports[cell_index] if self.cell_reports else self.epochs

    @property
    def trials_per_cell(self) -> int:
        return self.study.tune.trials if self.study.tune else 0

    @property
    def tuning_trials(self) -> int:
        return len(self.cells) * self.trials_per_cell

    @property
    def replicate_trials(self) -> int:
        return len(self.cells) * len(self.seeds)

    @property
    def max_trial_epochs(self) -> int:
        return sum(self.reports_of(c.index) for c in self.cells) * (self.trials_per_cell + len(self.seeds))

    def trial_config(self, cell: Cell, tuned: dict[str, Any], seed: int, phase: str = "replicate") -> dict[str, Any]:
        """A tuning trial never scores test: selection only ever looks at dev."""
        config = {**self.base, **cell.values, **tuned}
        fields = SCHEMAS[self.study.trainable].model_fields
        if "seed" in fields:
            config["seed"] = seed
        if "score_test" in fields:
            config["score_test"] = phase != "tune"
        return config


def _did_you_mean(key: str, name: str, valid: list[str]) -> UserInputError:
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return UserInputError(key, name, f"{hint}valid names: {', '.join(sorted(valid))}")


def _sample(param: Param) -> Any:
    """A representative value, to check that the trainable accepts the tuned parameter."""
    if isinstance(param, Fixed):
        return param.value
    if isinstance(param, Grid | Choice):
        return param.values[0]
    if isinstance(param, IntRange):
        return param.low
    if isinstance(param, Uniform | LogUniform):
        return param.low
    raise TypeError(param)


def check_tracking_uri(uri: str, base: Path) -> None:
    """SQLite needs a writable folder, a server must answer; file stores are refused (use SQLite)."""
    key = "tracking.mlflow_uri"
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        folder = (base / path).parent if not path.is_absolute() else path.parent
        existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
        if existing is None or not os.access(existing, os.W_OK):
            raise UserInputError(key, uri, f"the folder {folder} cannot be created or written; choose another path")
        return
    if uri.startswith(("http://", "https://")):
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as answer:
                answer.read()
        except OSError as exc:
            raise UserInputError(key, uri, f"the tracking server does not answer ({exc}); start it or fix the URL") \
                from None
        return
    raise UserInputError(key, uri, "use sqlite:///path/to/mlflow.db (the default) or an http(s):// tracking server")


def _ablate_axes(study: StudyConfig, schema: type[TrialConfig]) -> dict[str, Fixed | Grid]:
    valid = [k for k in schema.model_fields if k not in MANAGED or k == "model"]
    axes: dict[str, Fixed | Grid] = {}
    for name, raw in study.ablate.items():
        key = f"ablate.{name}"
        if name == "seed":
            raise UserInputError(key, raw, "seeds are never ablated: list them under replicate.seeds")
        if name not in valid:
            raise _did_you_mean(key, name, valid)
        if isinstance(raw, list):
            parse_ablated(key, raw)  # empty lists and repeated values
        if name == "pooling":
            axes[name] = expand_pooling(raw)
        elif name == "language":
            axes[name] = expand_language(raw, task_spec(study.task).languages)
        elif name == "layer":
            axes[name] = Grid(()) if raw in ("all", "last") else parse_ablated(key, raw)  # per model below
        else:
            axes[name] = parse_ablated(key, raw)
    return axes


def _cells(study: StudyConfig, axes: dict[str, Fixed | Grid]) -> list[dict[str, Any]]:
    """The full factorial grid; `layer: all|last` expands with each cell's model depth."""
    grid_axes = {k: v for k, v in axes.items() if k != "layer"}
    combos = [dict(zip(grid_axes, values, strict=True)) for values in
              itertools.product(*[(p.value,) if isinstance(p, Fixed) else p.values for p in grid_axes.values()])]
    if "layer" not in axes:
        return combos
    cells = []
    depths: dict[str, int] = {}
    for combo in combos:
        model = combo.get("model", study.model)
        if model not in depths:
            depths[model] = _depth(model, "ablate.model" if "model" in combo else "model")
        layers = expand_layer(study.ablate["layer"], depths[model])
        for layer in (layers.value,) if isinstance(layers, Fixed) else layers.values:
            cells.append({k: layer if k == "layer" else combo[k] for k in axes})  # the YAML's axis order
    return cells


def _depth(model: str, key: str) -> int:
    try:
        return encoder_depth(load_config(model))
    except UserInputError as exc:
        raise UserInputError(key, model, exc.fix) from None


def build_plan(study: StudyConfig, study_dir: Path | None = None, stage_root: Path | None = None) -> StudyPlan:
    """Resolve and check everything a launch needs; raises UserInputError on the first problem."""
    schema = SCHEMAS[study.trainable]
    spec = task_spec(study.task) if study.task in _task_names() else None
    if spec is None:
        raise _did_you_mean("task", study.task, _task_names())
    if spec.kind == "unlabeled":
        raise UserInputError("task", study.task, f"{study.trainable} needs a labeled pair task")
    axes = _ablate_axes(study, schema)
    if "language" not in axes:
        try:
            resolve_language(spec, study.language)
        except UserInputError as exc:
            raise UserInputError("language", study.language, exc.fix) from None

    tuned: dict[str, Param] = {}
    if study.tune is not None:
        if study.trainable == "probe":
            raise UserInputError("tune", "probe", "probe trains nothing: remove the tune section")
        for name, raw in study.tune.params.items():
            key = f"tune.params.{name}"
            if name not in schema.model_fields or name in MANAGED:
                raise _did_you_mean(key, name, [k for k in schema.model_fields if k not in MANAGED])
            if name in axes:
                raise UserInputError(key, raw, f"{name} is also ablated; an axis is either ablated or tuned")
            tuned[name] = expand_tuned_preset(name, raw) or parse_tuned(key, raw)
    seeds = expand_seeds(study.replicate.seeds)
    if study.trainable == "probe" and len(seeds) > 1:
        raise UserInputError("replicate.seeds", study.replicate.seeds, "probe is deterministic: use one seed")

    origins = {"model": "model", "task": "task", "language": "language", "data_dir": "data_dir"}
    base: dict[str, Any] = {"model": study.model, "task": study.task}
    if study.language is not None:
        base["language"] = study.language
    if study.data_dir:  # relative to the study file's folder
        base["data_dir"] = str(((study_dir or Path.cwd()) / Path(study.data_dir).expanduser()).resolve())
    elif os.environ.get("ORCHESTRATOR_DATA_DIR"):
        base["data_dir"] = str(Path(os.environ["ORCHESTRATOR_DATA_DIR"]).expanduser().resolve())
    for name, value in study.train.items():
        if name not in schema.model_fields or name in MANAGED:
            raise _did_you_mean(f"train.{name}", name, [k for k in schema.model_fields if k not in MANAGED])
        if name in axes or name in tuned:
            raise UserInputError(f"train.{name}", value, f"{name} is also ablated or tuned; give it in one place")
        base[name], origins[name] = value, f"train.{name}"
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(study.data, name)
        if value is not None and name in schema.model_fields:
            base[name], origins[name] = value, f"data.{name}"
    base["num_threads"] = max(1, int(study.resources.cpu))
    if "cache_dir" in schema.model_fields and stage_root is not None:
        base["cache_dir"] = str(stage_root)  # one adapted encoder per stage config, shared by the study
    base["device"] = "cuda" if study.resources.gpu > 0 else "cpu"
    origins.update({k: f"ablate.{k}" for k in axes})
    origins.update({k: f"tune.params.{k}" for k in tuned})

    cells = tuple(Cell(i, values) for i, values in enumerate(_cells(study, axes)))
    sample = {k: _sample(p) for k, p in tuned.items()}
    reports = tuple(_check_trial(schema, {**base, **cell.values, **sample}, origins).num_reports() for cell in cells)
    checked = {(c.values.get("task", study.task), c.values.get("language", study.language)) for c in cells}
    for task, language in sorted(checked, key=str):
        load_task(task, language, base.get("data_dir"))
    check_tracking_uri(study.tracking.mlflow_uri, study_dir or Path.cwd())

    metric, mode = primary_metric(spec.kind)
    epochs = max(reports, default=1)  # reports per trial; ablating epochs or steps makes them differ by cell
    _check_baseline(study, cells)
    return StudyPlan(study, cells, tuned, seeds, base, metric, mode, epochs, origins, reports)


def _task_names() -> list[str]:
    from trainables.data import TASKS

    return [name for name, spec in TASKS.items() if spec.kind != "unlabeled" and not spec.eval_only]


def _check_trial(schema: type[TrialConfig], config: dict, origins: dict[str, str]) -> TrialConfig:
    try:
        parsed = parse_config(schema, config)
    except UserInputError as exc:
        raise UserInputError(origins.get(exc.key, exc.key), exc.value, exc.fix) from None
    loss = getattr(parsed, "loss", None)
    if isinstance(parsed, CrossEncoderConfig):
        if loss not in CROSS_LOSSES:
            raise UserInputError(origins.get("loss", "train.loss"), loss, "use one of: " + ", ".join(CROSS_LOSSES))
    elif loss is not None:
        kind = task_spec(parsed.task).kind
        if loss not in LOSSES:
            raise UserInputError(origins.get("loss", "train.loss"), loss, "use one of: " + ", ".join(sorted(LOSSES)))
        if LOSSES[loss][0] != kind:
            fitting = ", ".join(n for n, (k, _) in LOSSES.items() if k == kind)
            raise UserInputError(origins.get("loss", "train.loss"), loss,
                                 f"it trains {LOSSES[loss][0]} tasks; task {parsed.task} needs one of: {fitting}")
    for name, valid in NAMES.items():
        value = getattr(parsed, name, None)
        if value is not None and value not in valid:
            raise UserInputError(origins.get(name, f"train.{name}"), value, "use one of: " + ", ".join(valid))
    if isinstance(parsed, ContrastiveConfig):
        depth = parsed.layer if parsed.layer is not None else _depth(parsed.model, origins.get("model", "model"))
        try:
            resolve_attention_layers(parsed, depth)
        except UserInputError as exc:
            raise UserInputError(origins.get(exc.key, f"train.{exc.key}"), exc.value, exc.fix) from None
    return parsed


def _check_baseline(study: StudyConfig, cells: tuple[Cell, ...]) -> None:
    axes = list(cells[0].values) if cells else []
    for key, names in (("report.rows", study.report.rows or []), ("report.columns", [study.report.columns] if
                                                                    study.report.columns else [])):
        for name in names:
            if name not in axes:
                raise UserInputError(key, name, f"name an ablated axis: {', '.join(axes) or 'none ablated'}")
    baseline = study.report.baseline
    if not baseline:
        return
    for name, value in baseline.items():
        axis_values = {c.values.get(name) for c in cells}
        if name not in (cells[0].values if cells else {}):
            raise UserInputError(f"report.baseline.{name}", value, "name an ablated axis")
        if value != "last" and value not in axis_values:
            raise UserInputError(f"report.baseline.{name}", value,
                                 f"use one of the ablated values: {', '.join(map(str, sorted(axis_values, key=str)))}")
