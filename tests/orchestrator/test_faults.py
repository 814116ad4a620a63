"""Fault cases: an unwritable tracking store, a store that turns unwritable between the checks and the
launch, and the other faults of the reliability table (docs/reliability.md). Each is one clear line
(or a clean recovery), nothing half-made, nothing lost."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.study.journal import Outcome
from trainables.errors import UserInputError

runner = CliRunner()


def write_study(folder: Path, model: str, data_dir: Path, **changes) -> Path:
    study = {"name": "s", "model": model, "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0]},
             "train": {"epochs": 1}, "data_dir": str(data_dir),
             "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}, **changes}
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow store with its tables made once (MLflow's migrations take seconds); tests copy it."""
    from reports.store import open_store

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    open_store(f"sqlite:///{path}")
    return path


def make_store(path: Path, template: Path) -> None:
    import shutil

    shutil.copyfile(template, path)


@contextlib.contextmanager
def read_only(path: Path):
    """`path` unwritable even for root where the kernel allows it (`chattr +i`), else by mode bits."""
    immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    if not immutable:
        if os.geteuid() == 0:
            pytest.skip("root without CAP_LINUX_IMMUTABLE: nothing here makes a file read-only for root")
        path.chmod(0o444)
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o644)


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_validate_finds_a_read_only_store(tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    """SQLite opens a file it may not write read-only without a word, and taking its write lock works
    then: validate passed and the launch failed in a 192-line traceback after writing the study folder."""
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    make_store(tmp_path / "mlflow.db", empty_store)
    before = (tmp_path / "mlflow.db").read_bytes()
    with read_only(tmp_path / "mlflow.db"):
        line = one_error_line(runner.invoke(app, ["validate", str(study)]))
        assert line.startswith(f"error: tracking.mlflow_uri: 'sqlite:///{tmp_path}/mlflow.db' is not valid; the "
                               "store cannot be written now (attempt to write a readonly database); make mlflow.db")
        launched = runner.invoke(app, ["launch", str(study), "--storage", str(tmp_path / "studies")])
        assert one_error_line(launched) == line
        assert not (tmp_path / "studies").exists()  # nothing written
    assert runner.invoke(app, ["validate", str(study)]).exit_code == 0
    assert (tmp_path / "mlflow.db").read_bytes() == before  # the check wrote nothing


@pytest.mark.parametrize(("make", "problem"), [
    (lambda p: p.mkdir(), "the store cannot be written now (it is a folder); give the path of a database file"),
    (lambda p: p.write_bytes(b"not sqlite at all " * 400), "the store cannot be written now (file is not a database); "
                                                            "point tracking.mlflow_uri at an MLflow store"),
])
def test_validate_finds_a_store_that_is_no_database(tiny_bert, synthetic_data_dir, tmp_path, make, problem):
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    make(tmp_path / "mlflow.db")
    assert problem in one_error_line(runner.invoke(app, ["validate", str(study)]))


def test_a_store_locked_by_a_killed_writer_is_taken_over(tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    """A writer killed inside a transaction leaves a hot journal beside the store: the next writer rolls
    it back (the kernel dropped the killed process's locks), so validate and launch go on."""
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    make_store(tmp_path / "mlflow.db", empty_store)
    writer = subprocess.Popen(["python3", "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(tmp_path / 'mlflow.db')!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN IMMEDIATE')\n"
        "c.execute('CREATE TABLE junk (x)')\n"
        "c.executemany('INSERT INTO junk VALUES (?)', [(b'x' * 4000,) for _ in range(500)])\n"
        "print('holding', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        assert (tmp_path / "mlflow.db-journal").exists()
        assert "database is locked" in one_error_line(runner.invoke(app, ["validate", str(study)]))
    finally:
        writer.kill()
        writer.wait()
    assert runner.invoke(app, ["validate", str(study)]).exit_code == 0
    tables = sqlite3.connect(tmp_path / "mlflow.db").execute("SELECT name FROM sqlite_master").fetchall()
    assert ("junk",) not in tables  # the killed writer's transaction was rolled back


def finish_all(plan, state, *rest) -> None:
    """An executor whose trials finish at once (no Ray)."""
    while (record := state.next_trial()) not in (None, "FINISHED"):
        state.on_result(record.key, {"epoch": 1, "dev_spearman": 50.0 + record.cell})
        state.on_finished(record.key, Outcome.COMPLETED)


def test_a_store_that_turns_unwritable_after_the_checks_ends_in_one_line_and_the_relaunch_continues(
        tiny_bert, synthetic_data_dir, tmp_path, monkeypatch, empty_store):
    """The store passes validate, then refuses the parent run (here: replaced by a file that is no
    database): one line; the plain relaunch, once the store is back, takes the folder over instead of
    refusing it as an existing study, and runs everything once."""
    import orchestrator.study.plan as planning
    from orchestrator.run import launcher as launching
    from orchestrator.study import store_check

    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    storage = tmp_path / "studies"
    original = launching.launch
    monkeypatch.setattr(launching, "launch", lambda *a, **k: original(*a, **{**k, "executor": finish_all}))
    real_check = planning.check_tracking_uri

    def store_breaks_after_the_checks(uri, base):
        real_check(uri, base)
        (tmp_path / "mlflow.db").write_bytes(b"not sqlite at all " * 400)

    monkeypatch.setattr(planning, "check_tracking_uri", store_breaks_after_the_checks)
    monkeypatch.setattr(store_check, "store_problem", lambda uri: None)
    failed = runner.invoke(app, ["launch", str(study), "--storage", str(storage)])
    assert one_error_line(failed).startswith(f"error: tracking.mlflow_uri: 'sqlite:///{tmp_path}/mlflow.db' is not "
                                             "valid; the store refused the study's parent run (file is not a "
                                             "database); make it writable")
    assert "then launch again; no trial of this launch ran" in failed.stderr
    monkeypatch.setattr(planning, "check_tracking_uri", real_check)
    make_store(tmp_path / "mlflow.db", empty_store)
    again = runner.invoke(app, ["launch", str(study), "--storage", str(storage)])
    assert again.exit_code == 0, again.output
    assert "s: finished: 2 completed" in again.stdout
    from orchestrator.study.journal import Journal

    events = Journal(storage / "s" / "journal.jsonl").events()
    assert [e["event"] for e in events].count("launch") == 1  # the failed attempt's state files are gone
    assert sorted(e["key"] for e in events if e["event"] == "finished") == ["c0-s0", "c1-s0"]


def test_a_folder_where_trials_ran_is_still_refused_by_a_new_launch(tiny_bert, synthetic_data_dir, tmp_path,
                                                                    empty_store):
    from orchestrator.run.launcher import launch

    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    make_store(tmp_path / "mlflow.db", empty_store)
    launch(study, storage=tmp_path / "studies", progress=False, executor=finish_all)
    with pytest.raises(UserInputError, match="a study of that name exists in .*; run `orchestrator resume s`"):
        launch(study, storage=tmp_path / "studies", progress=False, executor=finish_all)


def test_make_run_leaves_nothing_untracked_and_setup_quiets_the_editable_notice():
    """`make run` left an untracked `examples/mlflow.db.lock` (the store's first-use lock); every editable
    install of `make setup` printed setuptools' 11-line "Editable installation" notice."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    made = ["examples/mlflow.db", "examples/mlflow.db.lock", "studies/quickstart/journal.jsonl",
            "reports/quickstart/report.md", "mlflow.db.lock"]
    ignored = subprocess.run(["git", "check-ignore", *made], cwd=root, capture_output=True, text=True).stdout.split()
    assert ignored == made
    editable = [line for line in (root / "Makefile").read_text().splitlines()
                if "pip install" in line and " -e " in line]
    assert editable and all(line.strip().startswith("$(QUIET_EDITABLE) ") for line in editable)


def test_rays_own_messages_go_to_the_study_log_not_the_terminal(tmp_path, capfd):
    """What Tune logs about errors the launch handles (a full disk, Ctrl-C's "Failed to fetch metrics for
    2 trial(s): FileNotFoundError(...)") reached the terminal above the launch's one line."""
    import logging

    import ray  # noqa: F401 (its logging setup: a stderr handler on `ray`)

    from orchestrator.run.driver_log import ray_logs_to

    fetch = logging.getLogger("ray.tune.analysis.experiment_analysis")
    before = {name: (logger.handlers[:], logger.propagate) for name, logger in logging.Logger.manager.loggerDict.items()
              if name == "ray" or name.startswith("ray.") and isinstance(logger, logging.Logger)}
    with ray_logs_to(tmp_path / "launch.log", "s: launch-1"):
        fetch.warning("Failed to fetch metrics for 2 trial(s):\n- c0-t1: FileNotFoundError('result.json')")
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            logging.getLogger("ray.tune.execution.tune_controller").exception("Trial task failed for trial c0-s0")
    written = capfd.readouterr()
    assert written.err == "" and written.out == ""
    log = (tmp_path / "launch.log").read_text()
    assert "INFO ray: s: launch-1 at " in log and "Failed to fetch metrics for 2 trial(s)" in log
    assert "Traceback (most recent call last)" in log and "No space left on device" in log
    after = {name: (logging.getLogger(name).handlers, logging.getLogger(name).propagate) for name in before}
    assert after == before  # Ray's own handlers (which hold whatever stderr was when ray was imported) are back


def test_a_study_log_that_cannot_be_written_drops_its_lines_quietly(tmp_path, capfd):
    """On a full disk the log cannot take Ray's lines either: logging's default would print a
    `--- Logging error ---` traceback for each."""
    import logging

    from orchestrator.run.driver_log import ray_logs_to

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with ray_logs_to(Path("/dev/full"), "s: launch-2"):
        logging.getLogger("ray.tune").error("Trial task failed: [Errno 28] No space left on device")
    assert capfd.readouterr().err == ""


LAUNCH_WITH_KIND = ("import sys\nfrom trainables.kinds import KINDS\nKINDS[sys.argv[1]] = sys.argv[2]\n"
                    "sys.argv = ['orchestrator', *sys.argv[3:]]\nfrom orchestrator.cli import main\nmain()\n")


@pytest.mark.slow
def test_a_full_disk_under_ray_is_the_launchs_one_line_and_rays_tracebacks_go_to_the_study_log(
        tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    """A trial that hits a full disk: the user saw 127 lines with Ray's two tracebacks above the one line
    the launch writes. Now: the banner, the progress lines, the one line (exit 1); Ray's own report of
    the failure is in the study's launch.log; `resume` runs what the disk stopped."""
    make_store(tmp_path / "mlflow.db", empty_store)
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir, trainable="toy_full", ablate={"lr": [0.1, 1.0]},
                        replicate={"seeds": [0, 1]}, train={"epochs": 3}, resources={"cpu": 1})
    kind = "tests.toy_kind:FullDiskToyKind"
    command = [sys.executable, "-c", LAUNCH_WITH_KIND, "toy_full", kind, "launch", str(study), "--storage",
               str(tmp_path / "studies"), "--max-concurrent", "1"]
    full = tmp_path / "disk-is-full"
    full.touch()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOY_FULL_DISK": str(full)}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: storage: '{tmp_path}/studies/s' has no space left; free space on its disk")
    assert "Traceback" not in done.stderr and 'File "' not in done.stderr, done.stderr[-3000:]
    assert len(lines) <= 8, done.stderr  # banner (2), a progress line per trial, the error
    log = (tmp_path / "studies" / "s" / "launch.log").read_text()
    assert "No space left on device" in log and "Traceback (most recent call last)" in log
    full.unlink()  # space again
    resumed = subprocess.run([*command[:5], "resume", "s", "--storage", str(tmp_path / "studies")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600, env=env)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert "s: finished: 4 completed, 0 pruned, 0 diverged, 0 failed of 4 planned" in resumed.stdout


def launched(tmp_path: Path, model: str, data_dir: Path, template: Path, stop_after: int | None = None, **changes):
    """A study launched with instant trials (no Ray): (study file, storage); `stop_after`: interrupted
    (as Ctrl-C would) once that many trials finished."""
    from benchmarks.instant import instant_executor
    from orchestrator.run.launcher import launch

    make_store(tmp_path / "mlflow.db", template)
    study = write_study(tmp_path, model, data_dir, **{"replicate": {"seeds": [0, 1]}, "train": {"epochs": 2},
                                                     **changes})

    def interrupt(finished: int) -> None:
        if stop_after is not None and finished >= stop_after:
            raise KeyboardInterrupt

    with contextlib.suppress(KeyboardInterrupt):
        launch(study, storage=tmp_path / "studies", progress=False,
               executor=instant_executor(lambda config, seed, epoch: 50.0 + epoch + config.get("layer", 0), slots=2,
                                         on_finished=interrupt))
    return study, tmp_path / "studies"


def state_files(folder: Path) -> dict[str, bytes]:
    """The study folder's files (not its lock, which every writer stamps)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".lock"}


def resume_instant(storage: Path, **kwargs):
    from benchmarks.instant import instant_executor
    from orchestrator.run.launcher import resume

    return resume("s", storage, progress=False, **kwargs,
                  executor=instant_executor(lambda config, seed, epoch: 50.0 + epoch + config.get("layer", 0)))


def test_a_study_folder_from_a_newer_version_is_refused_not_rewritten(tiny_bert, synthetic_data_dir, tmp_path,
                                                                      empty_store):
    """`resume` of a folder whose record a newer orchestrator wrote rewrote the record in this version's
    format (and appended this version's events to the journal); every verb now says to upgrade."""
    import json

    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2)
    folder = storage / "s"
    record = json.loads((folder / "study_record.json").read_text())
    record["version"] += 1
    (folder / "study_record.json").write_text(json.dumps(record))
    before = state_files(folder)
    expected = (f"error: {folder}/study_record.json: {record['version']} is not valid; written by a newer "
                f"orchestrator")
    for args in (["resume", "s"], ["launch", str(study), "--resume"], ["status", "s"], ["sync", "s"]):
        assert one_error_line(runner.invoke(app, [*args, "--storage", str(storage)])).startswith(expected), args
    assert state_files(folder) == before


def test_a_journal_event_of_a_newer_version_says_so(tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2)
    journal = storage / "s" / "journal.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join([lines[0], '{"event": "paused", "until": 5, "t": 1.0}', *lines[1:]]) + "\n")
    line = one_error_line(runner.invoke(app, ["status", "s", "--storage", str(storage)]))
    assert line.startswith(f"error: {journal}:2: '{{\"event\": \"paused\"") and "unknown event 'paused'" in line
    assert "a newer orchestrator writes events this one does not know" in line


@pytest.mark.parametrize(("edit", "key", "removed"), [
    ({"ablate": {"layer": [1]}}, "ablate.layer", "2"),
    ({"replicate": {"seeds": [1]}}, "replicate.seeds", "0"),
])
def test_removing_an_ablated_value_or_a_seed_on_resume_is_one_line_and_changes_nothing(
        tiny_bert, synthetic_data_dir, tmp_path, empty_store, edit, key, removed):
    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2)
    folder = storage / "s"
    before = state_files(folder)
    status = runner.invoke(app, ["status", "s", "--storage", str(storage), "--json"]).stdout
    write_study(tmp_path, tiny_bert, synthetic_data_dir, **{"replicate": {"seeds": [0, 1]}, "train": {"epochs": 2},
                                                           **edit})
    line = one_error_line(runner.invoke(app, ["launch", str(study), "--resume", "--storage", str(storage)]))
    assert line.startswith(f"error: {key}: ") and f"removing {removed} would drop cells or seeds" in line
    assert line.endswith("(what ran stays in its journal and MLflow): restore it, or launch under a new name")
    assert state_files(folder) == before
    assert runner.invoke(app, ["status", "s", "--storage", str(storage), "--json"]).stdout == status


@pytest.mark.parametrize(("damage", "problem"), [
    (lambda f: f.write_bytes(b""), "cannot be read as tsv"),
    (lambda f: f.write_bytes(bytes(range(256)) * 40), "is not utf-8 text"),
    (lambda f: (f.unlink(), f.mkdir()), "Is a directory"),
    (lambda f: f.write_text(f.read_text().replace("\t4.000\t", "\tfour\t", 1)), "'four' is not a number"),
    (lambda f: f.write_text(f.read_text()[:-30] + "\nmain-captions\tcut\n"), "is empty"),
])
def test_a_damaged_data_file_is_one_line_at_validate_and_launch(tiny_bert, synthetic_data_dir, tmp_path, damage,
                                                                problem):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(synthetic_data_dir, data)
    damage(data / "stsb" / "sts-train.csv")
    study = write_study(tmp_path, tiny_bert, data)
    assert problem in one_error_line(runner.invoke(app, ["validate", str(study)]))
    assert problem in one_error_line(runner.invoke(app, ["launch", str(study), "--storage", str(tmp_path / "st")]))
    assert not (tmp_path / "st").exists()


def test_a_50000_event_journal_replays_to_the_right_state_and_resumes(tiny_bert, synthetic_data_dir, tmp_path,
                                                                     empty_store):
    """A long study's journal (every epoch, retries, checkpoints): status and resume read it whole; the
    counts, each trial's rounds and the resumed trials must come out as from a short one."""
    import json

    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2,
                              ablate={"layer": [1, 2, 3]})
    journal = storage / "s" / "journal.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    finished = [e["key"] for e in events if e["event"] == "finished"]
    padded = []
    for event in events:  # before each `finished`: thousands of reports of a trial retried over and over
        if event["event"] == "finished":
            padded += [{"event": "result", "key": event["key"], "t": event["t"],
                        "metrics": {"epoch": 1 + i % 2, "dev_spearman": 40.0 + i % 7}} for i in range(25_000)]
        padded.append(event)
    journal.write_text("".join(json.dumps(e) + "\n" for e in padded))
    assert len(padded) > 50_000
    shown = json.loads(runner.invoke(app, ["status", "s", "--storage", str(storage), "--json"]).stdout)
    assert (shown["completed"], shown["planned"], shown["complete"]) == (len(finished), 6, False)
    result = resume_instant(storage)
    assert result.finished and result.counts["completed"] == 6
    from orchestrator.study.journal import Journal

    records = Journal(journal).records()
    assert sorted(records) == ["c0-s0", "c0-s1", "c1-s0", "c1-s1", "c2-s0", "c2-s1"]
    assert all(records[k].rounds_reached == 2 for k in records)


def hold_lock(folder: Path, what: str) -> subprocess.Popen:
    """Another process that holds the study folder's lock (a launch, a resume, a sync) until killed."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom orchestrator.study.folder import exclusive\n"
        f"with exclusive(Path({str(folder)!r}), 's', {what!r}):\n    print('holding', flush=True)\n"
        "    time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def test_resume_or_launch_while_another_runs_the_study_is_one_line_and_a_killed_holders_lock_is_taken_over(
        tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    """Concurrent `resume` and `launch`: the second is refused in one line naming the first (nothing
    written); once the first is killed (SIGKILL: no cleanup, its lock file stays) the study resumes."""
    import signal

    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2)
    folder = storage / "s"
    holder = hold_lock(folder, "launch")
    try:
        before = state_files(folder)
        for args in (["resume", "s"], ["launch", str(study), "--resume"], ["sync", "s"]):
            line = one_error_line(runner.invoke(app, [*args, "--storage", str(storage)]))
            assert line == (f"error: NAME: 's' is not valid; pid {holder.pid}, launch is running this study now; wait "
                            "for it to end or stop it (Ctrl-C); `orchestrator status s` works meanwhile"), args
        assert one_error_line(runner.invoke(app, ["launch", str(study), "--storage", str(storage)])).startswith(
            "error: name: 's' is not valid; a study of that name exists in ")
        assert runner.invoke(app, ["status", "s", "--storage", str(storage)]).exit_code == 0
        assert state_files(folder) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (folder / ".lock").read_text() == f"pid {holder.pid}, launch"  # the stale lock file stays
    result = resume_instant(storage)
    assert result.finished and result.counts["completed"] == 4


def test_report_during_a_running_launch_shows_what_finished_and_leaves_the_launch_alone(
        tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    """`report` while a launch writes the same SQLite store and journal: the report names what is not
    finished, the launch goes on to the end undisturbed, and a later report has every number."""
    make_store(tmp_path / "mlflow.db", empty_store)
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir, replicate={"seeds": [0, 1]}, train={"epochs": 2})
    halfway, go = tmp_path / "halfway", tmp_path / "go"
    script = ("import sys, time\nfrom pathlib import Path\nfrom benchmarks.instant import instant_executor\n"
              "from orchestrator.run.launcher import launch\n"
              "def pause(n):\n    if n == 2:\n        Path(sys.argv[2]).touch()\n"
              "        while not Path(sys.argv[3]).exists(): time.sleep(0.1)\n"
              "r = launch(sys.argv[1], storage=sys.argv[4], progress=False, executor=instant_executor(\n"
              "    lambda c, s, e: 50.0 + e + c.get('layer', 0), slots=1, on_finished=pause))\n"
              "print(r.counts['completed'], r.finished)\n")
    root = Path(__file__).resolve().parents[2]
    launching = subprocess.Popen([sys.executable, "-c", script, str(study), str(halfway), str(go),
                                  str(tmp_path / "studies")], cwd=root, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        deadline = 120
        while not halfway.exists() and deadline > 0 and launching.poll() is None:
            time.sleep(0.2)
            deadline -= 0.2
        assert halfway.exists(), launching.stderr.read() if launching.poll() is not None else "launch too slow"
        during = runner.invoke(app, ["report", "s", "--storage", str(tmp_path / "studies"), "--out",
                                     str(tmp_path / "during")])
        assert during.exit_code == 0 and "Traceback" not in during.output, during.output
        shown = (tmp_path / "during" / "report.md").read_text()
        assert "<sup>a</sup> not started" in shown or "<sup>a</sup> not finished" in shown
    finally:
        go.touch()
        out, err = launching.communicate(timeout=120)
    assert out.split() == ["4", "True"], err[-2000:]
    after = runner.invoke(app, ["report", "s", "--storage", str(tmp_path / "studies"), "--out", str(tmp_path / "a")])
    shown = (tmp_path / "a" / "report.md").read_text()
    assert after.exit_code == 0 and "not started" not in shown and "not finished" not in shown


def test_sighup_stops_a_launch_like_ctrl_c_unless_nohup_ignores_it_and_sigterm_stops_it_with_sigint_ignored():
    """A closed terminal (SIGHUP) killed the driver mid-step: the runs stayed RUNNING in MLflow until a
    resume. Now it takes Ctrl-C's path (Tune stops at the last checkpoints, the runs are closed, exit
    129); under `nohup` (SIGHUP ignored) the launch goes on."""
    import signal

    from orchestrator.run.ray_session import Stops, graceful_sigterm

    previous = signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGINT)
    try:
        # a terminal's defaults: CI starts the suite under nohup in the background (both signals ignored)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stops = Stops()
        with pytest.raises(KeyboardInterrupt), graceful_sigterm(stops):  # Tune's SIGINT handler stands in here
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        assert stops.signal == signal.SIGHUP
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        stops = Stops()
        with graceful_sigterm(stops):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
        assert stops.signal is None and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        # a launch started in the background by a script has SIGINT ignored: a scheduler's SIGTERM still stops it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stops = Stops()
        with pytest.raises(KeyboardInterrupt), graceful_sigterm(stops):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert stops.signal == signal.SIGTERM and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def test_a_terminal_that_is_gone_ends_the_progress_view_not_the_study(tiny_bert, synthetic_data_dir, tmp_path,
                                                                     empty_store):
    """After SIGHUP the terminal answers every write with EIO: the progress view raised inside Tune's
    callback, which ends the whole run."""
    from orchestrator.run.tune_adapters import ProgressCallback

    class GoneTerminal:
        writes = 0

        def write(self, text):
            GoneTerminal.writes += 1
            raise OSError(5, "Input/output error")

        def flush(self):
            raise OSError(5, "Input/output error")

        def isatty(self):
            return False

    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2)
    from orchestrator.study.folder import StudyFolder

    view = ProgressCallback(StudyFolder.named("s", storage).state(), ["banner"], stream=GoneTerminal(), live=False)
    view.setup()
    view.last_line = -1e9  # a heartbeat is due
    view.poll()
    view.on_experiment_end([])
    assert GoneTerminal.writes == 1  # it tried once, then stopped writing


def test_a_lock_file_that_cannot_be_opened_is_one_line(tiny_bert, synthetic_data_dir, tmp_path, empty_store):
    """A `.lock` left by another user (or made immutable) was a PermissionError traceback in launch,
    resume and sync, and in status and list (which only peek at it)."""
    study, storage = launched(tmp_path, tiny_bert, synthetic_data_dir, empty_store, stop_after=2)
    lock = storage / "s" / ".lock"
    with read_only(lock):
        line = one_error_line(runner.invoke(app, ["resume", "s", "--storage", str(storage)]))
        assert line.startswith(f"error: storage: '{storage}/s' is not valid; the study folder's lock {lock} cannot "
                               "be opened for writing")
        assert runner.invoke(app, ["status", "s", "--storage", str(storage)]).exit_code == 0
        assert "s: interrupted" in runner.invoke(app, ["list", "--storage", str(storage)]).stdout


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "times", "code"), [
    ("SIGINT", 2, 130), ("SIGHUP", 1, 129), ("SIGTERM", 1, 143),
])
def test_two_ctrl_c_or_a_closed_terminal_mid_trial_end_in_one_line_and_resume_loses_nothing(
        tiny_bert, synthetic_data_dir, tmp_path, empty_store, stop, times, code):
    """Signals sent to the launch's whole process group, as a terminal sends them: two Ctrl-C, or the
    SIGHUP of a closed terminal (which used to kill Ray's own GCS and raylet too: the driver waited 60 s
    for them and ended with exit 1 and a C++ log line), or the SIGTERM of `kill -TERM -PGID` (which still
    stops the GCS: the driver sees it gone and ends at once). The launch ends in `interrupted: ... resume s`;
    `resume` runs every trial once, one MLflow run each, no epoch twice."""
    import signal

    from mlflow.tracking import MlflowClient

    def terminal_signal_defaults() -> None:  # CI runs the suite with both ignored (nohup, in the background)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    make_store(tmp_path / "mlflow.db", empty_store)
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir, replicate={"seeds": [0, 1]},
                        train={"epochs": 6, "batch_size": 16}, resources={"cpu": 1})
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "orchestrator.cli"]
    launching = subprocess.Popen([*command, "launch", str(study), "--storage", str(tmp_path / "studies")],
                                 cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True, preexec_fn=terminal_signal_defaults)
    journal = tmp_path / "studies" / "s" / "journal.jsonl"
    deadline = time.monotonic() + 300
    while not (journal.exists() and '"event": "result"' in journal.read_text()):
        assert time.monotonic() < deadline and launching.poll() is None, launching.communicate()[1][-2000:]
        time.sleep(0.3)
    sent = time.monotonic()
    for _ in range(times):
        os.killpg(launching.pid, getattr(signal, stop))
        time.sleep(0.4)
    out, err = launching.communicate(timeout=300)
    assert launching.returncode == code, err[-3000:]
    assert time.monotonic() - sent < 30, err[-3000:]  # not Ray's 60 s wait for a GCS the signal stopped
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: ") and " resume s" in last, err[-3000:]
    assert "Traceback" not in err and "Failed to fetch metrics" not in err and "GCS" not in err, err[-3000:]
    resumed = subprocess.run([*command, "resume", "s", "--storage", str(tmp_path / "studies")], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "s: finished: 4 completed" in resumed.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.tags["orchestrator.trial_key"] for r in children) == ["c0-s0", "c0-s1", "c1-s0", "c1-s1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    for run in children:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "dev_spearman")]
        assert sorted(steps) == [1, 2, 3, 4, 5, 6]
