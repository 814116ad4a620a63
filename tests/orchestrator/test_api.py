"""The public Python API (`import orchestrator as orc`): every verb of the CLI as a typed, documented
function; the same errors as exceptions; a launch from Python that writes what the CLI writes and, when
interrupted, resumes like the CLI."""

from __future__ import annotations

import inspect
import json
import re

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import orchestrator as orc
from benchmarks.instant import instant_executor
from orchestrator.cli import app
from orchestrator.run import launcher
from trainables.errors import UserInputError

runner = CliRunner()
EPOCHS = 2


def score(config: dict, seed: int, epoch: int) -> float:
    return 50 + 5 * config["layer"] + 0.5 * seed + epoch


def study_file(folder, tiny_bert, data_dir, name="api", **changes):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": tiny_bert, "ablate": {"layer": [1, 2, 3]}, "replicate": {"seeds": [0, 1, 2]},
        "train": {"epochs": EPOCHS}, "data_dir": str(data_dir), "report": {"baseline": {"layer": 3}},
        "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}, **changes}))
    return path


@pytest.fixture()
def no_ray(monkeypatch):
    """`orc.launch` as it runs, with Ray Tune's execution of the trials replaced by benchmarks/instant.py."""
    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=4))


def test_every_public_name_resolves_with_types_and_a_docstring():
    for name in orc.__all__:
        thing = getattr(orc, name)
        assert inspect.getdoc(thing), name
        if inspect.isfunction(thing):
            signature = inspect.signature(thing)
            assert signature.return_annotation is not inspect.Signature.empty, name
            assert all(p.annotation is not inspect.Parameter.empty for p in signature.parameters.values()), name
    assert set(orc.__all__) <= set(dir(orc))
    with pytest.raises(AttributeError):
        orc.no_such_thing  # noqa: B018


