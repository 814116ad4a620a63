"""A study's MLflow runs as one tidy DataFrame (read only): one row per trial run with its
ablation cell, phase, seed, outcome, dev and test metrics and parameter count."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml
from mlflow.tracking import MlflowClient

from reports.record import LEGACY_PLAN_FILE, RECORD_FILE, StudyRecord
from reports.store import (
    BOOKKEEPING_TAGS,
    CONFIG_TAG,
    CONSTANT_PARAMS,
    HARDWARE_TAG,
    PARETO_TAG,
    open_store,
    search_all,
    study_parent,
)
from trainables.errors import UserInputError

BASE_COLUMNS = ["run_id", "trial_key", "cell", "phase", "seed", "outcome", "status", "error"]


@dataclass(frozen=True)
class StudyRuns:
    name: str
    runs: pd.DataFrame  # one row per child run
    axes: list[str]  # ablation axes in the study's order
    metric: str  # the dev metric selection uses, e.g. dev_spearman
    report: dict = field(default_factory=dict)  # the study's `report:` block
    client: MlflowClient | None = None
    planned_seeds: int | None = None  # replicate seeds per cell in the plan
    tracking_uri: str | None = None
    study_uid: str | None = None
    parent_tags: dict = field(default_factory=dict)
    replicate: dict = field(default_factory=dict)  # the study's `replicate:` block (its seed rule)
    sources: list[dict] = field(default_factory=list)  # combined reports: each study's store and id
    clients: dict = field(default_factory=dict)  # combined reports: run id -> its study's MLflow client
    tuned: list[str] = field(default_factory=list)  # the parameters the study tunes per cell (plan's `tuned`)
    planned_cells: list[tuple[str, dict]] = field(default_factory=list)  # (cell key, axis values) of the plan
    mode: str = "max"  # whether a greater dev score is better (max) or a smaller one (min)
    round_name: str = "epoch"  # what one report of a trial covers (the kind's round: epoch, cycle, round)
    record: StudyRecord | None = None  # the study record read from the parent run (None: a combined report)
    superseded: pd.DataFrame | None = None  # replicates of a config more tuning replaced: they spent compute
    study_file: dict = field(default_factory=dict)  # the study file as launched (the parent run's study.yaml)
    configs: dict = field(default_factory=dict)  # run id -> the trial's exact config (its `orchestrator.config`)
    parent_run_id: str | None = None  # the study's MLflow parent run (its study file, record and environment)
    test_caps: list = field(default_factory=list)  # combined reports: each study's test cap (captions.test_cap)

    def parent_artifact(self, path: str) -> str | None:
        """The text of an artifact of the study's parent run (None when absent)."""
        if self.client is None or self.parent_run_id is None:
            return None
        return _artifact_text(self.client, self.parent_run_id, path)

    @property
    def test_metric(self) -> str:
        return self.metric.replace("dev_", "test_", 1)

    def replicates(self) -> pd.DataFrame:
        return self.runs[self.runs.phase == "replicate"]

    def predictions(self, run_id: str) -> pd.DataFrame | None:
        """Per-pair test predictions a replicate run stored, if any."""
        client = self.clients.get(run_id, self.client)
        if client is None:
            return None
        with tempfile.TemporaryDirectory() as folder:
            try:
                path = client.download_artifacts(run_id, "test_predictions.csv", folder)
            except Exception:  # no artifact: the run failed before test, or predates predictions
                return None
            return pd.read_csv(path)


