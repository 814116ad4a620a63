"""Ctrl-C anywhere in a launch. Python delivers SIGINT to the main thread as a KeyboardInterrupt between
any two of its bytecodes; here it is raised on entry to the n-th call of the project's own code
(orchestrator, reports, trainables), for an n a property test draws across a whole launch: validation,
the study folder being made, the parent run, Optuna's asks and tells, the trials' MLflow runs, the
journal, the report. Whatever n, the launch ends in the interrupt and nothing else, the CLI's last line
says how to go on, and doing what it says finishes the study: every trial once, one MLflow run each,
none left RUNNING, no epoch logged twice, a report that `verify` accepts."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import orchestrator as orc
import reports
import trainables
from benchmarks.instant import instant_executor
from orchestrator.cli import app
from orchestrator.cli.study import interrupted_line
from orchestrator.run import launcher, ray_session

PACKAGES = tuple(str(Path(package.__file__).parent) + os.sep for package in (orc, reports, trainables))
TRIALS = 8  # 2 layers x (2 tuning trials + 2 seeds)


class CtrlC:
    """A trace function that counts the calls into the project's code and raises KeyboardInterrupt on
    entry to the `at`-th (none when `at` is None: a count of a whole launch)."""

    def __init__(self, at: int | None) -> None:
        self.at, self.calls, self.where = at, 0, "nowhere: the launch ended first"

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGES):
            self.calls += 1
            if self.calls == self.at:
                self.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
                sys.settrace(None)
                raise KeyboardInterrupt
        return None

    @contextlib.contextmanager
    def armed(self):
        previous = sys.gettrace()
        sys.settrace(self)
        try:
            yield self
        finally:
            sys.settrace(previous)


def score(config: dict, seed: int, epoch: int) -> float:
    return 50 + 5 * config["layer"] + 10 * config.get("lr", 0) ** 0.5 + 0.5 * seed + epoch


def make_study(folder: Path, model: str, data_dir: Path, template: Path) -> Path:
    shutil.copyfile(template, folder / "mlflow.db")
    path = folder / "k.yaml"
    path.write_text(yaml.safe_dump({
        "name": "k", "model": model, "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
        "tune": {"params": {"lr": {"loguniform": [1e-5, 1e-3]}}, "trials": 2, "startup_trials": 1},
        "train": {"epochs": 2}, "data_dir": str(data_dir), "report": {"baseline": {"layer": 2}},
        "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}))
    return path


@pytest.fixture(scope="module")
def instant_trials():
    """Ray Tune's execution of the trials replaced by benchmarks/instant.py (two at a time)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launcher, "connect_ray", lambda address: None)
        patch.setattr(launcher, "check_cluster", lambda ray, study: None)
        patch.setattr(launcher, "run_tuner", instant_executor(score, slots=2))
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    from reports.store import open_store

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    open_store(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="module")
def calls(instant_trials, tiny_bert, synthetic_data_dir, store, tmp_path_factory) -> int:
    """How many calls into the project's code a whole launch makes (the second of two: the first
    imports and fills caches)."""
    counted = 0
    for _ in range(2):
        folder = tmp_path_factory.mktemp("count")
        with contextlib.chdir(folder), CtrlC(None).armed() as counter:
            orc.launch(make_study(folder, tiny_bert, synthetic_data_dir, store), storage=folder / "studies",
                       progress=False)
        counted = counter.calls
    return counted


