"""Launch and resume a study on Ray Tune: one Tuner for the whole ablate x tune x replicate plan.

The study folder (`<storage>/<name>/`) holds the study file, the journal (the plan's source of
truth), Ray's experiment folders (one per launch) and MLflow artifacts. `resume` is a launch
that replays the journal: finished trials are not rerun, interrupted ones continue from their
last checkpoint in their own MLflow run.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.run.ray_session import (
    Stops,
    check_cluster,
    connect_ray,
    graceful_sigterm,
    no_forwarded_secrets,
    slots,
)
from orchestrator.study.config import StudyConfig, StudySpec, read_study
from orchestrator.study.data import check_unchanged
from orchestrator.study.edits import check_edit
from orchestrator.study.folder import BeforeLaunch, StudyFolder
from orchestrator.study.journal import Journal, full_disk_fix
from orchestrator.study.plan import StudyPlan, build_plan, plan_record
from orchestrator.study.state import StudyState
from trainables.errors import StorageFullError, UserInputError, storage_full

if TYPE_CHECKING:
    from reports.build import Report


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended: its study folder, the trials' counts by outcome, whether every planned trial
    finished, and what closing the MLflow runs changed."""

    study_dir: Path
    counts: dict[str, int]
    finished: bool
    reconciled: dict[str, int]
    report: Report | None = None  # the report the public API's launch wrote at the end

    @property
    def study(self) -> StudyFolder:
        return StudyFolder(self.study_dir)


