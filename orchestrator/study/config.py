"""The study file: YAML -> a validated, frozen StudyConfig. Nothing is launched or written here.

Every problem becomes one UserInputError naming the YAML key path, the bad value and the fix.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.study.yaml_file import apply_overrides, read_study_file
from trainables.data.declaration import DataDeclaration, parse_declaration
from trainables.errors import Problems, UserInputError, UserInputErrors
from trainables.kinds import KINDS

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

DAPT_MOVED = ("DAPT is now `trainable: finetune` with `pretrain: mlm` (or rtd, simcse, micse) in train or ablate; "
              "rename the dapt_* keys to pretrain_* (dapt_objective -> pretrain, dapt_steps -> pretrain_steps)")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TuneSection(Section):
    """Nuisance parameters searched by Optuna inside each ablation cell, on the dev split."""

    params: dict[str, Any] = Field(min_length=1, description="the kind's keys to search, each a range "
                                                              "({loguniform: [1e-5, 1e-4]}, {choice: [...]}, ...) "
                                                              "or a preset name (lr: default)")
    trials: int = Field(default=8, ge=1, description="Optuna trials per ablation cell")
    objectives: list[Literal["dev", "params"]] = Field(
        default=["dev"], min_length=1, description="what each cell's search optimises: dev (the study's dev metric, "
                                                   "in its direction) and, for a trade-off, params (the trained "
                                                   "encoder's parameter count, minimised); two objectives make each "
                                                   "cell's Optuna study multi-objective (sampler nsga2 and scheduler "
                                                   "none by default), keep its Pareto set, and replicate its "
                                                   "Pareto trial with the best dev score")
    sampler: Literal["tpe", "random", "gp", "cmaes", "qmc", "bruteforce", "nsga2"] = Field(
        default="tpe", description="Optuna's sampler in each cell: tpe (TPE), random, gp (Gaussian-process Bayesian "
                                   "optimisation), cmaes (CMA-ES over the numeric ranges; lists of values drawn at "
                                   "random), qmc (a scrambled quasi-random sequence, qmc_type), bruteforce (each "
                                   "configuration of a space of lists and int ranges once, in a seeded order), nsga2 "
                                   "(NSGA-II, a genetic algorithm: population_size; the default with several "
                                   "objectives); tpe, gp and cmaes draw startup_trials at random first")
    scheduler: Literal["asha", "hyperband", "none"] = Field(
        default="asha", description="the pruner in each cell, compared only with trials of the same cell: asha "
                                    "(Optuna's successive halving, asynchronous), hyperband (Optuna's Hyperband: "
                                    "successive halving in several brackets, each trial in one), none (train every "
                                    "trial to the end; the default with several objectives, which Optuna cannot "
                                    "prune)")
    grace_epochs: int = Field(default=1, ge=1, description="rounds before the pruner may stop a trial (min_resource; "
                                                           "hyperband: in its most aggressive bracket)")
    reduction_factor: int = Field(default=3, ge=2, description="the pruner's η: 1 in η trials goes on at each rung")
    startup_trials: int = Field(default=3, ge=1, description="random trials per cell before tpe, gp or cmaes models "
                                                             "the space")
    qmc_type: Literal["sobol", "halton"] = Field(default="sobol", description="the sequence of sampler: qmc")
    population_size: int | None = Field(default=None, ge=2, description="sampler nsga2: trials per generation, the "
                                                                        "first drawn at random (default: a quarter "
                                                                        "of tune.trials within 4..50, at most half "
                                                                        "of them; Optuna's own 50 would leave a "
                                                                        "smaller search random)")
    sampler_seed: int = Field(default=1_000, description="seeds each cell's sampler (plus the cell's index): another "
                                                        "value draws other configurations, for a searcher's spread")
    seed: int = Field(default=10_000, description="the seed every tuning trial trains with; never one of "
                                                  "replicate.seeds, so no replicate reruns the trial that won the "
                                                  "tuning")

    @model_validator(mode="before")
    @classmethod
    def several_objectives_defaults(cls, data: Any) -> Any:
        """Several objectives: NSGA-II and no pruner unless the file names others (Optuna cannot prune a
        multi-objective study; a pruner named anyway is refused by `objective_problems`)."""
        objectives = data.get("objectives") if isinstance(data, dict) else None
        if isinstance(objectives, list) and len(objectives) > 1:
            return {"sampler": "nsga2", "scheduler": "none", **data}
        return data


class UntilSection(Section):
    """Adaptive seeds: more seeds for a cell until its dev mean is precise enough."""

    dev_ci95: float = Field(gt=0, description="stop adding seeds to a cell once the 95 % confidence interval of its "
                                              "mean dev score is at most +- this many points")
    rule: Literal["two_stage", "sequential"] = Field(
        default="two_stage", description="two_stage: the planned seeds' dev spread fixes each cell's total once "
                                         "(Stein's two-stage rule: an exact interval, a smaller downward bias of the "
                                         "std); sequential: one more seed while the interval is wider than dev_ci95")


class ReplicateSection(Section):
    """The seeds: each cell's best configuration is rerun once per seed, and only these runs score test."""

    seeds: Any = Field(default=[0], description="a list of seeds, or a count N meaning 0..N-1")
    max_seeds: int | None = Field(default=None, ge=2, description="with `until`: at most this many seeds per cell")
    until: UntilSection | None = Field(default=None, description="add seeds to a cell until its dev mean is this "
                                                                 "precise")