def check_finished(folder: Path, result, where: str) -> None:
    from mlflow.tracking import MlflowClient

    storage = folder / "studies"
    counts = result.counts
    assert result.finished and counts["completed"] + counts["pruned"] == TRIALS, (where, counts)  # ASHA may prune
    runs = orc.results("k", storage=storage)
    assert len(runs) == TRIALS and runs.run_id.is_unique, where
    assert set(runs.outcome) <= {"completed", "pruned"}, where
    assert set(runs[runs.phase == "replicate"].outcome) == {"completed"}, where
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    mlflow_runs = client.search_runs([client.get_experiment_by_name("k").experiment_id])
    assert "RUNNING" not in {r.info.status for r in mlflow_runs}, where
    children = [r for r in mlflow_runs if "mlflow.parentRunId" in r.data.tags]
    assert len(mlflow_runs) - len(children) == 1, where  # one parent run, however many launches
    keys = Counter(r.data.tags["orchestrator.trial_key"] for r in children)
    assert len(keys) == TRIALS and max(keys.values()) == 1, (where, keys)  # one run per trial, none again
    status = {r.data.tags["orchestrator.trial_key"]: r.info.status for r in children}
    assert status == {key: "FINISHED" if outcome == "completed" else "KILLED"  # pruned: KILLED
                      for key, outcome in zip(runs.trial_key, runs.outcome, strict=True)}, where
    curves = orc.results("k", storage=storage, curves=True).groupby("trial_key").epoch.apply(list)
    epochs = {key: [1, 2] if outcome == "completed" else [1] for key, outcome in zip(runs.trial_key, runs.outcome,
                                                                                   strict=True)}
    assert curves.to_dict() == epochs, where  # each epoch once, a pruned trial's first only
    assert result.report is not None and orc.verify(result.report.folder).ok, where


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("CTRL_C_EXAMPLES", "12")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: the failure names where it struck
@given(position=st.floats(0, 1, exclude_max=True))
@example(position=0.0)  # before anything is written: `resume` would find no study
def test_ctrl_c_anywhere_in_a_launch_is_the_interrupt_and_what_the_cli_says_next_finishes_the_study(
        position, calls, tiny_bert, synthetic_data_dir, store, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ctrl-c")
    study, storage = make_study(folder, tiny_bert, synthetic_data_dir, store), folder / "studies"
    ctrl_c = CtrlC(1 + int(position * calls))
    with contextlib.chdir(folder):  # storage is ./studies: the CLI's lines name the study alone
        try:
            with ctrl_c.armed():
                result = orc.launch(study, storage=storage, progress=False)
        except KeyboardInterrupt:  # the interrupt itself (StudyInterrupted is one); any other error fails here
            advice = interrupted_line("k", storage)
            if advice.startswith("interrupted: "):
                assert advice == "interrupted: orchestrator resume k", (ctrl_c.where, advice)
                result = orc.resume("k", storage=storage, progress=False)
            else:
                assert advice.endswith("nothing to resume; run the same `orchestrator launch` again"), advice
                with pytest.raises(orc.UserInputError, match="nothing to resume|no study folder"):
                    orc.resume("k", storage=storage, progress=False)
                result = orc.launch(study, storage=storage, progress=False)
        check_finished(folder, result, ctrl_c.where)


def interrupt_when(finished: int):
    def interrupt(count: int) -> None:
        if count == finished:
            raise KeyboardInterrupt
    return interrupt


@pytest.mark.parametrize("storage_path", [False, True])
def test_the_clis_line_after_ctrl_c_names_what_continues_the_study(tiny_bert, synthetic_data_dir, store, tmp_path,
                                                                  monkeypatch, storage_path):
    """Ctrl-C while Ray starts (nothing written yet) says to launch again, not to `resume` a study that
    does not exist; Ctrl-C mid-study says `resume` with the study file's own `storage_path` when it has
    one (`resume NAME` alone looked in ./studies). Doing what each says finishes the study."""
    monkeypatch.chdir(tmp_path)
    study = make_study(tmp_path, tiny_bert, synthetic_data_dir, store)
    where = tmp_path / "elsewhere"
    if storage_path:
        study.write_text(study.read_text() + f"storage_path: {where}\n")
    options = [] if storage_path else ["--storage", str(where)]

    def ray_interrupted(address):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "connect_ray", ray_interrupted)
    stopped = CliRunner().invoke(app, ["launch", str(study), *options])
    assert stopped.exit_code == 130 and stopped.stderr.strip().splitlines() == [
        "interrupted before the study began: nothing ran and there is nothing to resume; run the same "
        "`orchestrator launch` again"], stopped.output
    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2, on_finished=interrupt_when(3)))
    stopped = CliRunner().invoke(app, ["launch", str(study), *options])
    assert stopped.exit_code == 130, stopped.output
    assert stopped.stderr.strip().splitlines()[-1] == f"interrupted: orchestrator resume k --storage {where}"
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2))
    resumed = CliRunner().invoke(app, ["resume", "k", "--storage", str(where)])
    assert resumed.exit_code == 0 and "k: finished: " in resumed.stdout, resumed.output


@pytest.mark.parametrize(("stop", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stop_signal_mid_study_reaches_the_clis_exit_code_through_the_launch(tiny_bert, synthetic_data_dir, store,
                                                                              tmp_path, monkeypatch, stop, code):
    """A SIGTERM (a scheduler's stop) or SIGHUP (the terminal closed) while trials run takes Ctrl-C's path,
    and the `Stops` the CLI hands the launch keeps which signal it was: exit 128 + the signal, the line
    naming `resume`, and the resume finishes the study (nothing shared between launches in module state)."""
    import signal

    monkeypatch.chdir(tmp_path)
    study = make_study(tmp_path, tiny_bert, synthetic_data_dir, store)
    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    previous = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal's default (CI may run the suite under nohup)
    found = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or Ray's own when an earlier test in this worker began Ray

    def signalled(count: int) -> None:
        if count == 3:
            os.kill(os.getpid(), getattr(signal, stop))
            time.sleep(5)  # the handler turns it into Ctrl-C's KeyboardInterrupt before this ends

    import time
    try:
        monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2, on_finished=signalled))
        stopped = CliRunner().invoke(app, ["launch", str(study), "--storage", str(tmp_path / "s")])
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert stopped.exit_code == code, stopped.output
    assert stopped.stderr.strip().splitlines()[-1].endswith(f"orchestrator resume k --storage {tmp_path / 's'}")
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2))
    resumed = CliRunner().invoke(app, ["resume", "k", "--storage", str(tmp_path / "s")])
    assert resumed.exit_code == 0 and "k: finished: " in resumed.stdout, resumed.output
    assert signal.getsignal(signal.SIGTERM) is found  # the launch put back what it found


