"""A study folder damaged in any way a disk, a sync tool or a hand can damage it: any of its files replaced by
a folder, a truncated copy, random bytes, or nothing. Every verb that reads a study answers in one line or
works; none ends in a traceback, and the verbs that only read write nothing into the study folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from benchmarks.instant import instant_executor
from orchestrator.cli import app
from orchestrator.testing.fixtures import synthetic_data, tiny_encoder

runner = CliRunner()
READING = ("status", "list", "report")  # doctor starts Ray: its own tests


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished study (two layers, two seeds, its trials by the instant executor) and its report."""
    from orchestrator.run.launcher import launch

    root = tmp_path_factory.mktemp("finished")
    model = tiny_encoder(root / "tiny", 2, 32, 0)
    data = synthetic_data(root / "data")
    study = {"name": "s", "model": str(model), "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
             "train": {"epochs": 2}, "data_dir": str(data),
             "tracking": {"mlflow_uri": f"sqlite:///{root / 'mlflow.db'}"}}
    (root / "s.yaml").write_text(yaml.safe_dump(study))
    launch(root / "s.yaml", storage=root / "studies", progress=False,
           executor=instant_executor(lambda config, seed, epoch: 40.0 + epoch))
    shutil.copytree(root / "studies", root / "pristine")
    shutil.copyfile(root / "mlflow.db", root / "mlflow.pristine")
    return root


def state_files(root: Path) -> list[str]:
    folder = root / "pristine" / "s"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and not ({"ray", "mlartifacts"} & set(p.relative_to(folder).parts)))


def snapshot(folder: Path) -> dict[str, tuple[bool, int]]:
    return {str(p.relative_to(folder)): (p.is_dir(), p.stat().st_mtime_ns if p.is_file() else 0)
            for p in folder.rglob("*")}


def damage(target: Path, how: str, cut: float, noise: bytes) -> None:
    text = target.read_bytes()
    target.unlink()
    if how == "folder":
        target.mkdir()
    elif how == "truncated":
        target.write_bytes(text[: int(len(text) * cut)])
    elif how == "random":
        target.write_bytes(noise)


def run_verb(verb: str, root: Path) -> object:
    storage = str(root / "studies")
    args = {"status": ["status", "s"], "list": ["list"], "report": ["report", "s", "--out", str(root / "out")],
            "doctor": ["doctor", "--study", "s"], "sync": ["sync", "s"]}[verb]
    return runner.invoke(app, [*args, "--storage", storage])


def test_every_file_of_the_folder_is_there(finished):
    """What the property below damages: the folder's state files, whatever their number."""
    assert {"journal.jsonl", "launch.json", "study_record.json", "study.yaml", "study.launched.yaml"} <= set(
        state_files(finished))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), how=st.sampled_from(["folder", "truncated", "random", "missing"]),
       verb=st.sampled_from([*READING, "sync"]), cut=st.floats(0.0, 0.99),
       noise=st.binary(min_size=0, max_size=300))
def test_no_damage_to_a_study_folder_ends_in_a_traceback(finished, data, how, verb, cut, noise):
    name = data.draw(st.sampled_from(state_files(finished)), label="file")
    shutil.rmtree(finished / "studies", ignore_errors=True)
    shutil.rmtree(finished / "out", ignore_errors=True)
    shutil.copytree(finished / "pristine", finished / "studies")
    shutil.copyfile(finished / "mlflow.pristine", finished / "mlflow.db")
    damage(finished / "studies" / "s" / name, how, cut, noise)
    before = snapshot(finished / "studies")
    result = run_verb(verb, finished)
    assert result.exception is None or isinstance(result.exception, SystemExit), (name, how, verb, result.output)
    if result.exit_code != 0:
        lines = result.stderr.strip().splitlines()
        assert len(lines) >= 1 and all(line.startswith(("error: ", "warning: ")) for line in lines), result.output
    if verb in READING:
        assert snapshot(finished / "studies") == before, (name, how, verb)


