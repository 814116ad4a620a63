"""Fault cases: an unwritable tracking store, a store that turns unwritable between the checks and the
launch, and the other faults of the reliability table (docs/reliability.md). Each is one clear line
(or a clean recovery), nothing half-made, nothing lost."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.journal import Outcome
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
    import orchestrator.plan as planning
    from orchestrator import launch as launching

    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    storage = tmp_path / "studies"
    original = launching.launch
    monkeypatch.setattr(launching, "launch", lambda *a, **k: original(*a, **{**k, "executor": finish_all}))
    real_check = planning.check_tracking_uri

    def store_breaks_after_the_checks(uri, base):
        real_check(uri, base)
        (tmp_path / "mlflow.db").write_bytes(b"not sqlite at all " * 400)

    monkeypatch.setattr(planning, "check_tracking_uri", store_breaks_after_the_checks)
    monkeypatch.setattr(planning, "store_problem", lambda uri: None)
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
    from orchestrator.journal import Journal

    events = Journal(storage / "s" / "journal.jsonl").events()
    assert [e["event"] for e in events].count("launch") == 1  # the failed attempt's state files are gone
    assert sorted(e["key"] for e in events if e["event"] == "finished") == ["c0-s0", "c1-s0"]


def test_a_folder_where_trials_ran_is_still_refused_by_a_new_launch(tiny_bert, synthetic_data_dir, tmp_path,
                                                                    empty_store):
    from orchestrator.launch import launch

    study = write_study(tmp_path, tiny_bert, synthetic_data_dir)
    make_store(tmp_path / "mlflow.db", empty_store)
    launch(study, storage=tmp_path / "studies", progress=False, executor=finish_all)
    with pytest.raises(UserInputError, match="a study of that name exists in .*; run `orchestrator resume s`"):
        launch(study, storage=tmp_path / "studies", progress=False, executor=finish_all)


def test_make_run_leaves_nothing_untracked_and_setup_quiets_the_editable_notice():
    """`make run` left an untracked `examples/mlflow.db.lock` (the store's first-use lock); every editable
    install of `make setup` printed setuptools' 11-line "Editable installation" notice."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    made = ["examples/mlflow.db", "examples/mlflow.db.lock", "studies/quickstart/journal.jsonl",
            "reports/quickstart/report.md", "mlflow.db.lock"]
    ignored = subprocess.run(["git", "check-ignore", *made], cwd=root, capture_output=True, text=True).stdout.split()
    assert ignored == made
    editable = [line for line in (root / "Makefile").read_text().splitlines()
                if "pip install" in line and " -e " in line]
    assert editable and all(line.strip().startswith("$(QUIET_EDITABLE) ") for line in editable)