class DataSection(Section):
    """Caps for quick studies: a fixed random subset, the same rows for every trial and seed."""

    max_train_samples: int | None = Field(default=None, ge=1, description="at most this many training pairs (null: "
                                                                          "all)")
    max_eval_samples: int | None = Field(default=None, ge=1, description="at most this many dev and test pairs each "
                                                                          "(null: all)")


class ResourcesSection(Section):
    """What each trial asks of the cluster; torch threads follow the CPUs granted."""

    cpu: float = Field(default=1.0, gt=0, description="CPUs per trial")
    gpu: float = Field(default=0.0, ge=0, description="GPUs per trial; a fraction packs several trials on one GPU")
    fuse: Literal["auto", "off"] | int = Field(
        default="auto", description="train a cell's replicates as fused arrays of this many members, one stacked "
                                    "model in one process (each member still its own trial); off: each trial alone; "
                                    "auto: fused on a GPU where the kind can (up to 8), alone on CPUs")

    @field_validator("fuse", mode="before")
    @classmethod
    def _members(cls, value: Any) -> Any:
        if value in ("auto", "off") or (type(value) is int and value >= 1):
            return value
        raise ValueError("give auto, off, or the members of an array (a whole number of at least 1)")


class TrackingSection(Section):
    """Where MLflow keeps the runs."""

    mlflow_uri: str = Field(default="sqlite:///mlflow.db", description="sqlite:///path (relative to the study file's "
                                                                        "folder) or an http(s):// tracking server")


class BudgetSection(Section):
    """A limit on the estimated wall time, checked by a pilot before launch."""

    hours: float = Field(gt=0, description="refuse to launch a plan whose estimated wall time exceeds this")


class LatexSection(Section):
    """How the LaTeX tables fit a paper."""

    width: Literal["auto", "column", "page"] = Field(
        default="auto", description="never scaled down: column keeps a table in one column of a two-column paper (at "
                                    "\\small, turned round, or at \\footnotesize), page makes it a table* across the "
                                    "page; auto: the first of those that fits, column first")