def test_a_storage_path_that_is_a_file_is_one_line_before_ray_starts(finished, tmp_path, monkeypatch):
    """It was a 59-line traceback after Ray had started."""
    from orchestrator.run import launcher

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(launcher, "connect_ray", no_ray)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").write_text("not a folder")
    result = runner.invoke(app, ["launch", str(finished / "s.yaml"), "--storage", str(tmp_path / "studies")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0] == (f"error: --storage: '{tmp_path / 'studies'}' is not valid; study folders cannot be made "
                        f"there ({tmp_path / 'studies'} is a file); give a folder you can write")
    assert (tmp_path / "studies").read_text() == "not a folder"


def test_ui_of_a_study_whose_store_was_moved_is_one_line_and_writes_nothing(finished, tmp_path):
    """It served an empty MLflow UI and made an empty mlflow.db where the store had been."""
    shutil.rmtree(finished / "studies", ignore_errors=True)
    shutil.copytree(finished / "pristine", finished / "studies")
    store = finished / "mlflow.db"
    store.unlink(missing_ok=True)
    try:
        result = runner.invoke(app, ["ui", "s", "--storage", str(finished / "studies")])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (f"error: NAME: 's' is not valid; its MLflow store {store} is not there "
                                         "(moved or deleted?); put it back at that path to see its runs "
                                         "(`orchestrator status` reads the study's own journal meanwhile)")
        assert not store.exists()
    finally:
        shutil.copyfile(finished / "mlflow.pristine", store)


@pytest.mark.parametrize("name", ["journal.jsonl", "launch.json", "study_record.json", "study.yaml",
                                  "study.launched.yaml"])
def test_resume_of_a_folder_with_a_folder_where_a_state_file_belongs_is_one_line(finished, name):
    shutil.rmtree(finished / "studies", ignore_errors=True)
    shutil.copytree(finished / "pristine", finished / "studies")
    shutil.copyfile(finished / "mlflow.pristine", finished / "mlflow.db")
    target = finished / "studies" / "s" / name
    target.unlink()
    target.mkdir()
    result = runner.invoke(app, ["resume", "s", "--storage", str(finished / "studies")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and str(target) in lines[0], result.output
    assert os.path.isdir(target)


@pytest.mark.parametrize("written", ["!!python/object/apply:os.system ['touch {marker}']\n",
                                     "name: !!python/name:os.getcwd s\n", "name: !custom s\n"])
def test_a_yaml_tag_in_the_stored_study_file_runs_nothing_and_is_one_line(finished, tmp_path, written):
    """A stored study file is read with a safe loader: a tag (a hand's edit, or someone's attempt to run
    code through a shared study folder) is one line naming the tag and the file; nothing is constructed."""
    shutil.rmtree(finished / "studies", ignore_errors=True)
    shutil.copytree(finished / "pristine", finished / "studies")
    shutil.copyfile(finished / "mlflow.pristine", finished / "mlflow.db")
    marker = tmp_path / "constructed"
    stored = finished / "studies" / "s" / "study.yaml"
    stored.write_text(written.format(marker=marker))
    for verb in (["status", "s"], ["resume", "s"], ["sync", "s"]):
        before = snapshot(finished / "studies")
        result = runner.invoke(app, [*verb, "--storage", str(finished / "studies")])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (verb, result.output)
        assert lines[0].startswith(f"error: study file: '{stored}' is not valid; YAML tag ") and "remove the tag" in \
            lines[0], lines[0]
        if verb[0] != "sync":  # sync takes the study's lock (its .lock file's time) before it reads
            assert snapshot(finished / "studies") == before, verb
    listed = runner.invoke(app, ["list", "--storage", str(finished / "studies")])
    assert listed.exit_code == 0 and "s: damaged · study file: " in listed.stdout and "YAML tag" in listed.stdout
    assert not marker.exists()
