"""Ray Tune's side of the plan: a Searcher that hands out the plan's trials, a scheduler that
routes each result to its own cell's pruner (never stopping a replicate), and the function
trainable that runs the trial's kind (its registry entry travels with the trial) inside a trial."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from typing import TextIO

from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher
from rich.console import Console
from rich.live import Live

from orchestrator.run.progress import duration, eta_seconds, status_table, trial_line, work_units
from orchestrator.study.journal import ATTEMPT, ATTEMPT_S, Outcome, remove_checkpoint
from orchestrator.study.state import FINISHED, StudyState
from trainables.errors import storage_full
from trainables.training.checkpoints import ARTIFACTS, MODEL_DIR

RAY_RESULT_KEYS = {"timestamp", "checkpoint_dir_name", "done", "training_iteration", "trial_id", "date",
                   "time_this_iter_s", "time_total_s", "pid", "hostname", "node_ip", "config", "time_since_restore",
                   "iterations_since_restore", "should_checkpoint"}


def trial_metrics(result: dict) -> dict:
    """What the trainable reported, without Ray's bookkeeping (the scheduler sees the trial's config
    flattened into `config/...` keys: the journal has it once, in the trial's `issued` line)."""
    return {k: v for k, v in result.items()
            if k not in RAY_RESULT_KEYS and not isinstance(v, dict) and not k.startswith("config/")}


MEMBERS = "members"  # a fused array's config: its trials; its results: each member's metrics by trial key


def trial_keys(config: dict) -> list[str]:
    """The plan trials a Ray trial runs: a fused array's members, else its one trial."""
    if MEMBERS in config:
        return [member["trial_key"] for member in config[MEMBERS]]
    return [config["trial_key"]] if "trial_key" in config else []


def member_results(result: dict) -> dict[str, dict]:
    """A fused array's result as each member's metrics (what its trial alone would have reported); Ray hands
    callbacks the result as reported and the scheduler its flattened copy (`members/<key>/<metric>`)."""
    if isinstance(result.get(MEMBERS), dict):
        return {key: dict(metrics) for key, metrics in result[MEMBERS].items()}
    found: dict[str, dict] = {}
    for name, value in result.items():
        if name.startswith(MEMBERS + "/") and name.count("/") >= 2:
            _, key, metric = name.split("/", 2)
            found.setdefault(key, {})[metric] = value
    return found


class ArrayDecisions:
    """The driver's word to running fused arrays (a Ray actor, named per launch): which members the cell's pruner
    stopped. A trial's `tune.report` returns only once the driver has taken its result and decided (Tune asks for
    the next one after), so an array that asks after each report learns every decision before its next round."""

    def __init__(self):
        self.left: dict[str, list[str]] = {}

    def stop(self, array: str, member: str) -> None:
        self.left.setdefault(array, []).append(member)

    def stopped(self, array: str) -> list[str]:
        return list(self.left.get(array, []))


class PlanSearcher(Searcher):
    """Hands out the plan's trials in order; FINISHED when the plan is done."""

    def __init__(self, state: StudyState, max_concurrent: int | None = None, decisions: str | None = None):
        """`max_concurrent`: trials handed out and not finished, at most; the cluster's slots, so
        that no trial waits issued (TPE asks with what is known when a slot is free). `decisions`: the name of
        the launch's ArrayDecisions actor, which fused tuning arrays ask after each report."""
        super().__init__(metric=state.plan.metric, mode=state.plan.mode)
        self.state, self.decisions = state, decisions
        self.keys: dict[str, list[str]] = {}  # Ray trial id -> its plan trials (a fused array's members)
        self.max_concurrent = max_concurrent

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: the journal already holds every event, written as it happened."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: a resume replays the journal."""

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str):
        if self.max_concurrent and len(self.keys) >= self.max_concurrent:
            return None
        found = self.state.next_array()
        if not isinstance(found, list):
            return Searcher.FINISHED if found == FINISHED else None
        self.keys[trial_id] = [record.key for record in found]
        plan, record = self.state.plan, found[0]
        config = {"trainable": plan.study.trainable, "kind": plan.kind_path, "trial_key": record.key,
                  "cell": plan.cells[record.cell].key, "phase": record.phase, "seed": record.seed,
                  "trial": record.config, "resume_from": record.checkpoint}
        if len(found) > 1:  # one fused array: its own key names no plan trial, so nothing mistakes it for one
            config.update(trial_key=f"{record.key}+{len(found) - 1}", seed=[r.seed for r in found], members=[
                {"trial_key": r.key, "seed": r.seed, "trial": r.config, "resume_from": r.checkpoint} for r in found])
            if record.phase == "tune":  # its members may be pruned: it asks after each report
                config["decisions"] = self.decisions
            if plan.fusion[record.cell].why.startswith("auto"):  # it measures how many of them to fuse first
                config["probe"] = True
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass  # results are recorded by the scheduler, which also decides on pruning

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        keys = self.keys.pop(trial_id, [])
        for key in keys:
            record = self.state.records[key]
            last = record.last if len(keys) > 1 else (result or {})  # an array's members: each its own last
            if error:
                self.state.on_finished(key, Outcome.FAILED, record.error or "trial raised an error")
            elif last.get("diverged"):
                self.state.on_finished(key, Outcome.DIVERGED, last.get("error"))
            else:
                self.state.on_finished(key, Outcome.COMPLETED)