class ReportSection(Section):
    """What the report writes and how its tables are laid out and tested."""

    formats: list[Literal["markdown", "latex", "csv"]] = Field(
        default=["markdown", "latex", "csv"], description="what `report` writes by default (--format overrides); "
                                                          "runs.csv is always written: verify recomputes from it")
    latex: LatexSection = LatexSection()
    labels: dict[str, str] = Field(default={}, description="display names of axes and values in tables and plots, e.g. "
                                                           "{layer: Layer, pooling: Pooling, cls: CLS}")
    baseline: dict[str, Any] | None = Field(default=None, description="the cell every other is tested against, a value "
                                                                      "of the column axis: {layer: last} or {layer: 6}")
    rows: list[str] | None = Field(default=None, description="ablated axes down the tables (default: all but columns)")
    columns: str | None = Field(default=None, description="the ablated axis across (default: layer)")
    decimals: int = Field(default=2, ge=0, le=6, description="decimals of the scores in the tables")
    notes: Literal["short", "full"] = Field(
        default="short", description="the footnotes under each table: short (a few lines: what the marks mean; "
                                     "report.md keeps every detail under 'Notes in full') or full (every detail under "
                                     "the table)")
    correction: Literal["holm", "bonferroni", "none"] = Field(
        default="holm", description="multiple-comparison correction of the marks within each table")
    alpha: float = Field(default=0.05, gt=0, lt=1, description="significance level of the marks")
    seed_test: Literal["t", "wilcoxon", "permutation"] = Field(
        default="t", description="the paired test over seeds behind the † marks: t (paired t-test, the default), "
                                 "wilcoxon (signed-rank) or permutation (exact sign flips); rank and permutation tests "
                                 "need many seeds to reach significance after correction, and the footnote says when "
                                 "they cannot")
    label: str | None = Field(default=None, description="this study's name in a report across studies (default: its "
                                                        "name)")
    detect: float | None = Field(default=None, gt=0, description="a difference of the test metric (×100 points) the "
                                                                 "study should be able to see: stats.csv and the "
                                                                 "footnote give the seeds the paired t-test needs to "
                                                                 "detect it with 80 % power")
    rope: float | None = Field(default=None, gt=0, description="points (×100) either side of 0 within which a cell "
                                                               "counts as practically equivalent to the baseline: "
                                                               "P(better), P(equivalent), P(worse) from a Bayesian "
                                                               "test over seeds, the equivalence table and the ≈ mark")
    aso: bool = Field(default=False, description="Almost Stochastic Order against the baseline (Dror et al. 2019, as "
                                                 "deepsig computes it): each comparison's ε_min both ways in stats.csv "
                                                 "and the aso table, ≻ where one is below τ = 0.2")
    expected_max: Literal["with_replacement", "without_replacement"] = Field(
        default="with_replacement", description="the expected best dev score over n tuning trials (Dodge et al. 2019): "
                                                "with_replacement (the paper's empirical-CDF estimator) or "
                                                "without_replacement (unbiased for n up to the trials run)")


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_FIX = "use letters, digits, '_', '.' or '-' (it names folders)"


class StudyConfig(Section):
    name: str = Field(pattern=f"^{NAME_PATTERN.pattern}$", max_length=100,
                      description="the study's name: its folder, its MLflow experiment, its report folder")
    trainable: str = Field(default="finetune", json_schema_extra={"enum": list(KINDS)},
                           description="a kind from the closed registry trainables.kinds.KINDS")
    task: str | DataDeclaration = Field(default="stsb", description="a built-in task (stsb, stsb_multi_mt, korsts, "
                                                                    "sick, sick_full, mrpc) or a data set of your own: "
                                                                    "a mapping with name, type, and files, file or hf")
    model: str | None = Field(default=None, description="hub id or local folder; may be left out when ablate.model "
                                                        "lists the models")
    language: str | None = Field(default=None, description="the language of a multilingual task (stsb_multi_mt: de, "
                                                           "es, ...)")
    ablate: dict[str, Any] = Field(default={}, description="the grid of the paper's table: each key of the kind with a "
                                                           "list of values (layer: all for every layer); every "
                                                           "combination is a cell")
    tune: TuneSection | None = None
    replicate: ReplicateSection = ReplicateSection()
    train: dict[str, Any] = Field(default={}, description="the kind's keys fixed for every trial (epochs, batch_size, "
                                                          "loss, ...)")
    data: DataSection = DataSection()
    resources: ResourcesSection = ResourcesSection()
    tracking: TrackingSection = TrackingSection()
    report: ReportSection = ReportSection()
    storage_path: str | None = Field(default=None, description="the folder of study folders (default ./studies); on a "
                                                               "cluster, one every node sees")
    data_dir: str | None = Field(default=None, description="the data folder, relative to the study file's folder "
                                                           "(default: --data-dir or $ORCHESTRATOR_DATA_DIR, else "
                                                           "../shared/data beside the checkout, else the hub)")
    max_failures: int = Field(default=2, ge=0, description="retries of a failed trial from its last checkpoint")
    max_concurrent: int | None = Field(default=None, ge=1, description="at most this many trials at once (default: the "
                                                                        "cluster's slots)")
    budget: BudgetSection | None = Field(default=None, description="a pilot estimates the plan before launch; over "
                                                                   "budget, launch refuses")
    save: Literal["none", "best_per_cell", "all_replicates"] = Field(
        default="none", description="models kept in sentence-transformers format (studies/NAME/models, MLflow "
                                    "artifacts): none, the best-dev replicate of each cell, or every replicate")


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Nested mappings as dotted keys (`tune.params.lr`), for MLflow params and study comparisons."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names valid at `loc` (the parent of the offending key)."""
    current: type[BaseModel] | None = model
    for part in loc:
        field = current.model_fields.get(part) if isinstance(current, type) and isinstance(part, str) else None
        if field is None:
            return []
        annotation = field.annotation
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        current = next((a for a in candidates if issubclass(a, BaseModel)), None)
        if current is None:
            return []
    return list(current.model_fields) if isinstance(current, type) else []


