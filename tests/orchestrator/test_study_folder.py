"""A study folder's state under faults: one writer at a time, whole files or none, a journal that
names a damaged line instead of guessing, a study id that survives its file, and a stored study
file edited by hand checked like any other edit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.study import folder as study_folder
from orchestrator.study.folder import exclusive, is_running, read_json, read_meta, write_atomic
from orchestrator.study.journal import Journal, JournalError
from trainables.errors import UserInputError


def test_a_second_writer_is_refused_in_one_line_while_the_first_holds_the_folder(tmp_path):
    folder = tmp_path / "s"
    with exclusive(folder, "s", "launch"):
        assert is_running(folder)
        with pytest.raises(UserInputError) as refused, exclusive(folder, "s", "sync"):
            pass
        assert str(refused.value).startswith(f"NAME: 's' is not valid; pid {os.getpid()}, launch is running this "
                                             "study now; wait for it to end")
    assert not is_running(folder)
    with exclusive(folder, "s", "resume"):  # released: the next writer gets it
        pass


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    folder = tmp_path / "s"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from orchestrator.study.folder import exclusive\n"
        f"with exclusive(Path({str(folder)!r}), 's', 'launch'):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    assert holder.stdout.readline().strip() == "held"
    assert is_running(folder)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with exclusive(folder, "s", "resume"):  # no stale-lock cleanup needed: the kernel dropped it
        assert (folder / study_folder.LOCK).read_text() == f"pid {os.getpid()}, resume"


def test_sync_is_refused_while_the_study_runs(tmp_path):
    from orchestrator.run.launcher import sync

    folder = tmp_path / "studies" / "s"
    folder.mkdir(parents=True)
    (folder / "study.yaml").write_text("name: s\nmodel: m\n")
    with exclusive(folder, "s", "launch"), pytest.raises(UserInputError, match="is running this study now"):
        sync("s", tmp_path / "studies")
    with pytest.raises(UserInputError, match="no study folder"):
        sync("typo", tmp_path / "studies")
    assert not (tmp_path / "studies" / "typo").exists()  # a typo creates nothing


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "launch.json"
    write_atomic(path, json.dumps({"study_uid": "old"}))

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(study_folder.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, json.dumps({"study_uid": "new"}))
    assert read_json(path) == {"study_uid": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["launch.json"]  # no temp file left behind


def test_a_truncated_launch_json_is_rebuilt_from_the_journal(tmp_path):
    folder = tmp_path / "s"
    journal = Journal(folder / "journal.jsonl")
    meta = {"base_dir": "/work", "study_uid": "abc123", "tracking_uri": "sqlite:////work/mlflow.db"}
    journal.write("launch", **meta)
    (folder / "launch.json").write_text('{"base_dir": "/wo')  # what a crash mid-write used to leave
    assert read_meta(folder) == meta
    (folder / "plan.json").write_text('{"cells": [')
    with pytest.raises(UserInputError, match=r"plan.json: 'plan.json' is not valid; the file is damaged"):
        read_json(folder / "plan.json")


@pytest.mark.parametrize(("line", "problem"), [
    (b"42", "a int, not an event"), (b'{"key": "c0-s0"}', "no `event` field"),
    (b'{"event": "finished", "key": "c0-s0", "outcome": "won"}', "unknown outcome 'won'"),
    (b'{"event": "result", "key": "c0-s0"}', "a result event without metrics"),
    (b"\xff\xfe not text", "not a JSON line (UnicodeDecodeError)"), (b'{"event": "fin', "not a JSON line")])
def test_a_damaged_journal_line_in_the_middle_is_named_by_number(tmp_path, line, problem):
    path = tmp_path / "journal.jsonl"
    good = b'{"event": "cells", "keys": ["layer=1"]}\n'
    path.write_bytes(good + line + b"\n" + good)
    with pytest.raises(JournalError) as damaged:
        Journal(path).events()
    assert f"{path}:2" in str(damaged.value) and problem in str(damaged.value) and "nothing is guessed" in str(
        damaged.value)


def test_a_torn_last_line_is_still_forgiven(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"event": "cells", "keys": ["a"]}\n{"event": "issu')
    assert Journal(path, repair=False).events() == [{"event": "cells", "keys": ["a"]}]


def test_status_of_a_study_with_a_damaged_journal_is_one_line_exit_2(tmp_path):
    folder = tmp_path / "studies" / "s"
    folder.mkdir(parents=True)
    (folder / "study.yaml").write_text(yaml.safe_dump({"name": "s", "model": "m"}))
    (folder / "plan.json").write_text(json.dumps({"cells": [{}], "seeds": [0], "base": {}, "metric": "dev_spearman",
                                                  "mode": "max", "epochs": 1, "origins": {}, "cell_reports": [1],
                                                  "kind_path": "trainables.kinds.finetune:FinetuneKind"}))
    (folder / "journal.jsonl").write_bytes(b'{"event": "cells", "keys": ["all"]}\n42\n{"event": "cells", "keys": []}\n')
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", "s", "--storage",
                             str(tmp_path / "studies")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "journal.jsonl:2" in result.stderr, result.stderr
    assert time.monotonic() - started < 120


def test_resume_by_name_applies_the_edit_rules_to_a_hand_edited_study_file(tmp_path):
    """studies/NAME/study.yaml edited by hand (a seed added, and train.lr changed) used to train the
    new seed with the new lr and average it with the old seed into one cell."""
    from orchestrator.run.launcher import resume

    folder = tmp_path / "studies" / "s"
    folder.mkdir(parents=True)
    launched = {"name": "s", "model": "m", "replicate": {"seeds": [0]}, "train": {"lr": 2e-5}}
    (folder / "study.launched.yaml").write_text(yaml.safe_dump(launched))
    (folder / "study.yaml").write_text(yaml.safe_dump({**launched, "replicate": {"seeds": [0, 1]},
                                                       "train": {"lr": 0.05}}))
    Journal(folder / "journal.jsonl").write("launch", base_dir=str(tmp_path), study_uid="u",
                                            tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(UserInputError) as refused:
        resume("s", tmp_path / "studies")
    assert str(refused.value) == ("train.lr: 0.05 is not valid; the study was launched with 2e-05; that change would "
                                  "invalidate its finished work: restore it, or launch under a new name")


def test_a_locked_tracking_store_fails_validation_before_anything_is_written(tmp_path):
    import sqlite3

    from orchestrator.study.store_check import check_tracking_uri

    database = tmp_path / "mlflow.db"
    holder = sqlite3.connect(str(database), isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write, or a tool holding the file
    try:
        with pytest.raises(UserInputError, match=r"the store cannot be written now \(database is locked\)"):
            check_tracking_uri(f"sqlite:///{database}", tmp_path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    check_tracking_uri(f"sqlite:///{database}", tmp_path)  # released: fine


@pytest.mark.slow
def test_studies_opening_one_new_store_at_once_all_get_it(tmp_path):
    """Two studies launched at once into one new `mlflow.db`: MLflow created the tables twice at
    once, and all but one died in `table … already exists` or alembic's row-count errors (3 of 3
    tries with 3 processes), leaving a half-made store."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    start = time.time() + 20  # every process has imported MLflow by then: they open the store together
    script = ("import sys, time\nfrom orchestrator.run.tracking import StudyTracker\n"
              f"while time.time() < {start}: time.sleep(0.001)\n"
              f"print(StudyTracker({uri!r}, sys.argv[1]).experiment_id)")
    openers = [subprocess.Popen([sys.executable, "-c", script, f"study{i}"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(4)]
    results = [(opener.wait(timeout=180), *opener.communicate()) for opener in openers]
    assert [code for code, _, _ in results] == [0] * 4, [err[-600:] for _, _, err in results]
    assert sorted(int(out) for _, out, _ in results) == [1, 2, 3, 4]
    from mlflow.tracking import MlflowClient

    names = {e.name for e in MlflowClient(uri).search_experiments()}
    assert {f"study{i}" for i in range(4)} <= names


def test_a_report_from_a_typo_store_creates_no_store(tmp_path, monkeypatch):
    from reports.collect import collect

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserInputError, match="no MLflow store there"):
        collect("sqlite:///mlfow.db", "s")
    assert list(tmp_path.iterdir()) == []


def test_a_yaml_alias_bomb_is_one_short_line(tmp_path):
    from orchestrator.study.config import load_study

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    assert len(bomb) < 600
    with pytest.raises(UserInputError) as refused:
        load_study(path)
    assert "its YAML aliases expand to more than 100,000 values" in str(refused.value)
    assert len(str(refused.value)) < 400


def test_an_error_about_a_huge_value_stays_one_short_line():
    error = UserInputError("train.layer", list(range(100_000)), "use a number")
    assert len(str(error)) < 300 and "characters)" in str(error) and "\n" not in str(error)


def small_study_folder(root, name: str, finished: bool) -> None:
    """A study folder as a launch leaves it: one cell, one seed, its trial finished or not."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "study.yaml").write_text(yaml.safe_dump({"name": name, "model": "m"}))
    (folder / "plan.json").write_text(json.dumps({"cells": [{"layer": 1}], "seeds": [0], "base": {},
                                                  "metric": "dev_spearman", "mode": "max", "epochs": 1,
                                                  "origins": {}, "cell_reports": [1],
                                                  "kind_path": "trainables.kinds.finetune:FinetuneKind"}))
    journal = Journal(folder / "journal.jsonl")
    journal.write("issued", key="c0-s0", cell=0, cell_key="layer=1", phase="replicate", seed=0, tuned={},
                  config={"layer": 1})
    journal.write("result", key="c0-s0", metrics={"epoch": 1, "dev_spearman": 71.5})
    if finished:
        journal.write("finished", key="c0-s0", outcome="completed", error=None)


def test_list_status_json_and_version(tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    root = tmp_path / "studies"
    small_study_folder(root, "done", finished=True)
    small_study_folder(root, "halfway", finished=False)
    runner = CliRunner()
    listed = runner.invoke(app, ["list", "--storage", str(root)])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines() == ["done: finished · 1 completed, 0 pruned, 0 failed of 1 planned",
                                          "halfway: interrupted · 0 completed, 0 pruned, 0 failed of 1 planned"]
    with exclusive(root / "halfway", "halfway", "launch"):
        assert "halfway: running now" in runner.invoke(app, ["list", "--storage", str(root)]).stdout
    shown = json.loads(runner.invoke(app, ["status", "done", "--storage", str(root), "--json"]).stdout)
    assert shown["complete"] is True and shown["completed"] == 1 and shown["running_now"] is False
    assert shown["cells"] == [{"cell": "layer=1", "layer": 1, "tuning_finished": 0, "tuning_planned": 0,
                               "replicates_finished": 1, "replicates_planned": 1, "skipped": None,
                               "seed_rule": None, "best_dev_spearman": 71.5, "tuning_best_dev_spearman": None,
                               "replicates_mean_dev_spearman": 71.5}]
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("orchestrator (ablation-orchestrator) ")


ENOSPC = "OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"


def test_a_full_disk_under_the_journal_is_one_line_naming_the_folder_and_resume():
    from trainables.errors import StorageFullError

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(StorageFullError) as full:
        Journal("/dev/full").write("retry", key="c0-s0")
    assert str(full.value).startswith("storage: '/dev' has no space left; free space on its disk")
    assert "orchestrator resume" in str(full.value) and full.value.exit_code == 1


def test_a_trial_the_full_disk_failed_runs_again_on_resume_and_one_that_failed_on_its_own_does_not(
        tiny_bert, synthetic_data_dir, tmp_path):
    """A study on a full disk: the launch stops in one line (exit 1), keeps what finished, and a resume
    once there is space runs the trials the disk failed, from where they were, to the end."""
    from orchestrator.run.launcher import launch
    from orchestrator.study.journal import Outcome
    from trainables.errors import StorageFullError

    def executor(fail: dict[str, str]):
        def run(plan, state, *rest) -> None:
            while (record := state.next_trial()) not in (None, "FINISHED"):
                start = len(record.results)
                for epoch in range(start + 1, plan.epochs + 1):
                    state.on_result(record.key, {"epoch": epoch, "dev_spearman": 10.0 * epoch + record.seed})
                    if record.key in fail and epoch == 1:
                        break
                if record.key in fail:
                    state.on_finished(record.key, Outcome.FAILED, fail[record.key])
                    if state.storage_full:
                        return  # what the Tune adapters do: stop as Ctrl-C would
                else:
                    state.on_finished(record.key, Outcome.COMPLETED)
        return run

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": tiny_bert, "ablate": {"layer": [1, 2]},
                                     "replicate": {"seeds": [0, 1]}, "train": {"epochs": 3},
                                     "data_dir": str(synthetic_data_dir),
                                     "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    storage = tmp_path / "studies"
    with pytest.raises(StorageFullError, match="orchestrator resume s"):
        launch(study, storage=storage, progress=False,
               executor=executor({"c1-s0": "ValueError: its own bug", "c1-s1": ENOSPC}))
    events = Journal(storage / "s" / "journal.jsonl").events()
    assert [e["key"] for e in events if e["event"] == "finished"] == ["c1-s0", "c1-s1"]
    result = launch(study, storage=storage, resume=True, progress=False, executor=executor({}))
    assert result.finished and result.counts["completed"] == 3 and result.counts["failed"] == 1
    records = Journal(storage / "s" / "journal.jsonl").records()
    assert records["c1-s0"].outcome == Outcome.FAILED  # its own error: not run again
    assert records["c1-s1"].outcome == Outcome.COMPLETED  # the disk's: run again, from its epoch 1 on
    assert [r["epoch"] for r in records["c1-s1"].results] == [1, 2, 3]


def test_a_save_folder_that_cannot_be_written_is_refused_before_the_launch_writes_anything(
        tiny_bert, synthetic_data_dir, tmp_path):
    from orchestrator.run.launcher import launch

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": tiny_bert, "save": "best_per_cell",
                                     "data_dir": str(synthetic_data_dir),
                                     "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    (tmp_path / "studies" / "s").mkdir(parents=True)
    (tmp_path / "studies" / "s" / "models").write_text("a file where the models folder goes")
    with pytest.raises(UserInputError, match=r"^save: 'best_per_cell' is not valid; its models go to .*models, "
                                             r"where nothing can be written \(.* is a file\)"):
        launch(study, storage=tmp_path / "studies", progress=False, executor=lambda *a: None)
    assert sorted(p.name for p in (tmp_path / "studies" / "s").iterdir()) == ["models"]
    assert not (tmp_path / "mlflow.db").exists()


def test_a_worker_killed_for_memory_ends_the_launch_in_one_line_and_the_study_resumes(
        tiny_bert, synthetic_data_dir, tmp_path, monkeypatch):
    """Ray's memory monitor kills a worker and Tune ends the whole run with a RuntimeError (seen with two
    base-size workers on 24 GiB): one line, exit 1, and `resume` runs what was left."""
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.run import launcher as launching
    from orchestrator.study.journal import Outcome

    def killed(plan, state, *rest) -> None:
        first = state.next_trial()
        state.on_result(first.key, {"epoch": 1, "dev_spearman": 50.0})
        state.on_finished(first.key, Outcome.COMPLETED)
        state.next_trial()
        raise RuntimeError("Caught unexpected exception: 1 worker(s) were killed due to the node running low on "
                           "memory. Memory on the node (IP: 10.0.0.1) was 22.22GB used / 23.54GB limit")

    def finish(plan, state, *rest) -> None:
        while (record := state.next_trial()) not in (None, "FINISHED"):
            state.on_result(record.key, {"epoch": 1, "dev_spearman": 50.0})
            state.on_finished(record.key, Outcome.COMPLETED)

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": tiny_bert, "replicate": {"seeds": [0, 1, 2]},
                                     "train": {"epochs": 1}, "data_dir": str(synthetic_data_dir),
                                     "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    original = launching.launch
    monkeypatch.setattr(launching, "launch", lambda *a, **k: original(*a, **{**k, "executor": killed}))
    result = CliRunner().invoke(app, ["launch", str(study), "--storage", str(tmp_path / "studies")])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith("error: resources: {'cpu': 1.0, 'gpu': 0.0} ran out of memory; Ray killed")
    assert "orchestrator resume s" in result.stderr
    resumed = original(tmp_path / "studies" / "s" / "study.yaml", storage=tmp_path / "studies", resume=True,
                       progress=False, executor=finish)
    assert resumed.finished and resumed.counts["completed"] == 3


@pytest.mark.slow
def test_aws_credentials_are_not_written_to_rays_session_logs(tiny_bert, synthetic_data_dir, tmp_path):
    """Tune copied AWS_* into every trial's runtime environment, and Ray's runtime-env agent wrote it
    in plain text to `logs/runtime_env_agent.log` (mode 644) under the temp folder."""
    import shutil
    import tempfile

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": tiny_bert, "ablate": {"layer": [1]},
                                     "replicate": {"seeds": [0]}, "train": {"epochs": 1},
                                     "data_dir": str(synthetic_data_dir), "resources": {"cpu": 1},
                                     "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_TMPDIR": ray_tmp,
               "AWS_ACCESS_KEY_ID": "sentinel-id-4711", "AWS_SECRET_ACCESS_KEY": "sentinel-secret-4711"}
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "launch", str(study), "--storage",
                               str(tmp_path / "studies")], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        logs = [p for p in Path(ray_tmp).rglob("*.log") if p.is_file()]
        assert any(p.name == "runtime_env_agent.log" for p in logs)  # the log that used to hold them
        leaked = [str(p) for folder in (Path(ray_tmp), tmp_path) for p in folder.rglob("*")
                  if p.is_file() and not p.is_socket() and b"sentinel-secret-4711" in p.read_bytes()]
        assert leaked == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