class CellScheduler(FIFOScheduler):
    """Each result goes to its own cell's pruner (successive halving inside the cell)."""

    def __init__(self, state: StudyState, decisions=None):
        """`decisions`: the launch's ArrayDecisions actor (where fused tuning arrays learn which members left)."""
        super().__init__()
        self.state, self.decisions = state, decisions

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        keys = trial_keys(trial.config)
        if MEMBERS in trial.config:
            return self._array_result(trial, keys, result)
        key = keys[0] if keys else None
        if key not in self.state.records:
            return TrialScheduler.STOP  # not part of the plan (a stale trial from a torn snapshot)
        stop = self.state.on_result(key, trial_metrics(result))
        return TrialScheduler.STOP if stop else TrialScheduler.CONTINUE

    def _array_result(self, trial, keys: list[str], result: dict) -> str:
        """A fused array's round: each member's result goes to its cell's pruner as a trial alone's would, in the
        members' order; a member it stops is pruned at once (its cell's study told) and leaves the array before
        its next round; the array stops when no member is left."""
        records = self.state.records
        for key, metrics in member_results(result).items():
            if key not in keys or key not in records or records[key].finished:
                continue  # not this array's, or it left the array already
            if self.state.on_result(key, trial_metrics(metrics)):
                self.state.on_finished(key, Outcome.PRUNED)
                if self.decisions is not None:
                    import ray

                    ray.get(self.decisions.stop.remote(trial.config["trial_key"], key))
        going = [k for k in keys if k in records and not records[k].finished]
        return TrialScheduler.CONTINUE if going else TrialScheduler.STOP

    def on_trial_error(self, tune_controller, trial) -> None:
        """Called before the searcher hears of the failure: keep the error's last line (every member's)."""
        for key in trial_keys(trial.config):
            if key in self.state.records:
                self.state.records[key].error = error_summary(trial)
                stop_on_full_disk(self.state, self.state.records[key].error)


def stop_on_full_disk(state: StudyState, error: str | None) -> None:
    """A full disk fails every trial that writes a checkpoint, and each of its retries again: the
    first such error stops the launch as Ctrl-C does (running trials keep their last checkpoints;
    the launch then ends in one line, and `resume` runs them once there is space)."""
    if storage_full(error) and state.storage_full is None:
        state.storage_full = error
        os.kill(os.getpid(), signal.SIGINT)


def error_summary(trial) -> str:
    """The last line of a failed trial's traceback (the exception and its message)."""
    path = trial.error_file
    if path and os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        if lines:
            return lines[-1][:1000]
    return "trial failed without an error file"