def explain(error: ErrorDetails, schema: type[BaseModel] = StudyConfig) -> UserInputError:
    """One pydantic error as one line: key path, bad value, fix (with a did-you-mean)."""
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith(("function-", "literal["))))
    key = ".".join(str(p) for p in loc) or "study"
    if error["type"] == "extra_forbidden":
        valid = _fields_at(schema, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        fix = (f"unknown key; did you mean {close[0]}?" if close else "unknown key") + \
            f" Valid keys here: {', '.join(valid)}"
        return UserInputError(key, error.get("input"), fix)
    if error["type"] == "missing":
        return UserInputError(key, None, "this key is required")
    if error["type"] == "string_pattern_mismatch" and key == "name":
        return UserInputError(key, error.get("input"), NAME_FIX)
    message = error["msg"]
    if error["type"] == "literal_error":
        message = message.replace("Input should be", "use")
    message = message.removeprefix("Value error, ")  # a validator's own sentence
    return UserInputError(key, error.get("input"), message[0].lower() + message[1:])


def parse_study(raw: Any, source: str = "study", launched: bool = False) -> StudyConfig:
    """The study file's structure checked, every problem at once (UserInputErrors when there are several;
    see orchestrator.study.plan for the deep checks). `launched`: a launched study's own copy, whose kind may
    come from a plugin no longer installed (its record says which; status and report need no kind code)."""
    if not isinstance(raw, dict):
        raise UserInputError(source, type(raw).__name__, "a study file is a YAML mapping of keys such as name, model")
    found = Problems()
    kind = raw.get("trainable", "finetune")
    if kind == "dapt":
        found.add(UserInputError("trainable", kind, DAPT_MOVED))
    elif not isinstance(kind, str):
        found.add(KINDS.unknown("trainable", kind))
    elif not launched:
        found.check(KINDS.entry, kind, "trainable")  # an unknown name lists the kinds, a plugin's with its package
    if isinstance(raw.get("task"), dict):  # a declared data set: its own keys, one line each
        declared = found.check(parse_declaration, raw["task"])
        raw = {**raw, "task": declared} if declared is not None else {k: v for k, v in raw.items() if k != "task"}
    study = None
    locations: list[tuple[int | str, ...]] = []
    stands = not found.errors  # the kind and a declared task are sound: the rest can be checked in depth
    try:
        study = StudyConfig.model_validate(raw)
    except ValidationError as exc:  # pydantic collects every one of them
        found.add(*(explain(error) for error in exc.errors()))
        locations = [error["loc"] for error in exc.errors()]
    ablate = raw.get("ablate")
    if raw.get("model") is None and not (isinstance(ablate, dict) and "model" in ablate):
        found.add(UserInputError("model", None, "this key is required: a hub id or a model folder (or list the "
                                                "models under ablate.model)"))
        stands = False
    if found.errors:
        raise StructureErrors(found.errors, salvaged(raw, locations) if stands and study is None else None, raw)
    return cast(StudyConfig, study)  # validated: a failed validation added its errors above


class StructureErrors(UserInputErrors):
    """The study file's structural problems, with what is left of the file once the keys at fault are taken
    out (`salvaged`, None where the rest cannot be checked on its own: no model, an unknown kind or task), so
    that the checks that need the model and the data still run and every mistake of the file is said at once."""

    def __init__(self, errors: list[UserInputError], salvaged: StudyConfig | None, raw: Any) -> None:
        super().__init__(errors)
        self.salvaged, self.raw = salvaged, raw


def salvaged(raw: dict[str, Any], locations: list[tuple[int | str, ...]]) -> StudyConfig | None:
    """The study with the keys pydantic refused taken out (a list or mapping value at fault goes whole), or
    None when what is taken out is what the deep checks stand on (the model, the kind, the task)."""
    rest = copy.deepcopy(raw)
    for loc in locations:
        path = [p for p in loc if not (isinstance(p, str) and p.startswith(("function-", "literal[")))]
        path = path[:next((i for i, p in enumerate(path) if not isinstance(p, str)), len(path))]
        if not path or path[0] in ("model", "trainable", "task"):
            return None
        if path == ["name"]:
            rest["name"] = "study"  # the name only names folders, which a check does not write
            continue
        parent: object = rest
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or path[-1] not in parent:
            return None
        del parent[path[-1]]
    try:
        return StudyConfig.model_validate(rest)
    except ValidationError:
        return None


def in_file_order(errors: list[UserInputError], raw: Any) -> list[UserInputError]:
    """The errors in the order their keys appear in the study file (a key the file lacks, last)."""
    keys = list(flatten("", raw, {})) if isinstance(raw, dict) else []

    def position(error: UserInputError) -> int:
        key = str(error.key)
        return next((i for i, k in enumerate(keys) if k == key or k.startswith(key + ".") or key.startswith(k + ".")),
                    len(keys))

    return sorted(errors, key=position)


def models_of(study: StudyConfig) -> list[str]:
    """Every model the study uses: `model`, or the values of `ablate.model`."""
    ablated = study.ablate.get("model")
    if ablated is None:
        return [cast(str, study.model)]  # parse_study requires a model unless ablate.model lists them
    return [str(m) for m in (ablated if isinstance(ablated, list) else [ablated])]


@dataclass(frozen=True)
class StudySpec:
    """A validated study: its config, the file it came from (relative paths in it are relative to the
    file's folder), the overrides applied on top, and the YAML a launch stores as the study folder's
    `study.yaml`: the file itself when nothing was overridden, else the merged result, so `resume` and
    the report see what really ran."""

    config: StudyConfig
    path: Path
    text: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def base_dir(self) -> Path:
        return self.path.resolve().parent

    def raw(self) -> Any:
        """The study's YAML as read (the order of its keys is the order its problems are said in)."""
        try:
            return yaml.safe_load(self.text) if self.text else self.config.model_dump()
        except yaml.YAMLError:
            return self.config.model_dump()


def read_study(path: str | Path, overrides: Iterable[str] = (), name: str | None = None,
               launched: bool = False) -> StudySpec:
    """Read a study file, apply command-line overrides (`train.lr=3e-5`) and a new `name`, validate the
    result (structure only; see orchestrator.study.plan for the deep checks)."""
    path = Path(path)
    text, raw = read_study_file(path)
    overrides = tuple(overrides)
    if name is not None and not (NAME_PATTERN.fullmatch(name) and len(name) <= 100):
        raise UserInputError("--name", name, NAME_FIX)
    if not overrides and name is None:
        return StudySpec(parse_study(raw, str(path), launched), path, text)
    if not isinstance(raw, dict):
        parse_study(raw, str(path))  # the same one line as without overrides
    merged = apply_overrides(raw, overrides)
    if name is not None:
        merged["name"] = name
    shown = re.sub(r"\s+", " ", " ".join([*overrides, *([f"--name {name}"] if name is not None else [])]))
    merged_text = f"# {path} with {shown}\n" + yaml.safe_dump(merged, sort_keys=False, allow_unicode=True)
    return StudySpec(parse_study(merged, str(path)), path, merged_text, overrides)


def load_study(path: str | Path, overrides: Iterable[str] = (), name: str | None = None,
               launched: bool = False) -> StudyConfig:
    """Read and validate a study file with any overrides (structure only; see orchestrator.study.plan);
    `launched`: a study folder's own copy (its kind need not be installed)."""
    return read_study(path, overrides, name, launched).config


def study_json_schema() -> dict[str, Any]:
    """JSON Schema of the study file, for editor completion."""
    return StudyConfig.model_json_schema()
