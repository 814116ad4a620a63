"""The plan: every ablation cell and every trial config, resolved and checked before Ray starts.

Deep checks happen here (they need the model's config, the task registry and the data folder):
unknown axes, missing data, an unusable tracking URI, and each trial config checked by its kind
(layer-like keys against the depth of the model they cut, wherever they are set; losses and other
closed names). Kinds are reached only through the registry. Each problem is one UserInputError
naming the YAML key path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from orchestrator.study.cells import MANAGED, Cell, ablate_axes, did_you_mean, grid_cells
from orchestrator.study.config import StudyConfig
from orchestrator.study.data import read_study_data, trial_task
from orchestrator.study.fusing import Fusion, fusions
from orchestrator.study.model_check import check_cuts, check_models
from orchestrator.study.plan_checks import (
    check_baseline,
    check_language,
    check_saved_pooling,
    check_task_name,
    check_trials,
    tasks_read,
)
from orchestrator.study.plugins import plugins_used
from orchestrator.study.store_check import check_tracking_uri
from reports.record import DataRecord, KindRecord, PluginRecord, StudyRecord
from search_spaces.optuna_samplers import nsga2_population, objective_problems, space_problems
from search_spaces.params import Fixed, Grid, Param, parse_tuned
from search_spaces.presets import expand_seeds, expand_tuned_preset
from trainables.contract import TrialConfig
from trainables.data.declaration import resolve_paths
from trainables.errors import Problems, UserInputError
from trainables.kinds import KINDS, TrainableKind, load_kind
from trainables.kinds.base import TrainingKind


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
    kind_path: str = ""  # the registry entry of the study's kind, carried by every trial to its worker
    cell_costs: tuple[float, ...] = ()  # a trial's relative cost per cell: the costliest cells start first
    stages: tuple[str, ...] = ()  # the shared stages the plan's trials use (the kind's `stages`)
    tables: tuple[str, ...] = ()  # the extra report tables the plan's trials feed (the kind's `tables`)
    round_name: str = "epoch"  # what one report covers (the kind's; read from the record without the kind's code)
    data: tuple[DataRecord, ...] = ()  # each data set the cells read, with its splits' sha256
    plugins: tuple[PluginRecord, ...] = ()  # the registered names it uses that installed plugins provide
    fusion: tuple[Fusion, ...] = ()  # per cell: its replicates' fused arrays (`resources.fuse`), and why

    def members_of(self, cell_index: int) -> int:
        """How many of the cell's replicates train as one fused array (1: each alone)."""
        return self.fusion[cell_index].members if self.fusion else 1

    def tuning_members_of(self, cell_index: int) -> int:
        """How many of the cell's tuning trials train as one fused array (1: each alone)."""
        return self.fusion[cell_index].members if self.fusion and self.fusion[cell_index].tuning else 1

    def start_order(self) -> list[Cell]:
        """Cells costliest first (then in index order): long trials start early, so the study's
        last minutes are not one long trial running while the other slots idle."""
        cost = self.cell_costs or (0.0,) * len(self.cells)
        return sorted(self.cells, key=lambda c: (-cost[c.index], c.index))

    @property
    def kind(self) -> TrainableKind:
        return load_kind(self.kind_path or KINDS[self.study.trainable])

    def reports_of(self, cell_index: int) -> int:
        """How many reports a full trial of this cell makes (what a completed trial reached)."""
        return self.cell_reports[cell_index] if self.cell_reports else self.epochs

    @property
    def objectives(self) -> tuple[str, ...]:
        """What each cell's search optimises (`tune.objectives`): `("dev",)` unless the study names more."""
        return tuple(self.study.tune.objectives) if self.study.tune else ("dev",)

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
        fields = self.kind.Config.model_fields
        if "seed" in fields:
            config["seed"] = seed
        if "score_test" in fields:
            config["score_test"] = phase != "tune"
        if "export_model" in fields:
            config["export_model"] = phase == "replicate" and self.study.save != "none"
        return config


