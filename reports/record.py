"""The study record: one typed, versioned description of a launched study — its resolved plan, what
its kind declares, and where it came from — written by `launch` into the study folder and onto the
study's MLflow parent run (both `study_record.json`), and read by `status`, `report` and `verify`.

It replaces two untyped `plan.json` shapes (the folder's, the parent run's), which studies
launched before it still carry: they are read as records (`from_legacy`), so no study is lost. A
record from a newer orchestrator is one clear line, not a guess."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainables.errors import UserInputError

RECORD_VERSION = 3  # 2: the data (per-split sha256) and the plugins; 3: data files, licenses, models, resources,
# the search, the estimate, the defaults
RECORD_FILE = "study_record.json"
LEGACY_PLAN_FILE = "plan.json"


class KindRecord(BaseModel):
    """What the study's kind declares that readers need without importing it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # the YAML name (`trainable:`)
    path: str = ""  # the registry entry (`module:Class`) its trials ran
    round_name: str = "epoch"  # what one report covers: epoch, cycle, round
    round_table: bool = False  # its last report carries every round's dev as <round><n>_*
    exports_models: bool = False
    stages: list[str] = Field(default_factory=list)  # shared stages its cells use (dapt, teacher)
    tables: list[str] | None = None  # the extra report tables its cells feed (rounds, suite); None: not recorded


class DataFile(BaseModel):
    """A file a study read (a data file, a model's weights) and its sha256, as `sha256sum` computes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str  # relative to the data set's location (a model's folder)
    sha256: str
    bytes: int


class SplitRecord(BaseModel):
    """One split of a study's data as launched: how many rows, the sha256 of its rows, where they were read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int
    sha256: str
    source: str = ""  # as a person reads it: a file (and its split column's value), or a hub id [split]
    uri: str = ""  # the file, or the hub id or dataset folder
    hub_split: str | None = None  # a Hugging Face dataset's split (None: a file)
    hub_config: str | None = None


class DataRecord(BaseModel):
    """A data set the study trains and scores on (its task, per language), as it was at launch: `resume`
    refuses data whose sha256 changed, and the report names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    language: str = "en"
    kind: str = "sts"  # sts, classification or unlabeled
    origin: str = ""  # the declaration's files or hub id, or the data folder a built-in task was read from
    splits: dict[str, SplitRecord] = Field(default_factory=dict)
    overlap: int = 0  # distinct test pairs that are also train pairs
    files: list[DataFile] = Field(default_factory=list)  # every file its splits were read from, with its sha256
    title: str = ""  # its folder's PROVENANCE.md: the title
    license: str = ""  # ... and the license section
    provenance_file: str = ""
    provenance_match: bool | None = None  # every file's sha256 is one PROVENANCE.md lists (None: it lists none)


class PluginRecord(BaseModel):
    """A registered name the study uses that an installed plugin provides, and which distribution
    provided it, so the record says what to install to run the study again (status and report need
    none of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str  # kinds, objectives or poolings
    name: str  # the name in the study file
    distribution: str
    version: str
    target: str  # its module:attribute


class ModelRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # as the study names it (hub id or folder)
    source: str
    path: str  # the folder it resolved to at launch
    license: str = ""
    depth: int | None = None
    architecture: str = ""
    files: list[DataFile] = Field(default_factory=list)  # its weights


class StudyRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = RECORD_VERSION
    name: str
    kind: KindRecord
    metric: str  # the dev metric that selects rounds, trials and layers
    mode: Literal["max", "min"] = "max"
    cells: list[dict[str, Any]]  # each cell's ablation values, in plan order
    tuned: dict[str, str] = Field(default_factory=dict)  # tuned parameter -> its distribution, as written
    seeds: list[int]
    base: dict[str, Any] = Field(default_factory=dict)  # what every trial's config starts from
    origins: dict[str, str] = Field(default_factory=dict)  # config field -> the YAML key it came from
    epochs: int = 1  # reports of the longest trial
    cell_reports: list[int] = Field(default_factory=list)
    cell_costs: list[float] = Field(default_factory=list)
    tuning_trials: int = 0
    replicate_trials: int = 0
    provenance: dict[str, str] = Field(default_factory=dict)  # versions, commit, machine, written at
    data: list[DataRecord] = Field(default_factory=list)  # empty in records from before data were recorded
    plugins: list[PluginRecord] = Field(default_factory=list)
    resources: dict[str, float] = Field(default_factory=dict)  # cpu and gpu per trial
    search: dict[str, Any] = Field(default_factory=dict)  # sampler, its seed and startup trials, pruner, trials
    models: list[ModelRecord] = Field(default_factory=list)
    estimate: dict[str, float] | None = None  # `plan --estimate` or `budget:`'s pilot, when one ran
    defaults: dict[str, Any] = Field(default_factory=dict)  # the kind's defaults for every field the study left
    fusion: list[dict[str, Any]] = Field(default_factory=list)  # per cell: {members, why} (`resources.fuse`)

    @property
    def axes(self) -> list[str]:
        return list(self.cells[0]) if self.cells else []

    @staticmethod
    def cell_key(values: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in values.items()) or "all"

    @property
    def planned_cells(self) -> list[tuple[str, dict[str, Any]]]:
        return [(self.cell_key(values), dict(values)) for values in self.cells]

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str, where: str = RECORD_FILE) -> StudyRecord:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise UserInputError(where, text[:40], f"not JSON ({exc}); launch the study again to rewrite it") from None
        version = raw.get("version") if isinstance(raw, dict) else None
        if isinstance(version, int) and version > RECORD_VERSION:
            raise UserInputError(where, version, f"written by a newer orchestrator (this one reads version "
                                                 f"{RECORD_VERSION}): upgrade orchestrator to read it")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problem = exc.errors()[0]
            field = ".".join(str(p) for p in problem["loc"]) or "record"
            raise UserInputError(f"{where}: {field}", problem.get("input"), f"{problem['msg']}; launch the study "
                                                                            "again to rewrite it") from None

    @classmethod
    def from_legacy(cls, plan: dict[str, Any], name: str, trainable: str = "finetune") -> StudyRecord:
        """A `plan.json` from before records: the folder's shape (`kind_path`, `cell_costs`) or the
        parent run's (`tuned`, `round`, trial counts); what neither kept takes its default."""
        kind = KindRecord(name=trainable, path=plan.get("kind_path", ""), round_name=plan.get("round", "epoch"))
        return cls(version=0, name=name, kind=kind, metric=plan.get("metric", "dev_spearman"),
                   mode=plan.get("mode", "max"), cells=plan.get("cells") or [],
                   tuned={str(k): str(v) for k, v in (plan.get("tuned") or {}).items()},
                   seeds=plan.get("seeds") or [], base=plan.get("base") or {}, origins=plan.get("origins") or {},
                   epochs=plan.get("epochs", 1), cell_reports=plan.get("cell_reports") or [],
                   cell_costs=plan.get("cell_costs") or [], tuning_trials=plan.get("tuning_trials", 0),
                   replicate_trials=plan.get("replicate_trials", 0))