def test_a_launch_from_python_writes_what_the_cli_writes(tmp_path, tiny_bert, synthetic_data_dir, no_ray,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = orc.load_study(study_file(tmp_path, tiny_bert, synthetic_data_dir), ["train.epochs=3"], name="api3")
    planned = orc.plan(study)
    assert (planned.name, planned.trials, planned.rounds_per_trial) == ("api3", 9, 3)
    assert list(planned.cells.columns) == ["index", "cell", "layer", "tuning_trials", "replicates"]
    assert list(planned.cells.cell) == ["layer=1", "layer=2", "layer=3"]

    result = orc.launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["completed"] == 9 and result.study.name == "api3"
    folder = tmp_path / "studies" / "api3"
    assert yaml.safe_load((folder / "study.yaml").read_text())["train"] == {"epochs": 3}
    report = result.report
    assert report is not None and report.folder.resolve() == tmp_path / "reports" / "api3"
    assert {p.name for p in report.files} >= {"report.md", "runs.csv", "cells.csv", "ablation.tex"}
    # the tables as DataFrames say what report.md says
    ablation = report.tables["ablation"]
    assert list(ablation.columns) == ["1", "2", "3"]
    markdown = (report.folder / "report.md").read_text()
    assert all(value.rstrip("*") in markdown for value in ablation.iloc[0])
    test = (orc.results("api3", storage=tmp_path / "studies", phase="replicate")
            .groupby("layer").test_spearman.agg(["mean", "std"]))
    for column in ("mean", "std"):  # the report's cells are the results' replicates, and cells.csv holds them
        assert report.cells.set_index("layer")[column].to_numpy() == pytest.approx(test[column].to_numpy())
        assert pd.read_csv(report.folder / "cells.csv")[column].to_numpy() == pytest.approx(test[column].to_numpy())

    # status and verify: the CLI prints exactly what the API returns
    shown = runner.invoke(app, ["status", "api3", "--storage", str(tmp_path / "studies"), "--json"])
    assert json.loads(shown.stdout) == orc.status("api3", storage=tmp_path / "studies").as_dict()
    checked = orc.verify(report.folder)
    assert checked.ok and checked.cells == 3
    cells = pd.read_csv(report.folder / "cells.csv")
    cells.loc[0, "mean"] += 1.0
    cells.to_csv(report.folder / "cells.csv", index=False)
    tampered = orc.verify(report.folder)
    assert not tampered.ok and any("layer=1" in problem for problem in tampered.problems)


def test_the_study_handle_runs_every_verb_and_builds_its_plan_once(tmp_path, tiny_bert, synthetic_data_dir, no_ray,
                                                                   monkeypatch):
    """`load_study` returns a Study a notebook holds: plan, launch, status, results, report and verify are its
    methods, the plan that load_study checked is the one the launch runs (built, and its data read and
    hashed, once), and a study opened by name answers the same questions."""
    from orchestrator.study import plan as plan_module

    built = []
    real = plan_module.build_plan

    def counted(*args, **kwargs):
        built.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "build_plan", counted)
    monkeypatch.setattr(launcher, "build_plan", counted)
    monkeypatch.chdir(tmp_path)
    study = orc.load_study(study_file(tmp_path, tiny_bert, synthetic_data_dir), name="handle",
                           storage=tmp_path / "elsewhere")
    assert isinstance(study, orc.Study) and study.name == "handle" and study.config.train["epochs"] == EPOCHS
    assert study.folder.folder == tmp_path / "elsewhere" / "handle" and not study.folder.exists()
    assert study.plan().trials == 9 and list(study.plan().cells.cell) == ["layer=1", "layer=2", "layer=3"]
    result = study.launch(progress=False)
    assert built == ["handle"]  # load_study's plan ran the launch: the data was read and hashed once
    assert result.finished and result.counts["completed"] == 9 and study.folder.exists()
    assert study.status().complete and study.status().counts["completed"] == 9
    runs = study.results(phase="replicate")
    assert len(runs) == 9 and set(runs.layer) == {1, 2, 3}
    assert study.report().folder.resolve() == tmp_path / "reports" / "handle" and study.verify().ok

    again = orc.Study.named("handle", storage=tmp_path / "elsewhere")  # a later session: the folder by name
    assert again.config == study.config and again.status().as_dict() == study.status().as_dict()
    assert again.results().equals(orc.results(study)) and orc.results(again).equals(orc.results("handle",
                                                                                        storage=tmp_path / "elsewhere"))
    with pytest.raises(UserInputError, match="a study opened by name has no study file of yours to run"):
        again.launch()
    with pytest.raises(UserInputError, match=r"^storage: .* the study handle lives in"):
        orc.status(study, storage=tmp_path / "studies")
    relaunched = orc.load_study(study_file(tmp_path, tiny_bert, synthetic_data_dir), name="handle",
                                storage=tmp_path / "elsewhere", check=False)
    with pytest.raises(UserInputError, match="a study of that name exists"):
        relaunched.launch(progress=False)
    assert relaunched.launch(resume=True, progress=False).counts["completed"] == 9  # nothing left: nothing runs