def test_a_study_folder_being_made_or_left_half_made_is_one_line_that_says_which(tmp_path):
    """`status` or `resume` in the moment a launch makes the folder (its lock held, no study file yet)
    says so; once that launch is gone (Ctrl-C before the study began) it says to launch again."""
    from orchestrator.study.folder import exclusive

    storage = tmp_path / "studies"
    with exclusive(storage / "k", "k", "launch"):
        for verb in ("status", "resume"):
            busy = CliRunner().invoke(app, [verb, "k", "--storage", str(storage)])
            assert busy.exit_code == 2 and busy.stderr == (
                f"error: NAME: 'k' is not valid; pid {os.getpid()}, launch is making the study folder "
                f"{storage / 'k'} now; try again in a moment\n"), busy.output
    for verb in ("status", "resume"):
        left = CliRunner().invoke(app, [verb, "k", "--storage", str(storage)])
        assert left.exit_code == 2 and left.stderr == (
            f"error: NAME: 'k' is not valid; the launch that made {storage / 'k'} stopped before the study began: "
            "nothing ran and there is nothing to resume; launch the study file again\n"), left.output


@pytest.mark.parametrize(("function", "argv"), [
    ("status", ["status", "s"]), ("list_studies", ["list"]), ("sync", ["sync", "s"]),
    ("report", ["report", "s"]), ("verify", ["verify", "reports/s"]), ("doctor", ["doctor"]),
    ("probe", ["probe", "--model", "m"]), ("plan", ["plan", "study.yaml"]),
])
def test_ctrl_c_in_a_short_verb_is_one_line_naming_it_and_exit_130(monkeypatch, tmp_path, function, argv):
    """Ctrl-C in a verb that has no interrupt path of its own (launch and resume have theirs) used to
    exit 130 with nothing said; now one line names the verb, with no traceback."""
    from orchestrator import api

    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text("name: s\n")
    (tmp_path / "reports" / "s").mkdir(parents=True)
    (tmp_path / "reports" / "s" / "provenance.json").write_text("{}")

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, function, pressed)
    result = CliRunner().invoke(app, argv)
    verb = argv[0]
    assert result.exit_code == 130 and result.stderr.strip().splitlines() == [
        f"interrupted: `orchestrator {verb}` stopped before it finished; run it again"], result.output
    assert "Traceback" not in result.output


class FakeDaemon:
    """A Ray daemon's `Popen` as the watch sees it: running until `code` is set."""

    def __init__(self) -> None:
        self.returncode = None

    def poll(self):
        return self.returncode


@pytest.mark.parametrize(("ended", "code"), [({"raylet": 1, "log_monitor": -15}, 143), ({"gcs_server": -9}, 137),
                                             ({"raylet": 1}, 1)])
def test_a_local_ray_stopped_under_the_launch_ends_it_with_the_signals_code(monkeypatch, ended, code):
    """A SIGTERM to the whole process group stops the local Ray too (measured: the raylet exits 1, the
    log monitor dies of the signal); the watch hands the CLI 128 + that signal, or 1 without one."""
    import threading
    import time

    daemons = {kind: [FakeDaemon()] for kind in ("gcs_server", "raylet", "log_monitor", "dashboard")}
    monkeypatch.setattr(ray_session, "local_ray_processes", lambda: daemons)
    lost: list[int] = []
    returned = threading.Event()
    ray_session.watch_local_ray(returned, lost.append, poll_s=0.01)
    time.sleep(0.1)
    assert lost == []  # all running: nothing to do
    for kind, value in ended.items():
        daemons[kind][0].returncode = value
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lost == [code]


def test_the_watch_is_over_once_tune_returned_or_without_a_cli(monkeypatch):
    """Ray stopped by the launch's own shutdown (after Tune returned) is no loss; the Python API (no
    `on_lost`) keeps Ray's own behaviour."""
    import threading
    import time

    daemons = {kind: [FakeDaemon()] for kind in ("gcs_server", "raylet")}
    monkeypatch.setattr(ray_session, "local_ray_processes", lambda: daemons)
    lost: list[int] = []
    returned = threading.Event()
    ray_session.watch_local_ray(returned, lost.append, poll_s=0.01)
    returned.set()
    daemons["raylet"][0].returncode = -15
    time.sleep(0.2)
    assert lost == []
    before = threading.active_count()
    ray_session.watch_local_ray(threading.Event(), None, poll_s=0.01)
    assert threading.active_count() == before  # no watch started