def _number(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except (TypeError, ValueError):
            continue
    return value


def collect(tracking_uri: str, study: str, study_uid: str | None = None) -> StudyRuns:
    """Every child run of the study's parent run, as a DataFrame: the parent of the study folder
    `study_uid` when given, else the newest launch of that name."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).exists():
        raise UserInputError("--tracking-uri", tracking_uri, "no MLflow store there (a report never creates one); "
                                                            "give the study's store")
    client = open_store(tracking_uri)
    experiment, parent = study_parent(client, study, study_uid)
    if experiment is None:
        raise UserInputError("NAME", study, f"no MLflow experiment of that name at {tracking_uri}; "
                                            "give --tracking-uri of the study's store")
    if parent is None:
        raise UserInputError("NAME", study, "the experiment has no study run: was it launched by orchestrator?")
    children = search_all(client, [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    study_file = _artifact_yaml(client, parent.info.run_id, "study.yaml") or {}
    record = read_parent_record(client, parent.info.run_id, study, study_file.get("trainable", "finetune"))
    axes, tuned, planned = record.axes, list(record.tuned), record.planned_cells
    rows, superseded, configs = [], [], {}
    several = len(record.search.get("objectives") or ()) > 1  # tune.objectives: the tuning runs' frontier marks
    for run in children:
        tags = run.data.tags
        if tags.get("orchestrator.role") == "stage":  # a shared stage (e.g. DAPT) is not a trial
            continue
        row = {"run_id": run.info.run_id, "trial_key": tags.get("orchestrator.trial_key"), "cell": tags.get("cell"),
               "phase": tags.get("phase"), "seed": _number(tags.get("seed")), "outcome": tags.get("outcome"),
               "status": run.info.status, "error": tags.get("error"),
               "model_path": tags.get("orchestrator.model_path")}
        row.update({axis: _number(tags.get(f"ablate.{axis}", run.data.params.get(axis))) for axis in axes})
        row.update({name: _number(run.data.params.get(name)) for name in tuned})
        row.update(run.data.metrics)
        # bookkeeping logged as tags and params (older runs have them as metrics, read above)
        row.update({k: _number(tags[k]) for k in BOOKKEEPING_TAGS if k in tags})
        row.update({k: _number(run.data.params[k]) for k in CONSTANT_PARAMS if k in run.data.params})
        row.update({k: v for k, v in tags.items() if k.startswith(HARDWARE_TAG)})
        if several and tags.get("phase") == "tune":
            row["pareto"] = int(tags.get(PARETO_TAG) == "1")
        if CONFIG_TAG in tags:
            configs[run.info.run_id] = json.loads(tags[CONFIG_TAG])
        # a replicate of a config more tuning replaced: out of every table, but it spent compute
        (superseded if tags.get("orchestrator.superseded") == "1" else rows).append(row)
    frame = pd.DataFrame(rows, columns=BASE_COLUMNS + axes + tuned if not rows else None)
    frame = sort_runs(frame, [key for key, _ in planned])
    return StudyRuns(study, frame, axes, record.metric, study_file.get("report") or {}, client,
                     len(record.seeds) or None, tracking_uri,
                     parent.data.tags.get("orchestrator.study_uid"), dict(parent.data.tags),
                     study_file.get("replicate") or {}, tuned=tuned, planned_cells=planned,
                     mode=record.mode, round_name=record.kind.round_name, record=record,
                     superseded=pd.DataFrame(superseded), study_file=study_file, configs=configs,
                     parent_run_id=parent.info.run_id)


def sort_runs(frame: pd.DataFrame, planned: list[str]) -> pd.DataFrame:
    """Runs by phase, then cell in the plan's order (`epochs=2` before `epochs=10`, as the study file
    lists them; cells the plan no longer has after them, by name), then seed: every table's row and
    column order follows."""
    if frame.empty:
        return frame
    order = {key: i for i, key in enumerate(planned)}
    for extra in sorted(set(frame["cell"].dropna().astype(str)) - set(order)):
        order[extra] = len(order)
    rank = frame["cell"].map(lambda cell: order.get(str(cell), len(order)))
    return (frame.assign(_rank=rank).sort_values(["phase", "_rank", "seed"], kind="stable")
            .drop(columns="_rank").reset_index(drop=True))


def read_parent_record(client: MlflowClient, run_id: str, study: str, trainable: str) -> StudyRecord:
    """The study record on the parent run; a parent from before records: its `plan.json`, read as
    one (a parent with neither: an empty record, so the runs still report)."""
    text = _artifact_text(client, run_id, RECORD_FILE)
    if text:
        return StudyRecord.from_json(text, f"{RECORD_FILE} of MLflow run {run_id}")
    return StudyRecord.from_legacy(_artifact_json(client, run_id, LEGACY_PLAN_FILE) or {}, study, trainable)


def _artifact_text(client: MlflowClient, run_id: str, path: str) -> str | None:
    with tempfile.TemporaryDirectory() as folder:
        try:
            return Path(client.download_artifacts(run_id, path, folder)).read_text()
        except Exception:
            return None


def _artifact_json(client: MlflowClient, run_id: str, path: str) -> dict | None:
    text = _artifact_text(client, run_id, path)
    return json.loads(text) if text else None


def _artifact_yaml(client: MlflowClient, run_id: str, path: str) -> dict | None:
    text = _artifact_text(client, run_id, path)
    return yaml.safe_load(text) if text else None


def record_test_cap(record: StudyRecord) -> tuple[int, int | None] | None:
    """(pairs scored, pairs in the test split) where the record's `data.max_eval_samples` capped the test
    split (the split's size None where the record does not hold it or several test splits differ); None where
    test was scored whole."""
    cap = record.base.get("max_eval_samples")
    if not cap:
        return None
    sizes = {d.splits["test"].rows for d in record.data if "test" in d.splits}
    if sizes and max(sizes) <= int(cap):
        return None
    return int(cap), (sizes.pop() if len(sizes) == 1 else None)


def combine(studies: list[StudyRuns]) -> StudyRuns:
    """One StudyRuns over several studies, `study` (each study's `report.label`, else its name) the
    first axis; the first study's report settings apply. Significance then compares only cells of
    the same study unless `report.columns: study`, and the bootstrap refuses files of other pairs."""
    metrics = {s.metric for s in studies}
    if len(metrics) > 1:
        raise UserInputError("NAMES", [s.name for s in studies], f"the studies select on different metrics "
                                                                 f"({', '.join(sorted(metrics))}): report them apart")
    labels = [s.report.get("label") or s.name for s in studies]
    if len(set(labels)) < len(labels):
        raise UserInputError("NAMES", labels, "two studies share a label: give each a distinct report.label")
    frames, axes, clients = [], ["study"], {}
    for runs, label in zip(studies, labels, strict=True):
        frame = runs.runs.copy()
        frame.insert(0, "study", label)
        frame["cell"] = [f"study={label} {cell}" for cell in frame.cell]
        frames.append(frame)
        axes += [a for a in runs.axes if a not in axes]
        clients.update({run_id: runs.client for run_id in frame.run_id})
    first = studies[0]
    report = {k: v for k, v in first.report.items() if k not in ("rows", "label")}
    planned = {s.planned_seeds for s in studies}
    cells = [(f"study={label} {key}", {"study": label, **values})
             for runs, label in zip(studies, labels, strict=True) for key, values in runs.planned_cells]
    tuned = list(dict.fromkeys(name for s in studies for name in s.tuned))
    caps = [cap for s in studies for cap in (s.test_caps if s.record is None else [record_test_cap(s.record)])]
    return StudyRuns("+".join(s.name for s in studies), pd.concat(frames, ignore_index=True), axes, first.metric,
                     report, first.client, planned.pop() if len(planned) == 1 else None, first.tracking_uri,
                     first.study_uid, {}, first.replicate,
                     [{"study": s.name, "tracking_uri": s.tracking_uri, "study_uid": s.study_uid} for s in studies],
                     clients, tuned, cells, first.mode, first.round_name, test_caps=caps)