def search_settings(study: StudyConfig) -> dict[str, Any]:
    """How each cell was tuned, as the record keeps it for the report: sampler, its seed and random
    startup trials, the pruner and its rungs, trials per cell, the tuning trials' training seed; with several
    objectives, they (and NSGA-II's population)."""
    tune = study.tune
    if tune is None:
        return {}
    return {"sampler": tune.sampler, "sampler_seed": tune.sampler_seed, "startup_trials": tune.startup_trials,
            "scheduler": tune.scheduler, "grace_epochs": tune.grace_epochs, "reduction_factor": tune.reduction_factor,
            "trials": tune.trials, "seed": tune.seed, **({"qmc_type": tune.qmc_type} if tune.sampler == "qmc" else {}),
            **({"population_size": nsga2_population(tune.trials, tune.population_size)} if tune.sampler == "nsga2"
               else {}),
            **({"objectives": list(tune.objectives)} if len(tune.objectives) > 1 else {})}


def defaults_of(plan: StudyPlan) -> dict[str, Any]:
    """The kind's defaults for every config field the study leaves to it (neither set, ablated, tuned
    nor managed): with the base config they make every trial's configuration explicit in the record."""
    from pydantic_core import PydanticUndefined

    given = set(plan.base) | {k for cell in plan.cells for k in cell.values} | set(plan.tuned) | MANAGED
    out = {}
    for name, info in plan.kind.Config.model_fields.items():
        if name in given or info.default is PydanticUndefined:
            continue
        out[name] = info.default
    defaults: dict[str, Any] = json.loads(json.dumps(out, default=str))
    return defaults


def plan_record(plan: StudyPlan, provenance: dict[str, str] | None = None, inputs: bool = False,
                estimate: dict[str, float] | None = None) -> StudyRecord:
    """The study record a launch stores beside the journal and on the MLflow parent run, so that
    `status`, `report`, `verify` and `sync` rebuild the plan without the data folder, the model or
    the hub, and read what the kind declares without importing it. `inputs`: hash the data sets and
    models the cells read (a launch does; the data and the model are here then)."""
    kind = plan.kind
    data, models = list(plan.data), []
    if inputs:
        from orchestrator.study.inputs import model_records, with_files

        data = [with_files(d) for d in plan.data]
        models = model_records([c.values for c in plan.cells], plan.base)
    return StudyRecord(
        name=plan.study.name, kind=KindRecord(name=plan.study.trainable, path=plan.kind_path,
                                              round_name=kind.round_name, round_table=kind.round_table,
                                              exports_models=kind.exports_models, stages=list(plan.stages),
                                              tables=list(plan.tables)),
        metric=plan.metric, mode=cast(Literal["max", "min"], plan.mode), cells=[c.values for c in plan.cells],
        tuned={k: repr(v) for k, v in plan.tuned.items()}, seeds=list(plan.seeds),
        base=json.loads(json.dumps(plan.base, default=str)), origins=plan.origins, epochs=plan.epochs,
        cell_reports=list(plan.cell_reports), cell_costs=list(plan.cell_costs), tuning_trials=plan.tuning_trials,
        replicate_trials=plan.replicate_trials, provenance=provenance or {}, data=data,
        plugins=list(plan.plugins), resources={"cpu": plan.study.resources.cpu, "gpu": plan.study.resources.gpu},
        search=search_settings(plan.study), models=models, estimate=estimate, defaults=defaults_of(plan),
        fusion=[{"members": f.members, "why": f.why, "tuning": f.tuning} for f in plan.fusion])


def plan_from_record(study: StudyConfig, record: StudyRecord) -> StudyPlan:
    """The plan a launch stored (`plan_record`), for a study whose file is `study`."""
    tuned = {name: expand_tuned_preset(name, raw) or parse_tuned(f"tune.params.{name}", raw)
             for name, raw in (study.tune.params.items() if study.tune else ())}
    return StudyPlan(study, tuple(Cell(i, values) for i, values in enumerate(record.cells)), tuned,
                     tuple(record.seeds), record.base, record.metric, record.mode, record.epochs, record.origins,
                     tuple(record.cell_reports), record.kind.path, tuple(record.cell_costs), tuple(record.kind.stages),
                     tuple(record.kind.tables or ()), record.kind.round_name, tuple(record.data), tuple(record.plugins),
                     tuple(Fusion(int(f["members"]), str(f["why"]), bool(f.get("tuning"))) for f in record.fusion))