def provenance() -> dict[str, str]:
    """Where a study record came from: the key packages' versions, the commit of this orchestrator's
    checkout (and whether it had uncommitted changes), the driver's machine, and when."""
    import datetime

    from reports.environment import git_state, machine, package_versions

    return {**package_versions(), **git_state(), **{f"driver_{k}": v for k, v in machine().items()},
            "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def package_version() -> str:
    try:
        return version("ablation-orchestrator")
    except PackageNotFoundError:
        return "0+unknown"


def tracking_uri(study: StudyConfig, base: Path) -> str:
    """A relative SQLite path is taken relative to the study file's folder."""
    uri = study.tracking.mlflow_uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_absolute():
        return "sqlite:///" + str((base / uri.removeprefix("sqlite:///")).resolve())
    return uri


def launch(study_file: StudySpec | str | Path, storage: str | Path | None = None, address: str | None = None,
           max_concurrent: int | None = None, resume: bool = False, progress: bool = True,
           executor: Callable | None = None, checked: StudyPlan | None = None,
           stops: Stops | None = None) -> LaunchResult:
    """Validate, plan, then run the study (or the rest of it) to the end, as the folder's one writer.
    `executor` replaces Ray Tune as what runs the trials (`run_tuner`'s signature; benchmarks/scale.py
    passes one whose trials take no time, to measure the driver's own costs). `checked`: the plan a
    loaded study already built for this folder (`orc.load_study`), used by a new launch instead of a second.
    `stops`: where the stop signal that ends it early is kept, and what to do if the local Ray is stopped
    under it (`ray_session.Stops`; the CLI's)."""
    spec = study_file if isinstance(study_file, StudySpec) else read_study(study_file)
    study = spec.config
    folder = StudyFolder.of(study, storage)
    before = folder.before(study, spec.text, resume, "--storage" if storage else "storage_path")  # read once
    meta = before.meta or {"base_dir": str(spec.base_dir), "study_uid": before.unstarted_uid or uuid.uuid4().hex}
    base_dir = Path(meta["base_dir"])
    changed = check_edit(before.accepted, study) if before.accepted is not None else []  # `resume NAME`: edited?
    if checked is not None and not resume and base_dir == spec.base_dir and checked.study == study:
        plan = checked
    else:
        plan = build_plan(study, base_dir, stage_root=folder.stages)
    if resume:  # the data it was launched with, or a refusal naming the split that changed
        check_unchanged(before.record, plan.data, study.task)
    estimated = before.estimate  # `plan --estimate` of this very study file, if it ran
    if study.budget is not None and not resume:  # a pilot on this machine, before anything is written
        from orchestrator.checks.estimate import check_budget, estimate, estimate_summary

        try:
            found = estimate(plan)
        except UserInputError as exc:
            raise UserInputError("budget", {"hours": study.budget.hours}, f"{exc.fix}; remove budget to launch "
                                                                          "without an estimate") from None
        check_budget(plan, found)
        estimated = estimate_summary(found, "budget")
    uri = meta.get("tracking_uri") or tracking_uri(study, base_dir)
    refuse_unwritable_store(uri, study.name, resume)  # it may have changed since the plan checked it
    if executor is None:
        ray = connect_ray(address)
        check_cluster(ray, study)  # the last cheap check: nothing is written before it passes
    with folder.lock("resume" if resume else "launch"):
        if not resume:
            folder.refuse_taken()  # a launch that got here first, and ended
            folder.clear_unstarted()  # what a first launch that failed before its first trial left
        return run_locked(spec, plan, folder, {**meta, "tracking_uri": uri}, before, changed,
                          resume, max_concurrent, progress, executor or run_tuner, estimated, stops)


def refuse_unwritable_store(uri: str, name: str, resume: bool) -> None:
    """One line, before the study folder is touched, when the SQLite store cannot take a write now."""
    from orchestrator.study.store_check import store_problem

    found = store_problem(uri)
    if found:
        again = f"orchestrator resume {name}" if resume else "launch again"
        raise UserInputError("tracking.mlflow_uri", uri, f"the store cannot be written now ({found[0]}); {found[1]}; "
                                                         f"then {again}")


def run_locked(spec: StudySpec, plan: StudyPlan, folder: StudyFolder, meta: dict, before: BeforeLaunch,
               changed: list[str], resume: bool, max_concurrent, progress: bool, executor: Callable,
               estimated: dict | None = None, stops: Stops | None = None) -> LaunchResult:
    """Everything a launch writes, while it holds the folder's lock."""
    study = spec.config
    base_dir, uri = Path(meta["base_dir"]), meta["tracking_uri"]
    previous = before.record
    record = plan_record(plan, provenance(), inputs=True,
                         estimate=estimated or (previous.estimate if previous is not None else None))
    journal = folder.journal()
    if changed:  # an extension: the journal learns which cells its earlier indices meant, then the new file
        record_cells(journal, folder, before.accepted, base_dir)
    folder.record_launch(journal, spec.text, meta, record, [c.key for c in plan.cells])  # the file as run
    state = StudyState(plan, journal, folder.optuna_log)
    from orchestrator.run.resilient_tracker import ResilientTracker
    from orchestrator.run.tracking import StudyTracker

    try:
        tracker = StudyTracker(uri, study.name, folder.artifacts)
        tracker.resources = dict(record.resources)
        tracker.start_parent(folder.study_file, record, package_version(), meta.get("study_uid"))
        tracker.client.log_artifact(tracker.parent_id, str(folder.environment))
        if changed:
            tracker.client.log_artifact(tracker.parent_id, str(folder.study_file))
            tracker.client.set_tag(tracker.parent_id, "orchestrator.extended", ",".join(changed)[:5000])
    except Exception as exc:  # before any trial: the folder is resumed, or (first launch) taken over, as it is
        from reports.store import forget_store

        forget_store(uri)
        if disk_was_full(exc):
            raise StorageFullError("storage", str(folder.folder), full_disk_fix(study.name)) from exc
        again = f"orchestrator resume {study.name}" if resume or state.counts()["issued"] else "launch again"
        raise UserInputError("tracking.mlflow_uri", uri, f"the store refused the study's parent run "
                                                         f"({first_line(exc)}); make it writable (or start the "
                                                         f"server), then {again}; no trial of this launch ran") from exc
    resilient = ResilientTracker(tracker, lambda: state.records, {c.index: c.key for c in plan.cells})
    launches = folder.launches()
    counts = state.counts()
    banner = [f"{study.name}: {'resuming' if counts['issued'] else 'launching'} {counts['planned']} planned trials "
              f"({len(plan.cells)} cells; {counts['issued'] - counts['running']} already finished) · "
              f"study folder {folder.folder} · MLflow {uri}"]
    if plan.fusion and plan.replicate_trials:
        from orchestrator.study.fusing import summary

        banner.append("fuse: " + summary(plan.fusion, [c.key for c in plan.cells]))
    try:
        if state.is_complete():  # nothing left: no Tuner is started (whose state sync would race its own exit)
            if progress:
                print("\n".join([*banner, "nothing left to run: every planned trial has finished"]), file=sys.stderr)
        else:
            with graceful_sigterm(stops):  # SIGTERM and SIGHUP take Ctrl-C's path, kept in `stops`
                executor(plan, state, resilient, folder.ray, f"launch-{launches + 1}",
                         max_concurrent or study.max_concurrent, progress, banner)
    except Exception as exc:  # once the disk is full, Tune's own ending fails too (its error files are empty)
        if OUT_OF_MEMORY in str(exc):  # Ray's memory monitor killed a worker, and Tune ends the whole run
            raise OutOfMemory("resources", {"cpu": study.resources.cpu, "gpu": study.resources.gpu},
                              f"Ray killed a trial's worker because the node ran out of memory; every finished trial "
                              f"is kept: run fewer trials at once (`--max-concurrent 1`, or more resources.cpu per "
                              f"trial), then `orchestrator resume {study.name}`") from None
        if not (state.storage_full or disk_was_full(exc)):
            raise
        state.storage_full = state.storage_full or str(exc)
    finally:
        finished = state.is_complete()
        reconciled = close_tracking(resilient, state, finished)
    stopped = [r for r in state.records.values() if r.outcome is not None and storage_full(r.error)]
    if state.storage_full and (stopped or not finished):  # one line; `resume` runs what the full disk stopped
        raise StorageFullError("storage", str(folder.folder), full_disk_fix(study.name))
    return LaunchResult(folder.folder, state.counts(), finished, reconciled)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line, shortened: MLflow's SQL errors carry the whole statement."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return re.sub(r"^\([\w.]+\) ", "", lines[0])[:limit]  # SQLAlchemy's `(sqlite3.OperationalError) `


OUT_OF_MEMORY = "were killed due to the node running low on memory"


class OutOfMemory(UserInputError):
    problem = "ran out of memory"
    exit_code = 1


def disk_was_full(exc: BaseException | None) -> bool:
    """Did the disk fill up, here or anywhere in the exception's chain (Tune wraps what a callback raised)?"""
    while exc is not None:
        if isinstance(exc, StorageFullError) or storage_full(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def close_tracking(resilient, state: StudyState, finished: bool) -> dict[str, int]:
    """Replay what an outage missed, then close the runs; if MLflow is still down the journal
    keeps everything and `orchestrator sync NAME` finishes the job later."""
    try:
        grace = float(os.environ.get("ORCHESTRATOR_TRACKING_GRACE_S", "30"))
        deadline = time.monotonic() + grace  # a tracker restarting as the study ends gets this long
        while not resilient.reconnect(force=True) and time.monotonic() < deadline:
            time.sleep(2)
        if resilient.offline_since is not None:
            raise ConnectionError(f"still unreachable after {grace:g} s")
        resilient.tracker.log_compute(state.records, {c.index: c.key for c in state.plan.cells})
        return {**resilient.tracker.reconcile(state.records, finished, state.pareto_marks()), **{
            f"replayed_{k}": v for k, v in resilient.synced.items()}, "outages": resilient.outages}
    except Exception as exc:
        logging.getLogger("orchestrator").warning(
            "MLflow at %s is unreachable (%s); the study's journal has every result: run `orchestrator sync %s` "
            "when the server is back", resilient.tracker.uri, exc, state.plan.study.name)
        return {"unsynced": 1}


def run_tuner(plan: StudyPlan, state: StudyState, tracker, storage: Path, name: str,
              max_concurrent: int | None, progress: bool, banner: list[str] | None = None) -> None:
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our own progress view replaces Tune's console output
    # a trial that diverges in its first epoch reports no dev metric; the plan's searcher and
    # scheduler handle that, Tune's strict check would end the whole study
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    import ray
    from ray import tune

    from orchestrator.run.tune_adapters import (
        ArrayDecisions,
        CellScheduler,
        PlanSearcher,
        ProgressCallback,
        TrackingCallback,
        run_trial,
    )

    study = plan.study
    resources = {"cpu": study.resources.cpu, "gpu": study.resources.gpu}
    # Tune lets a custom searcher keep only one trial pending, and a trial that finishes hands its
    # cached worker to that pending trial, killing the worker being started for it: slots beyond
    # the first would never fill while trials are shorter than a worker's start. Let every slot start.
    count = slots(study, ray.cluster_resources(), max_concurrent)
    os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(count)
    # a stop is ours to explain (`orchestrator resume NAME`), not Tune's advice to call Tuner.restore
    logging.getLogger("ray.tune.tune").setLevel(logging.ERROR)
    banner = [*(banner or []), f"{count} trial{'s' if count != 1 else ''} at a time on "
              f"{ray.cluster_resources().get('CPU', 0):g} CPUs; Ctrl-C stops at the trials' last checkpoints "
              f"(`orchestrator resume {plan.study.name}` continues)"]
    decisions = decided = None
    if any(plan.tuning_members_of(c.index) > 1 for c in plan.cells):  # fused tuning arrays: members may be pruned
        decided = f"orchestrator-arrays-{uuid.uuid4().hex[:12]}"
        decisions = ray.remote(num_cpus=0)(ArrayDecisions).options(name=decided).remote()
    tuner = tune.Tuner(
        tune.with_resources(run_trial, resources),
        tune_config=tune.TuneConfig(search_alg=PlanSearcher(state, count, decided), scheduler=CellScheduler(
                                        state, decisions),
                                    num_samples=-1, max_concurrent_trials=max_concurrent, reuse_actors=True,
                                    trial_dirname_creator=trial_folder_name, trial_name_creator=trial_folder_name),
        run_config=tune.RunConfig(
            name=name, storage_path=str(storage), verbose=0,
            failure_config=tune.FailureConfig(max_failures=study.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[TrackingCallback(state, tracker, str(StudyFolder(storage.parent).models) if study.save != "none"
                                        else None)]
            + ([ProgressCallback(state, banner)] if progress else []),
        ),
    )
    from orchestrator.run.driver_log import LAUNCH_LOG, ray_logs_to

    with no_forwarded_secrets(), ray_logs_to(storage.parent / LAUNCH_LOG, f"{study.name}: {name}"):
        tuner.fit()


def trial_folder_name(trial) -> str:
    """Short, readable trial folders: the plan key and Ray's id (`c0-t2_3f9a1b2c`)."""
    return f"{trial.config.get('trial_key', 'trial')}_{trial.trial_id}"


def resume(name: str, storage: str | Path | None = None, address: str | None = None,
           max_concurrent: int | None = None, progress: bool = True, overrides: Iterable[str] = (),
           executor: Callable | None = None, stops: Stops | None = None) -> LaunchResult:
    """Continue a study from its folder's stored study file (with `overrides` that extend it)."""
    study = StudyFolder.named(name, storage).require()
    record = study.record()
    if record is not None:  # its plugins first: the study file names what they register
        from orchestrator.study.plugins import check_installed

        check_installed(record.plugins, name)
    spec = read_study(study.study_file, overrides)
    if spec.name != name:
        raise UserInputError("name", spec.name, f"the study folder {study.folder} is study {name}: resume it under "
                                                "its own name (--name and name= start a new study with `launch`)")
    return launch(spec, storage=study.storage, address=address, max_concurrent=max_concurrent,
                  resume=True, progress=progress, executor=executor, stops=stops)


def record_cells(journal: Journal, study: StudyFolder, stored: StudyConfig, base_dir: Path) -> None:
    """Before an extended plan renumbers the cells, make sure the journal says which cell each of
    its earlier indices meant (folders from before such records: rebuilt from the stored study)."""
    if any(event.get("event") == "cells" for event in journal.events()):
        return
    record = study.record(stored)
    if record is not None:
        keys = [key for key, _ in record.planned_cells]
    else:
        keys = [c.key for c in build_plan(stored, base_dir, stage_root=study.stages).cells]
    journal.write("cells", keys=keys)


def sync(name: str, storage: str | Path | None = None) -> dict[str, int]:
    """Replay a study's journal into MLflow (after an outage the driver could not outlast) and
    close its runs; refused while a launch or resume of the study runs (it writes the same runs)."""
    study = StudyFolder.named(name, storage).require()
    with study.lock("sync"):
        return _sync(study)


def _sync(study: StudyFolder) -> dict[str, int]:
    from orchestrator.run.tracking import StudyTracker

    state = study.state()
    tracker = StudyTracker(study.tracking_uri, study.name)
    tracker.data = list(state.plan.data)  # runs sync creates get their dataset inputs too
    tracker.resources = {"cpu": state.plan.study.resources.cpu, "gpu": state.plan.study.resources.gpu}
    try:
        tracker.attach_parent(study.study_uid)
    except RuntimeError as exc:
        raise UserInputError("NAME", study.name, f"{exc}; give the study's name as launched") from None
    counts = tracker.sync(state.records, {c.index: c.key for c in state.plan.cells})
    tracker.log_compute(state.records, {c.index: c.key for c in state.plan.cells})
    closed = tracker.reconcile(state.records, state.is_complete(), state.pareto_marks())
    return {**counts, "closed": counts["closed"] + closed["closed"], "killed": closed["killed"]}
