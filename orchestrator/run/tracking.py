"""MLflow, the system of record: one experiment per study name, one parent run per study folder
(reused by `resume`, identified by the folder's study id, so a new launch of the same name never
writes into an older launch's runs), one child run per plan trial (reused when an interrupted
trial runs again; each epoch is logged once per run and step, however often it is reported).
The only module that imports mlflow; only the driver writes."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from pathlib import Path

from mlflow.entities import Metric, Param, RunStatus, RunTag

from orchestrator.run.run_names import cell_values, constant_axes, run_name, shared_view
from orchestrator.run.ui_proxy import SHARED_VIEW, SHARED_VIEW_TAG  # noqa: F401 (SHARED_VIEW: the UI's link to the view)
from orchestrator.study.config import flatten
from orchestrator.study.journal import ATTEMPT_S, Outcome, TrialRecord, remove_checkpoint
from reports.compute import trial_compute
from reports.record import RECORD_FILE, DataRecord, StudyRecord
from reports.store import (
    BOOKKEEPING_TAGS,
    CONFIG_TAG,
    CONSTANT_PARAMS,
    HARDWARE_TAG,
    PARETO_TAG,
    open_store,
    search_all,
)
from trainables.training.checkpoints import ARTIFACTS

log = logging.getLogger("orchestrator.tracking")

SPLITS = ("train", "dev", "test")
DIGEST_CHARS = 32  # MLflow keeps a dataset digest of at most 36 characters: the sha256's first 32 hex digits

ROLE = "orchestrator.role"
TRIAL_KEY = "orchestrator.trial_key"
STUDY_UID = "orchestrator.study_uid"
SUPERSEDED = "orchestrator.superseded"
MAX_TAG = 8000  # MLflow's longest tag value; a longer config is rebuilt from the study record
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
TERMINAL = {RunStatus.to_string(s) for s in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED)}
# a pruned trial was stopped early by its cell's pruner: KILLED, so the runs table does not show it as
# a finished one (its name ends `· pruned`; the `outcome` tag says pruned, the `epoch` tag when)
STATUS_OF = {Outcome.COMPLETED: "FINISHED", Outcome.PRUNED: "KILLED", Outcome.DIVERGED: "FAILED",
             Outcome.FAILED: "FAILED"}


def git_commit(folder: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _text(value: float) -> str:
    """A tag's or param's text: `3`, not `3.0`, for whole numbers."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class StudyTracker:
    def __init__(self, uri: str, study_name: str, artifact_root: Path | None = None):
        if uri.startswith(("http://", "https://")):  # fail fast when the server is down: the outage is
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # handled by ResilientTracker
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
            # MLflow prints two "View run/experiment at" lines for every run it closes on a server, after a
            # request to read the run back: one request and two lines of the launch's output per trial
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.client = open_store(uri)
        self.uri, self.study_name = uri, study_name
        experiment = self.client.get_experiment_by_name(study_name)
        if experiment is None:
            location = artifact_root.resolve().as_uri() if artifact_root and uri.startswith("sqlite") else None
            self.experiment_id = self.client.create_experiment(study_name, artifact_location=location)
        else:
            self.experiment_id = experiment.experiment_id
        if experiment is None or experiment.tags.get(EXPERIMENT_KIND) != MODEL_TRAINING:
            # MLflow 3 opens an untyped experiment on its GenAI traces page; this one is model training
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
        self.parent_id: str | None = None
        self.children: dict[str, str] = {}
        self.logged: dict[str, set[int]] = {}  # run id -> epochs already in MLflow
        # runs whose next epoch may be half in MLflow: the server stores a batch's params, metrics and
        # tags in separate transactions, so one that died mid-request can hold an epoch's scores
        # without its `epoch` tag
        self.unsure: set[str] = set()
        self.stage_links: dict[tuple[str, str], str] = {}  # (trial key, stage folder) -> stage run
        self.nodes: dict[str, list[str]] = {}
        self.data: list[DataRecord] = []  # the study's data sets (from its record), logged as dataset inputs
        self.constant: frozenset[str] = frozenset()  # axes with one value in every cell: not in run names
        self.resources: dict[str, float] = {}  # cpu and gpu each trial holds: its CPU- and GPU-hours

    def _runs(self, filter_string: str):
        return search_all(self.client, [self.experiment_id], filter_string)

    def _parents(self, study_uid: str | None):
        if study_uid is None:  # a study folder from before study ids: its experiment's one parent
            return self._runs(f"tags.`{ROLE}` = 'study'")
        return self._runs(f"tags.`{ROLE}` = 'study' AND tags.`{STUDY_UID}` = '{study_uid}'")

    def start_parent(self, study_file: Path, record: StudyRecord, version: str, study_uid: str | None = None) -> str:
        """The study folder's parent run: created on its first launch, set RUNNING again on resume.
        Another folder's launch of the same name gets a parent of its own. It carries the study file
        and the study record (`study_record.json`), which `report` and `verify` read."""
        if record.cells:
            self.client.set_experiment_tag(self.experiment_id, SHARED_VIEW_TAG,
                                           json.dumps(shared_view(record.model_dump(mode="json"))))
        existing = self._parents(study_uid)
        if existing:
            self.parent_id = existing[0].info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
            launches = int(existing[0].data.tags.get("orchestrator.launches", "1")) + 1
            self.client.set_tag(self.parent_id, "orchestrator.launches", str(launches))
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.study_name, tags={
                ROLE: "study", "orchestrator.version": version, "orchestrator.launches": "1",
                "mlflow.source.git.commit": git_commit(Path(__file__).parent),
                **({STUDY_UID: study_uid} if study_uid else {})})
            self.parent_id = run.info.run_id
            self.client.log_artifact(self.parent_id, str(study_file))
            self.log_datasets(self.parent_id, record.data)
        self.client.log_text(self.parent_id, record.to_json(), RECORD_FILE)  # every launch: the latest plan
        if record.search:  # the sampler, the pruner and their settings, by their study-file keys (tune.sampler: gp)
            self.client.log_batch(self.parent_id, tags=[RunTag(f"tune.{k}", str(v)) for k, v in record.search.items()])
        self.data = list(record.data)
        self.constant = constant_axes(record.cells)
        for run in self._runs(f"tags.`mlflow.parentRunId` = '{self.parent_id}'"):
            self.children[run.data.tags.get(TRIAL_KEY, "")] = run.info.run_id
        return self.parent_id

    def start_trial(self, record: TrialRecord, cell_key: str, ray_trial_id: str) -> str:
        """The trial's child run; an interrupted trial that runs again keeps its run."""
        if record.key in self.children:
            run_id = self.children[record.key]
            self.client.update_run(run_id, status="RUNNING")
            self.client.set_tag(run_id, "ray.trial_id", ray_trial_id)
            return run_id
        tags = {"mlflow.parentRunId": self.parent_id, TRIAL_KEY: record.key, "cell": cell_key, "phase": record.phase,
                "seed": str(record.seed), "ray.trial_id": ray_trial_id, "cell_index": str(record.cell)}
        run = self.client.create_run(self.experiment_id, run_name=run_name(record, cell_key, self.constant), tags=tags)
        self.logged[run.info.run_id] = set()
        self.children[record.key] = run.info.run_id
        self.fill_identity(run.info.run_id, record, cell_key)
        self.log_trial_datasets(run.info.run_id, record.config)
        return run.info.run_id

    def log_datasets(self, run_id: str, data: list[DataRecord], splits: tuple[str, ...] = SPLITS) -> None:
        """Each split as an MLflow dataset input of the run (its source, its rows' sha256 as the digest,
        the split as the context), so the runs page shows which data every run saw; the parent run
        also carries each split's sha256 as a tag (`data.<name>.<split>.sha256`)."""
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.data.sources import HuggingFaceDatasetSource, LocalArtifactDatasetSource
        from mlflow.entities import DatasetInput, InputTag

        inputs, tags = [], []
        names = [d.name for d in data]
        for d in data:
            name = d.name if names.count(d.name) == 1 else f"{d.name}-{d.language}"
            for split in (s for s in splits if s in d.splits):
                part = d.splits[split]
                source = (HuggingFaceDatasetSource(part.uri, config_name=part.hub_config, split=part.hub_split)
                          if part.hub_split else LocalArtifactDatasetSource(part.uri or part.source or name))
                dataset = MetaDataset(source, name=name, digest=part.sha256[:DIGEST_CHARS])
                inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags=[
                    InputTag("mlflow.data.context", split), InputTag("sha256", part.sha256),
                    InputTag("rows", str(part.rows))]))
                tags.append(RunTag(f"data.{name}.{split}.sha256", part.sha256))
        if inputs:
            self.client.log_inputs(run_id, datasets=inputs)
        if tags and run_id == self.parent_id:
            self.client.log_batch(run_id, tags=tags)

    def log_trial_datasets(self, run_id: str, config: dict) -> None:
        """The data set a trial reads (its task in its language): train and dev, and test where the
        trial scores it (replicates)."""
        from trainables.data.tasks import task_name

        task = config.get("task")
        if task is None or not self.data:
            return
        language = config.get("language")
        matches = [d for d in self.data if d.name == task_name(task) and (language is None or d.language == language)]
        splits = ("train", "dev", "test") if config.get("score_test", True) else ("train", "dev")
        if len(matches) == 1:
            self.log_datasets(run_id, matches, splits)

    def fill_identity(self, run_id: str, record: TrialRecord, cell_key: str, params: dict | None = None,
                      tags: dict | None = None) -> int:
        """Log the trial's parameters and `ablate.*` tags that the run lacks (`params`, `tags`: what
        it holds); a run created just before a crash or a failed request gets them on the next
        replay. Returns how many were missing."""
        params, tags = params or {}, tags or {}
        missing = [Param(k, str(v)[:6000]) for k, v in flatten("", record.config, {}).items() if k not in params]
        labels = [RunTag(f"ablate.{k}", str(v)) for k, v in cell_values(cell_key).items()
                  if f"ablate.{k}" not in tags]
        exact = json.dumps(record.config, sort_keys=True, default=str)
        if CONFIG_TAG not in tags and len(exact) <= MAX_TAG:  # the config as the trial got it, types and all
            labels.append(RunTag(CONFIG_TAG, exact))
        for start in range(0, len(missing), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run_id, params=missing[start:start + 100],
                                  tags=labels if start == 0 else [])
        if labels and not missing:
            self.client.log_batch(run_id, tags=labels)
        return len(missing) + len(labels)

    def log_epoch(self, key: str, metrics: dict, node_ip: str | None = None) -> None:
        """One report of a trial, in one request; `node_ip`: where it ran (tagged `ray.node_ip`, and
        every node it ran on, in order, in `ray.nodes`), sent along when it changed."""
        run_id = self.children.get(key)
        if run_id is None:
            return
        tags = []
        if node_ip and self.nodes.get(key, [None])[-1] != node_ip:
            self.nodes.setdefault(key, []).append(node_ip)
            tags = [RunTag("ray.node_ip", node_ip), RunTag("ray.nodes", ",".join(self.nodes[key]))]
        step = int(metrics.get("epoch", 0))
        if run_id not in self.logged:  # a run of an earlier driver: ask MLflow what it already holds
            self.logged[run_id] = self._epochs_logged(run_id)
            self.unsure.add(run_id)
        now = int(time.time() * 1000)
        numbers = {k: v for k, v in metrics.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))}
        numeric = [Metric(k, float(v), now, step) for k, v in numbers.items()
                   if k not in BOOKKEEPING_TAGS and k not in CONSTANT_PARAMS and k != ATTEMPT_S]
        params, epoch_done = [], False
        if "epoch" in metrics and step in self.logged[run_id]:
            numeric = []  # a retried trial reports an epoch again: MLflow keeps the first, identical report
        elif numeric:
            tags += [RunTag(k, _text(numbers[k])) for k in BOOKKEEPING_TAGS if k in numbers]
            params = [Param(k, _text(numbers[k])) for k in CONSTANT_PARAMS if k in numbers]  # same value each time
            epoch_done = "epoch" in metrics
            if epoch_done and run_id in self.unsure and self._holds_step(run_id, numeric[0].key, step):
                numeric = []  # its scores got in before an outage and its tags did not: only the tags now
        if numeric or tags:
            self.client.log_batch(run_id, metrics=numeric, params=params, tags=tags)
            self.unsure.discard(run_id)
            if epoch_done:
                self.logged[run_id].add(step)

    def _epochs_logged(self, run_id: str, run=None) -> set[int]:
        """The epochs a run already holds: up to its `epoch` tag (or, for a run logged before the
        round counters became tags, the steps of its `epoch` metric)."""
        last = (run or self.client.get_run(run_id)).data.tags.get("epoch")
        if last is not None:
            return set(range(int(float(last)) + 1))
        return {m.step for m in self.client.get_metric_history(run_id, "epoch")}

    def _holds_step(self, run_id: str, metric: str, step: int) -> bool:
        """Does the run hold `metric` at `step` (one epoch's scores are stored in one transaction)?"""
        return any(m.step == step for m in self.client.get_metric_history(run_id, metric))

    def set_tag(self, key: str, name: str, value: str) -> None:
        if key in self.children:
            self.client.set_tag(self.children[key], name, value)

    def link_stage(self, key: str, stage_dir: str) -> None:
        """A stage (a DAPT checkpoint, a distill teacher) as its own run, once, with its loss curve and
        config; every trial that used it carries its run id and cache key."""
        run_id = self.children.get(key)
        record_path = Path(stage_dir) / "stage.json"
        if run_id is None or not record_path.exists() or (key, stage_dir) in self.stage_links:
            return
        record = json.loads(record_path.read_text())
        existing = self._runs(f"tags.`{ROLE}` = 'stage' AND tags.`stage.key` = '{record['key']}'")
        if existing:
            stage_run = existing[0].info.run_id
        else:
            stage_run = self.client.create_run(self.experiment_id, run_name=f"{record['kind']} {record['key']}", tags={
                ROLE: "stage", "stage.key": record["key"], "stage.kind": record["kind"], "stage.dir": stage_dir,
                "mlflow.parentRunId": self.parent_id}).info.run_id
            now = int(time.time() * 1000)
            curve = [Metric(f"{record['kind']}_loss", float(v), now, i + 1)
                     for i, v in enumerate(record.get("loss_curve", []))]
            params = [Param(k, str(v)[:6000]) for k, v in flatten("", record["params"], {}).items()]
            for start in range(0, max(1, len(curve)), 1000):
                self.client.log_batch(stage_run, metrics=curve[start:start + 1000],
                                      params=params if start == 0 else [])
            self.client.set_terminated(stage_run, status="FINISHED")
        self.client.set_tag(run_id, "stage.run_id", stage_run)  # the last stage linked (a trial uses one or two)
        self.client.set_tag(run_id, "stage.key", record["key"])
        self.client.set_tag(run_id, f"stage.{record['kind']}.run_id", stage_run)
        self.stage_links[(key, stage_dir)] = stage_run

    def log_artifact(self, key: str, path: str) -> None:
        if key in self.children:
            self.client.log_artifact(self.children[key], path)

    def log_artifacts(self, key: str, folder: str, artifact_path: str) -> None:
        if key in self.children:
            self.client.log_artifacts(self.children[key], folder, artifact_path)

    def finish_trial(self, record: TrialRecord) -> None:
        run_id = self.children.get(record.key)
        if run_id is None or record.outcome is None:
            return
        tags = [RunTag("outcome", record.outcome.value)]  # one request: a 10,000-trial study pays each per trial
        if record.outcome == Outcome.PRUNED and record.cell_key:
            tags.append(RunTag("mlflow.runName", run_name(record, record.cell_key, self.constant)))
        if record.error:
            tags.append(RunTag("error", record.error[:5000]))
        tags += [RunTag(f"{HARDWARE_TAG}{k}", v[:5000]) for k, v in record.hardware.items()]
        now = int(time.time() * 1000)
        spent = [Metric(k, v, now, 0) for k, v in trial_compute(record.wall_s, self.resources).items()]
        self.client.log_batch(run_id, metrics=spent, tags=tags)
        self.client.set_terminated(run_id, status=STATUS_OF[record.outcome])

    def log_compute(self, records: dict[str, TrialRecord], cell_keys: dict[int, str]) -> dict[str, float]:
        """What the study spent so far onto its parent run: `compute.*` metrics (CPU- and GPU-hours in
        total and per phase, the pruned trials' share) and `compute.csv` (per cell and phase)."""
        import tempfile

        import pandas as pd

        from reports.compute import spent, totals

        if self.parent_id is None:
            return {}
        trials = pd.DataFrame([{"cell": cell_keys.get(r.cell, str(r.cell)), "phase": r.phase,
                                "outcome": r.outcome.value if r.outcome else None, "wall_s": r.wall_s}
                               for r in records.values()])  # superseded replicates spent their time too
        figures = totals(trials, self.resources) if len(trials) else {}
        if not figures:
            return {}
        now = int(time.time() * 1000)
        self.client.log_batch(self.parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in figures.items()])
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "compute.csv"
            spent(trials, self.resources).to_csv(path, index=False)
            self.client.log_artifact(self.parent_id, str(path))
        return figures

    def mark_pareto(self, pareto: dict[str, bool]) -> int:
        """Tag each tuning run on its cell's Pareto set `orchestrator.pareto: 1`, and one that more tuning
        took off it `0`; only the runs whose tag changes are written. How many were."""
        tagged = {run.data.tags.get(TRIAL_KEY, "") for run in self._runs(
            f"tags.`mlflow.parentRunId` = '{self.parent_id}' AND tags.`{PARETO_TAG}` = '1'")}
        changed = [(key, on) for key, on in pareto.items() if on != (key in tagged) and key in self.children]
        for key, on in changed:
            self.client.set_tag(self.children[key], PARETO_TAG, "1" if on else "0")
        return len(changed)

    def attach_parent(self, study_uid: str | None = None) -> str:
        """The study folder's existing parent run and its children, without changing their status."""
        existing = self._parents(study_uid)
        if not existing:
            raise RuntimeError(f"no study run for {self.study_name} at {self.uri}")
        self.parent_id = existing[0].info.run_id
        for run in self._runs(f"tags.`mlflow.parentRunId` = '{self.parent_id}'"):
            self.children[run.data.tags.get(TRIAL_KEY, "")] = run.info.run_id
        return self.parent_id

    def sync(self, records: dict[str, TrialRecord], cell_keys: dict[int, str]) -> dict[str, int]:
        """Bring MLflow up to the journal (idempotent): create the runs it lacks, log the epochs it
        lacks, close the runs of finished trials with their outcome and artifacts."""
        counts = {"runs": 0, "epochs": 0, "closed": 0, "filled": 0}
        if not self.constant:  # attached, not started: the names of the runs it creates as start_parent's
            self.constant = constant_axes(cell_values(key) for key in cell_keys.values())
        existing = {run.data.tags.get(TRIAL_KEY, ""): run
                    for run in self._runs(f"tags.`mlflow.parentRunId` = '{self.parent_id}'")}
        for key, record in records.items():
            run = existing.get(key)
            if run is None:
                self.children.pop(key, None)
                self.start_trial(record, cell_keys.get(record.cell, str(record.cell)), "")
                counts["runs"] += 1  # its epochs logged: none yet
            else:
                self.children[key] = run.info.run_id
                counts["filled"] += self.fill_identity(run.info.run_id, record,
                                                       cell_keys.get(record.cell, str(record.cell)),
                                                       run.data.params, run.data.tags)
                self.logged[run.info.run_id] = self._epochs_logged(run.info.run_id, run)
                self.unsure.add(run.info.run_id)  # the outage may have cut its last write in half
            logged = self.logged[self.children[key]]  # log_epoch adds what it writes
            for result in record.results:
                if "epoch" in result and int(result["epoch"]) not in logged:
                    self.log_epoch(key, result)
                    logged.add(int(result["epoch"]))
                    counts["epochs"] += 1
            if record.finished and (run is None or run.info.status not in TERMINAL):
                for name in ARTIFACTS if record.checkpoint else ():
                    path = Path(record.checkpoint) / name
                    if path.exists():
                        self.log_artifact(key, str(path))
                self.finish_trial(record)
                counts["closed"] += 1
            if record.finished:
                remove_checkpoint(record.checkpoint)  # its results are safe now
        return counts

    def reconcile(self, records: dict[str, TrialRecord], finished: bool,
                  pareto: dict[str, bool] | None = None) -> dict[str, int]:
        """Close every child run the journal has an outcome for; runs of trials that are not
        finished are KILLED (a later resume sets them RUNNING again). `pareto`: each tuning trial of a
        multi-objective study's finished cells, on its cell's Pareto set or not (`StudyState.pareto_marks`).
        Counts what it changed."""
        changed = {"closed": 0, "killed": 0}
        for key, record in records.items():
            if record.superseded and key in self.children:
                self.client.set_tag(self.children[key], SUPERSEDED, "1")  # the report leaves it out
        if pareto:
            self.mark_pareto(pareto)
        # only the runs still open: a finished 10,000-trial study is not read again in full
        for run in self._runs(f"tags.`mlflow.parentRunId` = '{self.parent_id}' AND attributes.status = 'RUNNING'"):
            record = records.get(run.data.tags.get(TRIAL_KEY, ""))
            if run.info.status in TERMINAL:
                continue
            if record is not None and record.finished:
                self.client.set_tag(run.info.run_id, "outcome", record.outcome.value)
                if record.outcome == Outcome.PRUNED and record.cell_key:
                    self.client.set_tag(run.info.run_id, "mlflow.runName",
                                           run_name(record, record.cell_key, self.constant))
                self.client.set_terminated(run.info.run_id, status=STATUS_OF[record.outcome])
                changed["closed"] += 1
            else:
                self.client.set_terminated(run.info.run_id, status="KILLED")
                changed["killed"] += 1
        if self.parent_id:
            self.client.set_terminated(self.parent_id, status="FINISHED" if finished else "KILLED")
        return changed