def build_plan(study: StudyConfig, study_dir: Path | None = None, stage_root: Path | None = None) -> StudyPlan:
    """Resolve and check everything a launch needs. Every problem is a UserInputError naming the YAML key it
    came from; the checks that do not depend on a failed one still run, so all of them are reported at once
    (UserInputErrors when there are several)."""
    kind = load_kind(KINDS[study.trainable])  # config.py checked the name against the registry
    found = Problems()
    checked, fusion = None, None
    found.check(check_task_name, study)
    task_ok = not found.errors
    seeds = found.check(_replicate_seeds, study, kind)
    before = len(found.errors)
    axes = ablate_axes(study, kind.Config, found)  # the axes that parse: the checks below go on with them
    axes_ok = len(found.errors) == before
    if task_ok and (axes_ok or "language" not in study.ablate):
        found.check(check_language, study, axes)
    tuned = found.check(_tuned_params, study, kind, axes)
    if tuned and study.tune is not None:  # a sampler that cannot search this space as its name promises
        found.add(*space_problems(study.tune.sampler, study.tune.trials, tuned))
    if study.tune is not None:  # objectives with a sampler or pruner that cannot serve them
        tune = study.tune
        found.add(*objective_problems(list(tune.objectives), tune.sampler, tune.scheduler, tune.trials,
                                      tune.population_size))
    based = found.check(_base_config, study, kind.Config, axes, tuned or {}, study_dir, stage_root, found)
    values = found.check(grid_cells, study, axes, found)
    if task_ok and tuned is not None and based is not None and values is not None:  # each trial names the task
        base, origins = based
        cells = tuple(Cell(i, v) for i, v in enumerate(values))
        parsed = found.check(check_trials, kind, cells, base, tuned, origins)
        if parsed:
            checked = found.check(check_models, study, cells, parsed, origins)
            found.check(check_saved_pooling, study, parsed, origins)
            if seeds is not None:
                fusion = found.check(fusions, study, kind, parsed, len(seeds), tuned)
        data = found.check(read_study_data, tasks_read(study, cells, base, origins, parsed is not None),
                           base.get("data_dir"))
        if axes_ok:
            found.check(check_baseline, study, cells)
    found.check(check_tracking_uri, study.tracking.mlflow_uri, study_dir or Path.cwd())
    found.raise_any()  # every check above passed: none of what they returned is None
    parsed, tuned = cast("list[TrialConfig]", parsed), cast("dict[str, Param]", tuned)
    seeds, data = cast("tuple[int, ...]", seeds), cast("tuple[DataRecord, ...]", data)
    check_cuts(checked or {})  # the one check that loads weights: when everything else holds
    metric, mode = kind.metric(parsed[0]) if parsed else ("dev_spearman", "max")
    reports = tuple(kind.num_reports(p) for p in parsed)
    epochs = max(reports, default=1)  # reports per trial; ablating epochs or steps makes them differ by cell
    stages = tuple(sorted({name for p in parsed for name in kind.stages(p)}))
    tables = tuple(sorted({name for p in parsed for name in kind.tables(p)}))
    return StudyPlan(study, cells, tuned, seeds, base, metric, mode, epochs, origins, reports,
                     KINDS[study.trainable], tuple(kind.relative_cost(p) for p in parsed), stages, tables,
                     kind.round_name, data, plugins_used(study.trainable, kind, parsed, tuned), fusion or ())