class TrackingCallback(Callback):
    """Mirrors trials into MLflow from the driver: start, each epoch, checkpoint, outcome."""

    def __init__(self, state: StudyState, tracker, models_dir: str | None = None):
        self.state, self.tracker, self.models_dir = state, tracker, models_dir
        self.retries: dict[str, int] = {}
        self.closed: set[str] = set()  # fused members whose runs were closed when they left their array

    def __getstate__(self) -> dict:
        return {}  # driver-only: an MLflow client does not travel with Tune's experiment pickle

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        for key in trial_keys(trial.config):
            if key in self.state.records:
                self.tracker.start_trial(self.state.records[key], trial.config["cell"], trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        node = str(result["node_ip"]) if result.get("node_ip") else None
        found = member_results(result) if MEMBERS in trial.config else {trial.config.get("trial_key"): result}
        for key, metrics in found.items():
            self.tracker.log_epoch(key, trial_metrics(metrics), node)
            for name in sorted(k for k in metrics if k.endswith("_stage_dir") and metrics[k]):  # each stage's
                self.tracker.link_stage(key, metrics[name])
        for key in trial_keys(trial.config) if MEMBERS in trial.config else ():
            record = self.state.records.get(key)
            if record is not None and record.finished and key not in self.closed:  # pruned: it left its array
                self.closed.add(key)
                self._finish_record(record)

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        """A trial failed (its worker or node died) and Tune restarts it from its last checkpoint."""
        for key in trial_keys(trial.config):
            if key in self.state.records:
                self.retries[key] = self.retries.get(key, 0) + 1
                error = error_summary(trial)
                stop_on_full_disk(self.state, error)
                self.state.journal.write("retry", key=key, error=error)
                self.tracker.set_tag(key, "ray.retries", str(self.retries[key]))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        if MEMBERS not in trial.config:
            self.state.on_checkpoint(trial.config.get("trial_key"), checkpoint.path)
            return
        for key in trial_keys(trial.config):  # each member's own folder in the array's checkpoint
            path = os.path.join(checkpoint.path, MEMBERS, key)
            if os.path.isdir(path) and key not in self.closed:
                self.state.on_checkpoint(key, path)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._finish(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._finish(trial)

    def _finish(self, trial) -> None:
        for key in trial_keys(trial.config):
            record = self.state.records.get(key)
            if record is not None and key not in self.closed:
                self._finish_record(record)

    def _finish_record(self, record) -> None:
        for name in ARTIFACTS if record.checkpoint else ():
            if os.path.exists(os.path.join(record.checkpoint, name)):
                self.tracker.log_artifact(record.key, os.path.join(record.checkpoint, name))
        self.tracker.finish_trial(record)
        if self.models_dir and record.checkpoint and os.path.isdir(os.path.join(record.checkpoint, MODEL_DIR)):
            from orchestrator.run.saved_models import keep_model

            try:
                keep_model(self.state, self.tracker, record, self.models_dir)
            except OSError as exc:  # the result is safe; the model stays in its checkpoint, which is kept
                stop_on_full_disk(self.state, str(exc))
                logging.getLogger("orchestrator").warning(
                    "the model of %s was not copied to %s (%s); it stays in %s", record.key, self.models_dir, exc,
                    record.checkpoint)
                return
        # results safe in the journal and (once the writes above are made) in MLflow: the checkpoint can go
        def release() -> None:
            if remove_checkpoint(record.checkpoint):
                self.state.journal.write("checkpoint_removed", key=record.key, path=record.checkpoint)

        when_written = getattr(self.tracker, "when_written", None)
        if when_written is None:  # a plain StudyTracker writes as it is called
            release()
        else:
            when_written(release)


def run_trial(config: dict) -> None:
    """The function trainable: resumes from Tune's checkpoint (a retry), else from the plan's (a
    resumed study), else starts fresh. A diverged loss ends the trial with a final report."""
    import tempfile

    from trainables.errors import TrainingDivergedError
    from trainables.kinds import load_kind
    from trainables.kinds.base import TrainingKind
    from trainables.runtime import release_memory

    kind = load_kind(config["kind"])
    if isinstance(kind, TrainingKind):  # a fresh worker's one-time imports are the worker's, not this trial's
        import trainables.training.loop  # noqa: F401
    if MEMBERS in config:
        try:
            run_array_trial(kind, config)
        finally:
            release_memory()
        return
    run = kind.run
    clock = AttemptClock()

    def report(metrics: dict, checkpoint_dir: str | None = None) -> None:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
        checkpoint = tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        tune.report({**clean, **clock.stamp()}, checkpoint=checkpoint)

    checkpoint = tune.get_checkpoint()
    try:
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                run(config["trial"], report, checkpoint_dir=folder)
        elif config.get("resume_from") and os.path.isdir(config["resume_from"]):
            run(config["trial"], report, checkpoint_dir=config["resume_from"])
        else:
            run(config["trial"], report)
    except TrainingDivergedError as exc:
        with tempfile.TemporaryDirectory():
            tune.report({"diverged": 1, "error": str(exc), **clock.stamp()})
    finally:
        release_memory()


class ArrayReports:
    """A fused array's reports to Tune: each member's metrics of a round (stamped with its share of the array's
    wall time) gathered, then one `tune.report` with all of them and one checkpoint folder that holds every
    member's latest checkpoint, `members/<trial key>/` in its trial's own format."""

    def __init__(self, folder: str, keys: list[str], array: str, decisions: str | None = None):
        self.folder, self.clock = folder, AttemptClock(len(keys))
        self.array, self.decisions = array, decisions
        self.pending: dict[str, dict] = {}
        self.left: set[str] = set()

    def __call__(self, key: str, metrics: dict, checkpoint_dir: str | None = None) -> None:
        import shutil

        if checkpoint_dir is not None:
            target = os.path.join(self.folder, MEMBERS, key)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(checkpoint_dir, target)
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
        self.pending[key] = {**clean, **self.clock.stamp(key)}

    def flush(self) -> set[str]:
        """Send the round's reports; the members the driver has since stopped (pruned), which leave the array."""
        import shutil

        if self.pending:
            tune.report({MEMBERS: self.pending}, checkpoint=tune.Checkpoint.from_directory(self.folder))
            self.pending = {}
        if self.decisions is None:
            return set()
        import ray

        left = set(ray.get(ray.get_actor(self.decisions).stopped.remote(self.array))) - self.left
        for key in left:  # its results are kept; its checkpoint is no longer the array's to carry
            shutil.rmtree(os.path.join(self.folder, MEMBERS, key), ignore_errors=True)
        self.left |= left
        return left


def run_array_trial(kind, config: dict) -> None:
    """A fused array (`resources.fuse`): its members' trials trained together by the kind (`run_array`), each
    from Tune's checkpoint of the array (a retry), else its own from the plan (a resumed study), else fresh."""
    import shutil
    import tempfile

    members = config[MEMBERS]
    keys = [member["trial_key"] for member in members]
    folder = tempfile.mkdtemp(prefix="array-ckpt-")
    try:
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as saved:
                if os.path.isdir(os.path.join(saved, MEMBERS)):
                    shutil.copytree(os.path.join(saved, MEMBERS), os.path.join(folder, MEMBERS))
        for member in members:
            own = member.get("resume_from")
            target = os.path.join(folder, MEMBERS, member["trial_key"])
            if not os.path.isdir(target) and own and os.path.isdir(own):
                shutil.copytree(own, target)
        reports = ArrayReports(folder, keys, config["trial_key"], config.get("decisions"))
        stopped = reports.flush()  # a retried array: the members pruned before it died do not train again
        going = [member for member in members if member["trial_key"] not in stopped]
        starts = [os.path.join(folder, MEMBERS, member["trial_key"]) for member in going]
        if going:
            kind.run_array([member["trial"] for member in going], [member["trial_key"] for member in going],
                           reports, [start if os.path.isdir(start) else None for start in starts],
                           probe=bool(config.get("probe")))
        reports.flush()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class AttemptClock:
    """The wall time of one attempt of a trial (a retry or a resumed launch starts another), from when its
    kind starts the trial (a fresh worker's imports done) to each report, stamped on every report with the
    attempt's id; the first report of an attempt also names the machine it runs on. The journal keeps every
    stamp, so a trial's wall time is the sum of its attempts' last stamps
    (orchestrator.study.journal.TrialRecord.wall_s) however often it was interrupted."""

    def __init__(self, members: int = 1):
        import uuid

        self.attempt, self.started, self.members = uuid.uuid4().hex[:12], time.monotonic(), members
        self.first: set[str | None] = set()

    def stamp(self, member: str | None = None) -> dict:
        """A fused array's member gets its share of the array's time (the wall time over its members), so
        that the study's compute counts the array's time once."""
        stamp = {ATTEMPT: self.attempt, ATTEMPT_S: round((time.monotonic() - self.started) / self.members, 4)}
        if member not in self.first:
            from reports.environment import gpus, machine

            self.first.add(member)
            stamp.update({f"hardware_{k}": v for k, v in {**machine(), **gpus()}.items()})
        return stamp


HEARTBEAT_S = 60.0


class ProgressCallback(Callback):
    """What the driver shows while Tune runs (orchestrator.run.progress): `banner` lines when the study
    starts; a live table on a terminal; elsewhere a line per trial that ends and a heartbeat."""

    def __init__(self, state: StudyState, banner: list[str] | None = None, stream: TextIO | None = None,
                 live: bool | None = None):
        self.state, self.banner = state, banner or []
        self.stream = stream or sys.stderr
        self.live_mode = self.stream.isatty() if live is None else live
        self.started = time.monotonic()
        self.last_update = 0.0
        self.last_line = time.monotonic()
        self.reported = len(state.finished_keys)  # a resume's earlier trials are not announced again
        self.finished_before = self.reported  # no ETA until a trial of this launch ends (see _eta)
        self.eta: tuple[float, float | None] = (-math.inf, None)  # (when computed, the ETA then)
        self.done_before = work_units(state)[0]  # a resume's earlier work: not paid for by this launch's time
        self.live = (Live(status_table(state), console=Console(file=self.stream), auto_refresh=False)
                     if self.live_mode else None)

    def __getstate__(self) -> dict:
        return {}  # driver-only: a terminal view does not travel with Tune's experiment pickle

    def _print(self, line: str) -> None:
        self.last_line = time.monotonic()
        if self.stream is None:
            return
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):  # the terminal is gone (SIGHUP, a closed pipe): the study goes on
            self.stream = None

    def _eta(self, now: float) -> float | None:
        """The time left, recomputed at most once a second (it reads every trial of the study); none until
        a trial of this launch has ended: before that the time is mostly Ray's and the workers' start, and
        the pace from it said 29 minutes for a 7-minute study."""
        if len(self.state.finished_keys) <= self.finished_before:
            return None
        if now - self.eta[0] >= 1.0:
            self.eta = (now, eta_seconds(self.state, now - self.started, self.done_before))
        return self.eta[1]

    def _title(self) -> str:
        counts = self.state.counts()
        elapsed = time.monotonic() - self.started
        eta = self._eta(time.monotonic())
        return (f"{self.state.plan.study.name}: {counts['completed'] + counts['pruned']} done, {counts['running']} "
                f"running, {counts['failed'] + counts['diverged']} failed · {counts['planned'] - counts['skipped']} "
                f"planned · {duration(elapsed)} elapsed" + (f" · ETA {duration(eta)}" if eta is not None else ""))

    def setup(self, **info) -> None:
        for line in self.banner:
            self._print(line)
        if self.live is not None:
            self._on_terminal(self.live.start)

    def _on_terminal(self, draw, *args, **kwargs) -> None:
        """Draw the live table; a terminal that is gone ends the view, not the study."""
        try:
            draw(*args, **kwargs)
        except (OSError, ValueError):
            self.live = self.stream = None

    def poll(self) -> None:
        """New lines for trials that ended since the last poll; a heartbeat when none did for a while."""
        now = time.monotonic()
        if self.live is not None:
            if now - self.last_update >= 1.0:
                self.last_update = now
                self._on_terminal(self.live.update, status_table(self.state, self._title()), refresh=True)
            return
        for key in self.state.finished_keys[self.reported:]:
            self.reported += 1
            self._print(trial_line(self.state, self.state.records[key], now - self.started, self._eta(now)))
        if now - self.last_line >= HEARTBEAT_S:
            self._print(f"… {self._title()}")

    def on_step_end(self, iteration, trials, **info) -> None:
        self.poll()

    def on_experiment_end(self, trials, **info) -> None:
        self.last_update = 0.0
        self.poll()
        if self.live is not None:
            self._on_terminal(self.live.stop)