def test_results_of_two_studies_compare_in_one_frame(tmp_path, tiny_bert, synthetic_data_dir, no_ray, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = study_file(tmp_path, tiny_bert, synthetic_data_dir)
    for name, epochs in (("short", 1), ("long", 3)):
        orc.launch(path, [f"train.epochs={epochs}"], name=name, storage=tmp_path / "studies", progress=False)
    both = pd.concat([orc.results(name, storage=tmp_path / "studies", phase="replicate")
                      for name in ("short", "long")])
    means = both.groupby(["study", "layer"]).best_dev_spearman.mean().unstack("study")
    assert (means["long"] - means["short"]).to_numpy() == pytest.approx([2.0, 2.0, 2.0])  # epoch 3 vs 1
    together = orc.report(["short", "long"], storage=tmp_path / "studies")
    assert together.folder.resolve() == tmp_path / "reports" / "short+long" and "study" in together.cells.columns


@pytest.mark.parametrize(("call", "cli"), [
    (lambda s: orc.load_study(s / "api.yaml", ["train.epochs=zero"]),
     ["validate", "{s}/api.yaml", "train.epochs=zero"]),
    (lambda s: orc.plan(s / "api.yaml", ["trian.epochs=1"]), ["plan", "{s}/api.yaml", "trian.epochs=1"]),
    (lambda s: orc.status("nothing", storage=s / "studies"), ["status", "nothing", "--storage", "{s}/studies"]),
    (lambda s: orc.resume("nothing", storage=s / "studies"), ["resume", "nothing", "--storage", "{s}/studies"]),
    (lambda s: orc.results("nothing", storage=s / "studies"), None),
    (lambda s: orc.report("nothing", storage=s / "studies"), ["report", "nothing", "--storage", "{s}/studies"]),
    (lambda s: orc.verify(s), ["verify", "{s}"]),
    (lambda s: orc.sync("nothing", storage=s / "studies"), ["sync", "nothing", "--storage", "{s}/studies"]),
])
def test_errors_are_the_clis_one_line_raised(tmp_path, tiny_bert, synthetic_data_dir, call, cli):
    study_file(tmp_path, tiny_bert, synthetic_data_dir)
    with pytest.raises(UserInputError) as raised:
        call(tmp_path)
    assert "\n" not in str(raised.value)
    if cli is not None:
        printed = runner.invoke(app, [arg.format(s=tmp_path) for arg in cli])
        assert printed.exit_code == 2 and printed.stderr == f"error: {raised.value}\n"


def test_a_python_launch_interrupted_by_keyboard_interrupt_resumes_like_the_cli(tmp_path, tiny_bert,
                                                                                 synthetic_data_dir, monkeypatch):
    """A notebook's interrupt while the driver runs its own code (not Tune's loop): the KeyboardInterrupt
    reaches the caller, the runs are closed, the lock is let go, and `orc.resume` runs each trial once."""
    def interrupt(finished: int) -> None:
        if finished == 4:
            raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=3, on_finished=interrupt))
    storage = tmp_path / "studies"
    with pytest.raises(KeyboardInterrupt):
        orc.launch(study_file(tmp_path, tiny_bert, synthetic_data_dir), storage=storage, progress=False)
    stopped = orc.status("api", storage=storage)
    assert not stopped.complete and stopped.counts["completed"] == 4 and not stopped.running_now
    runs = orc.results("api", storage=storage)
    assert sorted(runs.outcome) == ["completed"] * 4 + ["interrupted"] * 2  # 3 at a time: 2 were mid-way
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    statuses = [r.info.status for r in client.search_runs([client.get_experiment_by_name("api").experiment_id])]
    assert "RUNNING" not in statuses

    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2))
    resumed = orc.resume("api", storage=storage, progress=False)
    assert resumed.finished and resumed.counts["completed"] == 9 and resumed.report is not None
    finished = orc.results("api", storage=storage)
    assert len(finished) == 9 and set(finished.outcome) == {"completed"} and finished.run_id.is_unique
    keys = [json.loads(line)["key"] for line in (storage / "api" / "journal.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "finished"]
    assert sorted(keys) == sorted(set(keys))  # no trial finished twice
    epochs = orc.results("api", storage=storage, curves=True).groupby("trial_key").epoch.apply(list)
    assert len(epochs) == 9 and all(run == [1, 2] for run in epochs)  # the interrupted ones went on, not again


@pytest.mark.slow
def test_ctrl_c_during_a_python_launch_raises_study_interrupted_and_resume_finishes(tiny_bert, synthetic_data_dir,
                                                                                     tmp_path):
    """A real Ray launch from a Python script, SIGINT to its process group (what Ctrl-C, or a notebook's
    interrupt, sends): the script gets `StudyInterrupted` once Tune has stopped the trials at their
    checkpoints; `orc.resume` from Python then finishes the study with every trial run once."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from collections import Counter

    from mlflow.tracking import MlflowClient

    study = study_file(tmp_path, tiny_bert, synthetic_data_dir, name="stop", replicate={"seeds": [0, 1]},
                       train={"epochs": 6, "batch_size": 8, "max_seq_length": 32}, resources={"cpu": 1})
    storage = tmp_path / "studies"
    script = tmp_path / "run.py"
    script.write_text("import sys\nimport orchestrator as orc\n"
                      f"try:\n    orc.launch({str(study)!r}, storage={str(storage)!r})\n"
                      "except orc.StudyInterrupted as stopped:\n"
                      "    print(f'stopped with {stopped.result.counts[\"completed\"]} completed', flush=True)\n"
                      "    sys.exit(3)\n")
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 (the child writes it)
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    deadline = time.monotonic() + 300
    while "[1/6]" not in (tmp_path / "run.log").read_text() and time.monotonic() < deadline:
        assert driver.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGINT)
    assert driver.wait(timeout=180) == 3, (tmp_path / "run.log").read_text()[-2000:]
    log.close()
    output = (tmp_path / "run.log").read_text()
    assert "stopped with " in output and "Traceback" not in output
    stopped = orc.status("stop", storage=storage)
    assert not stopped.complete and not stopped.running_now and stopped.counts["completed"] < 6

    result = orc.resume("stop", storage=storage, progress=False)
    assert result.finished and result.counts["completed"] == 6
    runs = orc.results("stop", storage=storage)
    assert len(runs) == 6 and set(runs.outcome) == {"completed"} and runs.run_id.is_unique
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    children = [r for r in client.search_runs([client.get_experiment_by_name("stop").experiment_id])
                if "mlflow.parentRunId" in r.data.tags]
    assert Counter(r.data.tags["orchestrator.trial_key"] for r in children).most_common(1)[0][1] == 1
    assert {r.info.status for r in children} == {"FINISHED"}


@pytest.mark.parametrize(("call", "line"), [
    (lambda orc: orc.status(42), "name: 42 is not valid; give a Study or a study's name"),
    (lambda orc: orc.load_study(None), "path: None is not valid; give a path (str or Path)"),
    (lambda orc: orc.results(["a"]), "name: 'list' is not valid; give a Study or a study's name"),
    (lambda orc: orc.load_study("s.yaml", overrides="train.lr=1"),
     "overrides: 'train.lr=1' is not valid; give a list of strings such as ['train.lr=3e-5']"),
    (lambda orc: orc.report(3), "names: 3 is not valid; give a Study, a study's name or a list of names"),
    (lambda orc: orc.launch(3), "study: 3 is not valid; give a Study from load_study or a study file's path"),
    (lambda orc: orc.probe("m", layers=[1, "2"]), "layers: 'list' is not valid; give a list of integers or None"),
    (lambda orc: orc.status("s", stor="x"),
     "status: 'arguments' is not valid; got an unexpected keyword argument 'stor': see help(orchestrator.status)"),
])
def test_api_arguments_of_the_wrong_type_are_one_user_error(call, line, tmp_path, monkeypatch):
    """A notebook's wrong type is one UserInputError naming the argument, before anything is read or written
    (it was a TypeError or AttributeError from deep inside)."""
    import orchestrator as orc
    from trainables.errors import UserInputError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserInputError) as raised:
        call(orc)
    assert str(raised.value) == line
    assert list(tmp_path.iterdir()) == []


def test_a_report_folder_that_is_a_file_is_one_line(tmp_path):
    import orchestrator as orc
    from trainables.errors import UserInputError

    (tmp_path / "out").write_text("mine")
    with pytest.raises(UserInputError, match=re.escape(f"--out: '{tmp_path / 'out'}' is not valid; it is a file")):
        orc.report("anything", storage=tmp_path, out=tmp_path / "out")
    assert (tmp_path / "out").read_text() == "mine"


@pytest.mark.parametrize("verb", ["plan", "launch", "resume", "status", "results", "report", "verify", "sync"])
def test_every_method_of_a_study_that_is_not_there_is_one_user_error(verb, tmp_path, monkeypatch):
    """A Study opened by a name no study has (a typo in a notebook) answers each verb with one line, and
    writes nothing."""
    monkeypatch.chdir(tmp_path)
    study = orc.Study.named("nope", storage=tmp_path / "studies")
    with pytest.raises(UserInputError) as raised:
        getattr(study, verb)()
    assert "\n" not in str(raised.value) and "nope" in str(raised.value)
    assert list(tmp_path.iterdir()) == []