def _tuned_params(study: StudyConfig, kind: TrainableKind, axes: dict[str, Fixed | Grid]) -> dict[str, Param]:
    """`tune.params`: each a field of the kind's config that is neither managed nor ablated."""
    if study.tune is None:
        return {}
    if not isinstance(kind, TrainingKind):
        raise UserInputError("tune", study.trainable, f"{study.trainable} trains nothing: remove the tune section")
    fields = kind.Config.model_fields
    tuned: dict[str, Param] = {}
    for name, raw in study.tune.params.items():
        key = f"tune.params.{name}"
        if name not in fields or name in MANAGED:
            raise did_you_mean(key, name, [k for k in fields if k not in MANAGED])
        if name in axes:
            raise UserInputError(key, raw, f"{name} is also ablated; an axis is either ablated or tuned")
        tuned[name] = expand_tuned_preset(name, raw) or parse_tuned(key, raw)
    return tuned


def _replicate_seeds(study: StudyConfig, kind: TrainableKind) -> tuple[int, ...]:
    """`replicate.seeds` with the adaptive rule's bounds, the tuning seed kept apart, and what the
    kind allows (one seed for a deterministic kind, `save:` only for one with an encoder)."""
    seeds = expand_seeds(study.replicate.seeds)
    rule = study.replicate
    if (rule.until is None) != (rule.max_seeds is None):  # the missing key is named, with its (missing) value
        raise UserInputError("replicate.until" if rule.until is None else "replicate.max_seeds", None,
                             "adaptive seeds need both: until: {dev_ci95: 0.5} and max_seeds: N")
    if rule.max_seeds is not None and rule.max_seeds < max(2, len(seeds)):
        raise UserInputError("replicate.max_seeds", rule.max_seeds,
                             f"give at least the {max(2, len(seeds))} first seeds (a CI needs two)")
    if study.save != "none" and not kind.exports_models:
        raise UserInputError("save", study.save, f"{study.trainable} has no sentence encoder to save: use save: none")
    if study.tune is not None and study.tune.seed in seeds:
        raise UserInputError("tune.seed", study.tune.seed,
                             f"tuning trials need a seed outside replicate.seeds {list(seeds)}, so that no replicate "
                             "reruns the winning tuning trial; choose another")
    if not isinstance(kind, TrainingKind) and len(seeds) > 1:
        raise UserInputError("replicate.seeds", study.replicate.seeds,
                             f"{study.trainable} is deterministic: use one seed")
    return seeds


def _base_config(study: StudyConfig, schema: type[TrialConfig], axes: dict[str, Fixed | Grid],
                 tuned: dict[str, Param], study_dir: Path | None, stage_root: Path | None,
                 found: Problems) -> tuple[dict[str, Any], dict[str, str]]:
    """What every trial's config starts from (before its cell, tuned values and seed), and the YAML
    key each field came from. A `train` key it cannot take goes to `found` and is left out, so the
    trials are still checked with the rest."""
    origins = {"model": "model", "task": "task", "language": "language", "data_dir": "data_dir"}
    base: dict[str, Any] = {"task": trial_task(study, study_dir),
                            **({"model": study.model} if study.model is not None else {})}
    if study.language is not None:
        base["language"] = study.language
    folder = study_data_dir(study, study_dir)
    if folder is not None:  # resolved here, so every trial (on any node) reads the folder the driver checked
        base["data_dir"] = str(folder)
    for name, value in study.train.items():
        if name not in schema.model_fields or name in MANAGED:
            found.add(did_you_mean(f"train.{name}", name, [k for k in schema.model_fields if k not in MANAGED]))
        elif name in axes or name in tuned:
            found.add(UserInputError(f"train.{name}", value, f"{name} is also ablated or tuned; give it in one place"))
        else:
            base[name], origins[name] = value, f"train.{name}"
    if isinstance(base.get("train_data"), dict):  # a declared data set: its files found from any node
        base["train_data"] = resolve_paths(base["train_data"], study_dir or Path.cwd())
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
    return base, origins


def study_data_dir(study: StudyConfig, study_dir: Path | None) -> Path | None:
    """The study's `data_dir:` (relative to the study file's folder), else $ORCHESTRATOR_DATA_DIR (what
    `--data-dir` sets), else `../shared/data` beside the checkout when it exists; None: the hub."""
    from trainables.data.tasks import data_dir

    if study.data_dir:
        return ((study_dir or Path.cwd()) / Path(study.data_dir).expanduser()).resolve()
    found = data_dir()
    return found.resolve() if found is not None else None


