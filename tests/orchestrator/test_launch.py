"""End-to-end studies on a local Ray with a tiny random encoder and real STS-B slices."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.run.launcher import launch
from orchestrator.study.journal import Journal
from trainables.errors import UserInputError

pytestmark = pytest.mark.slow


def write_study(folder: Path, model: str, data_dir: Path, **changes) -> Path:
    study = {"name": "e2e", "trainable": "finetune", "task": "stsb", "model": model,
             "ablate": {"layer": [1, 3]},
             "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-3]}}, "trials": 3, "startup_trials": 2},
             "replicate": {"seeds": [0, 1]},
             "train": {"epochs": 3, "batch_size": 16, "max_seq_length": 32},
             "data": {"max_train_samples": 200, "max_eval_samples": 100},
             "data_dir": str(data_dir), "resources": {"cpu": 1},
             "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}
    study.update(changes)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def runs_of(folder: Path, name: str = "e2e"):
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("orchestrator.role") == "study"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def best_dev(run) -> float:
    return run.data.metrics["best_dev_spearman"]


def test_study_runs_ablate_tune_replicate_into_one_mlflow_tree(tiny_bert, data_dir, tmp_path):
    result = launch(write_study(tmp_path, tiny_bert, data_dir), storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["failed"] == 0
    assert result.counts["completed"] + result.counts["pruned"] == 10

    parents, children = runs_of(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 10
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    for child in children:  # pruned trials are visibly pruned in the runs table: status and name
        pruned = child.data.tags["outcome"] == "pruned"
        assert child.info.status == ("KILLED" if pruned else "FINISHED")
        assert child.data.tags["mlflow.runName"].endswith(" · pruned") is pruned
    names = {c.data.tags["mlflow.runName"] for c in children if c.data.tags["phase"] == "replicate"}
    assert names == {"L1 · s0", "L1 · s1", "L3 · s0", "L3 · s1"}
    keys = Counter(c.data.tags["orchestrator.trial_key"] for c in children)
    assert max(keys.values()) == 1
    phases = Counter((c.data.tags["cell"], c.data.tags["phase"]) for c in children)
    assert phases == {("layer=1", "tune"): 3, ("layer=3", "tune"): 3, ("layer=1", "replicate"): 2,
                      ("layer=3", "replicate"): 2}
    for cell in ("layer=1", "layer=3"):
        tuning = [c for c in children if c.data.tags["cell"] == cell and c.data.tags["phase"] == "tune"]
        replicas = [c for c in children if c.data.tags["cell"] == cell and c.data.tags["phase"] == "replicate"]
        assert all("test_spearman" not in c.data.metrics for c in tuning)  # tuning never scores test
        complete = [c for c in tuning if c.data.tags["outcome"] == "completed"]
        pruned = [c for c in tuning if c.data.tags["outcome"] == "pruned"]
        assert all(c.data.tags["epoch"] == "3" for c in complete)
        assert all(int(c.data.tags["epoch"]) < 3 for c in pruned)
        chosen = max(complete, key=best_dev)
        assert {c.data.params["lr"] for c in replicas} == {chosen.data.params["lr"]}
        assert sorted(c.data.tags["seed"] for c in replicas) == ["0", "1"]
        assert all("test_spearman" in c.data.metrics and c.data.params["layer"] == cell[-1] for c in replicas)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(children[0].info.run_id, "dev_spearman")
    assert [m.step for m in history] == list(range(1, len(history) + 1))
    replica = next(c for c in children if c.data.tags["phase"] == "replicate")
    assert [a.path for a in client.list_artifacts(replica.info.run_id)] == ["test_predictions.csv"]
    tuning = next(c for c in children if c.data.tags["phase"] == "tune")
    assert client.list_artifacts(tuning.info.run_id) == []


def test_damaged_weights_are_refused_in_one_line_before_anything_is_written(tiny_bert, data_dir, tmp_path):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_bert, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"model": [tiny_bert, str(broken)], "layer": 2},
                        replicate={"seeds": [0]}, tune=None)
    with pytest.raises(UserInputError) as refused:
        launch(study, storage=tmp_path / "studies", progress=False)
    assert refused.value.key == "model" and refused.value.value == str(broken)
    assert "could not be loaded" in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "studies").exists()


def test_a_failing_trial_is_marked_failed_and_the_study_completes(tiny_bert, data_dir, tmp_path, monkeypatch):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_bert, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"model": [tiny_bert, str(broken)], "layer": 2},
                        max_failures=1, replicate={"seeds": [0]}, tune=None)
    # weights damaged after the plan checked them (a copy overwritten mid-study): the trial is what fails
    monkeypatch.setattr("orchestrator.study.plan.check_cuts", lambda layers: None)
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["failed"] == 1 and result.counts["completed"] == 1
    _, children = runs_of(tmp_path)
    by_model = {c.data.params["model"]: c for c in children}
    assert by_model[str(broken)].info.status == "FAILED"
    assert "Error" in by_model[str(broken)].data.tags["error"]
    assert by_model[tiny_bert].info.status == "FINISHED" and "test_spearman" in by_model[tiny_bert].data.metrics


def test_resume_after_a_driver_sigkill_runs_each_trial_once(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, train={"epochs": 4, "batch_size": 8, "max_seq_length": 32},
                        data={"max_train_samples": 400, "max_eval_samples": 100})
    env = {k: v for k, v in {**os.environ, "HF_HUB_OFFLINE": "1"}.items() if k != "RAY_AUTH_MODE"}
    command = [sys.executable, "-m", "orchestrator.cli"]
    driver = subprocess.Popen([*command, "launch", str(study), "--storage", str(tmp_path / "studies")],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    journal = Journal(tmp_path / "studies" / "e2e" / "journal.jsonl")
    deadline = time.monotonic() + 300
    while sum(e["event"] == "finished" for e in journal.events()) < 3 and time.monotonic() < deadline:
        assert driver.poll() is None, "the study ended before it could be interrupted"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started
    driver.wait()
    before = journal.records()
    finished_before = {k for k, r in before.items() if r.finished}
    assert finished_before and len(finished_before) < 10

    resumed = subprocess.run([*command, "resume", "e2e", "--storage", str(tmp_path / "studies")], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "e2e: finished" in resumed.stdout
    assert "Token authentication" not in resumed.stderr + resumed.stdout  # Ray's banner is not the user's business

    issued = Counter(e["key"] for e in journal.events() if e["event"] == "issued")
    assert all(issued[k] == 1 for k in finished_before)  # no completed trial ran twice
    after = journal.records()
    assert len(after) == 10 and all(r.finished for r in after.values())
    parents, children = runs_of(tmp_path)
    assert len(parents) == 1 and parents[0].data.tags["orchestrator.launches"] == "2"
    keys = Counter(c.data.tags["orchestrator.trial_key"] for c in children)
    assert len(children) == 10 and max(keys.values()) == 1  # no duplicate runs
    assert not [c for c in children if c.info.status == "RUNNING"]
    assert parents[0].info.status == "FINISHED"
    status = subprocess.run([*command, "status", "e2e", "--storage", str(tmp_path / "studies")], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert "layer=1" in status.stdout and "2/2" in status.stdout
    assert json.loads((tmp_path / "studies" / "e2e" / "launch.json").read_text())["base_dir"] == str(tmp_path)


def test_a_gpu_request_the_cluster_cannot_meet_is_refused_before_anything_is_written(tiny_bert, data_dir, tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    study = write_study(tmp_path, tiny_bert, data_dir, resources={"cpu": 1, "gpu": 1})
    result = CliRunner().invoke(app, ["launch", str(study), "--storage", str(tmp_path / "studies")])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: resources.gpu: 1.0 is not valid; the cluster has 0 GPUs; use gpu: 0 or "
                                     "a cluster with GPUs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


def test_a_finished_study_reports_its_tables_from_mlflow(tiny_bert, data_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    study = write_study(tmp_path, tiny_bert, data_dir, tune=None, replicate={"seeds": [0, 1]},
                        report={"baseline": {"layer": "last"}})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["launch", str(study), "--storage", str(tmp_path / "studies")])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "reports" / "e2e"
    assert "report: reports/e2e/report.md" in result.stdout
    report = (folder / "report.md").read_text()
    assert "| Layer 1 | Layer 3 |" in report
    assert "The dev-selected layer k" in report and "score_by_layer.png" in report
    runs = pd.read_csv(folder / "runs.csv")
    assert len(runs) == 4 and set(runs.phase) == {"replicate"}
    stats = pd.read_csv(folder / "stats.csv")
    assert list(stats.cell) == ["layer=1"] and stats.baseline[0] == "layer=3"
    means = runs.groupby("cell").test_spearman.mean()
    # the bootstrap's observed difference comes from the stored per-pair predictions; it must equal
    # the difference of the runs' own test Spearman, so the predictions are those the runs scored
    assert stats.bootstrap_difference[0] == pytest.approx(means["layer=1"] - means["layer=3"], abs=1e-6)


def test_a_dapt_study_pretrains_once_per_stage_config(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, tune=None, replicate={"seeds": [0]},
                        ablate={"pretrain_steps": [0, 5], "layer": [1, 2]},
                        train={"epochs": 1, "batch_size": 16, "max_seq_length": 32, "pretrain": "mlm",
                               "pretrain_corpus": "task", "pretrain_batch_size": 8, "pretrain_max_seq_length": 32},
                        report={"rows": ["pretrain_steps"], "columns": "layer"})
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["completed"] == 4
    stages = sorted(p.name for p in (tmp_path / "studies" / "e2e" / "stages").iterdir() if p.is_dir())
    assert len(stages) == 1 and stages[0].startswith("dapt-")  # two trials, one pretraining
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    stage_runs = client.search_runs([experiment.experiment_id], filter_string="tags.`orchestrator.role` = 'stage'")
    assert len(stage_runs) == 1 and len(client.get_metric_history(stage_runs[0].info.run_id, "dapt_loss")) == 5
    _, children = runs_of(tmp_path)
    trials = [c for c in children if c.data.tags.get("phase") == "replicate"]
    adapted = [c for c in trials if c.data.params["pretrain_steps"] == "5"]
    assert len(adapted) == 2 and {c.data.tags["stage.run_id"] for c in adapted} == {stage_runs[0].info.run_id}
    assert sorted(c.data.metrics["dapt_cache_hit"] for c in adapted) == [0.0, 1.0]
    plain = [c for c in trials if c.data.params["pretrain_steps"] == "0"]
    assert len(plain) == 2 and all("stage.run_id" not in c.data.tags for c in plain)
    from reports.build import build_report
    from reports.collect import collect

    runs = collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "e2e")
    assert len(runs.runs) == 4 and set(runs.runs.phase) == {"replicate"}  # the stage run is not a trial
    build_report(runs, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| DAPT steps | Layer 1 | Layer 2 |" in report  # axis values stay integers


def test_a_contrastive_study_lands_in_mlflow_and_the_suite_table(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, trainable="contrastive", ablate={"method": ["simcse", "micse"]},
                        tune={"params": {"lr": {"loguniform": [1e-4, 1e-3]}}, "trials": 2, "startup_trials": 2},
                        replicate={"seeds": [0]},
                        train={"corpus": "task", "layer": 2, "pooling": "mean", "steps": 6, "eval_every": 3,
                               "batch_size": 16, "max_seq_length": 32, "suite": True},
                        data={"max_train_samples": 200, "max_eval_samples": 40},
                        report={"columns": "method"})
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["failed"] == 0
    from reports.build import build_report
    from reports.collect import collect

    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "e2e"), tmp_path / "report")
    _, children = runs_of(tmp_path)
    assert len(children) == 6
    replicas = [c for c in children if c.data.tags["phase"] == "replicate"]
    assert sorted(c.data.params["method"] for c in replicas) == ["micse", "simcse"]
    assert all("test_sts12_spearman" in c.data.metrics and "test_suite_avg_spearman" in c.data.metrics
               for c in replicas)
    assert not any("test_spearman" in c.data.metrics for c in children if c.data.tags["phase"] == "tune")
    micse = next(c for c in replicas if c.data.params["method"] == "micse")
    assert micse.data.metrics["attention_loss"] < 0  # minus the views' mutual information (the reference)
    report = (tmp_path / "report" / "report.md").read_text()
    # test was capped at 40 pairs a set: the caption says so, not "test Spearman"
    assert "STS suite: Spearman ×100 of cosine on at most 40 pairs of each set (capped" in report
    assert "| STS12 | STS13 |" in report
    runs = pd.read_csv(tmp_path / "report" / "runs.csv")
    avg = runs[runs.phase == "replicate"].set_index("method")["test_suite_avg_spearman"]
    table = next(line for line in report.splitlines() if line.startswith("| miCSE |"))
    assert f"{avg['micse']:.2f}" in table.split("|")[-2]  # the Avg. column is the run's own average


def test_a_distill_study_reaches_every_mode_from_the_study_file(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, trainable="distill",
                        ablate={"mode": ["self", "mutual", "teacher"]}, tune=None, replicate={"seeds": [0]},
                        train={"layer": 2, "partner_layer": 1, "cycles": 2, "bi_epochs": 1, "bi_batch_size": 32,
                               "cross_epochs": 1, "cross_batch_size": 16, "bi_max_seq_length": 24,
                               "cross_max_seq_length": 48},
                        data={"max_train_samples": 64, "max_eval_samples": 40}, report={"columns": "mode"})
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["completed"] == 3 and result.counts["pruned"] == 0
    from reports.build import build_report
    from reports.collect import collect

    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "e2e"), tmp_path / "report")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _, children = runs_of(tmp_path)
    stages = [c for c in children if c.data.tags.get("orchestrator.role") == "stage"]
    by_mode = {c.data.params["mode"]: c for c in children if c not in stages}
    assert set(by_mode) == {"self", "mutual", "teacher"}
    # the teacher is a stage like DAPT: its own run, linked from the trial that used it
    assert [s.data.tags["stage.kind"] for s in stages] == ["teacher"] and "teacher_loss" in stages[0].data.metrics
    assert by_mode["teacher"].data.tags["stage.teacher.run_id"] == stages[0].info.run_id
    assert "partner_cross_test_spearman" in by_mode["mutual"].data.metrics
    assert len(client.get_metric_history(by_mode["self"].info.run_id, "cross_dev_spearman")) == 2  # per cycle
    assert len(client.get_metric_history(by_mode["teacher"].info.run_id, "dev_spearman")) == 1
    artifacts = {a.path for a in client.list_artifacts(by_mode["self"].info.run_id)}
    assert {"pseudo_labels.csv", "test_predictions.csv"} <= artifacts
    report = (tmp_path / "report" / "report.md").read_text()
    assert "after each distillation cycle" in report and "| self · cross · dev |" in report
    assert "· test |" not in report  # per-cycle test is an opt-in diagnostic; test is scored once per run


def test_a_diverging_cell_ends_as_diverged_and_the_report_says_so(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"lr": [1e-3, 1e12], "layer": 2}, tune=None,
                        replicate={"seeds": [0]}, train={"epochs": 2, "batch_size": 16, "max_seq_length": 32,
                                                         "max_grad_norm": None},
                        report={"rows": ["layer"], "columns": "lr"})
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["diverged"] == 1 and result.counts["completed"] == 1
    _, children = runs_of(tmp_path)
    diverged = next(c for c in children if c.data.params["lr"] == "1000000000000.0")
    assert diverged.info.status == "FAILED" and diverged.data.tags["outcome"] == "diverged"
    assert "loss became" in diverged.data.tags["error"] and "lower the learning rate" in diverged.data.tags["error"]
    from reports.build import build_report
    from reports.collect import collect

    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "e2e"), tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "diverged (loss became NaN)" in report


def test_resume_after_an_edit_runs_only_the_new_work_and_refuses_what_would_invalidate_it(tiny_bert, data_dir,
                                                                                          tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    common = {"tune": None, "train": {"epochs": 2, "batch_size": 16, "max_seq_length": 32},
              "data": {"max_train_samples": 64, "max_eval_samples": 40}}
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"layer": [1, 3]}, replicate={"seeds": [0]}, **common)
    storage = tmp_path / "studies"
    assert launch(study, storage=storage, progress=False).counts["completed"] == 2
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _, before = runs_of(tmp_path)
    layer_of = {c.info.run_id: c.data.params["layer"] for c in before}
    assert not list((storage / "e2e").rglob("checkpoint_0*"))  # finished trials keep no checkpoint

    write_study(tmp_path, tiny_bert, data_dir, ablate={"layer": [1, 2, 3]}, replicate={"seeds": [0, 1]}, **common)
    result = launch(study, storage=storage, resume=True, progress=False)
    assert result.finished and result.counts["completed"] == 6  # 2 old + 4 new: one new layer, one new seed
    parents, after = runs_of(tmp_path)
    assert len(parents) == 1 and len(after) == 6
    for run in after:
        if run.info.run_id in layer_of:  # the first launch's runs: untouched, still their own cells
            assert run.data.params["layer"] == layer_of[run.info.run_id]
            assert len(client.get_metric_history(run.info.run_id, "dev_spearman")) == 2
    cells = sorted((c.data.tags["cell"], c.data.tags["seed"]) for c in after)
    assert cells == [(f"layer={k}", s) for k in (1, 2, 3) for s in ("0", "1")]

    write_study(tmp_path, tiny_bert, data_dir, ablate={"layer": [1, 2, 3]}, replicate={"seeds": [0, 1]},
                **{**common, "train": {**common["train"], "epochs": 3}})
    refused = CliRunner().invoke(app, ["launch", str(study), "--storage", str(storage), "--resume"])
    assert refused.exit_code == 2
    assert refused.stderr.strip() == ("error: train.epochs: 3 is not valid; the study was launched with 2; that "
                                      "change would invalidate its finished work: restore it, or launch under a new "
                                      "name")
    assert len(runs_of(tmp_path)[1]) == 6

    write_study(tmp_path, tiny_bert, data_dir, ablate={"layer": [1, 2, 3]}, replicate={"seeds": [0, 1]}, **common)
    again = CliRunner().invoke(app, ["launch", str(study), "--storage", str(storage), "--resume"])
    assert again.exit_code == 0 and "nothing left to run" in again.stderr and "Traceback" not in again.output
    assert sorted(p.name for p in (storage / "e2e" / "ray").iterdir()) == ["launch-1", "launch-2"]  # no Tuner
    assert len(runs_of(tmp_path)[1]) == 6


def test_save_best_per_cell_keeps_one_loadable_model_per_cell(tiny_bert, data_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    study = write_study(tmp_path, tiny_bert, data_dir, tune=None, ablate={"layer": [1, 2]}, replicate={"seeds": [0, 1]},
                        train={"epochs": 1, "batch_size": 16, "max_seq_length": 32},
                        data={"max_train_samples": 64, "max_eval_samples": 40}, save="best_per_cell")
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["completed"] == 4
    _, children = runs_of(tmp_path)
    kept = [c for c in children if "orchestrator.model_path" in c.data.tags]
    assert sorted(c.data.tags["cell"] for c in kept) == ["layer=1", "layer=2"]
    for run in kept:  # the best dev replicate of its cell, never chosen on test
        cell = [c for c in children if c.data.tags["cell"] == run.data.tags["cell"]]
        assert run.data.metrics["best_dev_spearman"] == max(c.data.metrics["best_dev_spearman"] for c in cell)
        path = Path(run.data.tags["orchestrator.model_path"])
        assert path.is_dir() and len(list(path.parent.iterdir())) == 1  # the other seed's model was dropped
        model = SentenceTransformer(str(path), device="cpu")
        assert model.encode(["a man plays a guitar"]).shape == (1, 32)
        card = (path / "README.md").read_text()  # sentence-transformers' card, with how the model was trained
        assert "## Training (ablation-orchestrator)" in card and "library_name: sentence-transformers" in card
        assert f"what selection read):** {run.data.metrics['best_dev_spearman']:.4f}" in card
        assert f"never selected on):** {run.data.metrics['test_spearman']:.4f}" in card
        client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
        assert "model/modules.json" in {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    from reports.build import build_report
    from reports.collect import collect

    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "e2e"), tmp_path / "report")
    cells = pd.read_csv(tmp_path / "report" / "cells.csv")
    assert sorted(cells.models) == sorted(c.data.tags["orchestrator.model_path"] for c in kept)


def test_an_adaptive_seed_study_runs_end_to_end_and_its_report_says_how_many_seeds_each_cell_got(tiny_bert, data_dir,
                                                                                                   tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, tune=None, ablate={"layer": [1, 2]},
                        replicate={"seeds": 2, "max_seeds": 3, "until": {"dev_ci95": 0.001}},
                        train={"epochs": 1, "batch_size": 16, "max_seq_length": 32, "lr": 1e-3},
                        data={"max_train_samples": 64, "max_eval_samples": 40})
    result = launch(study, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["completed"] == 6  # no cell's dev mean gets that precise: 3 seeds each
    from reports.build import build_report
    from reports.collect import collect

    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "e2e"), tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "mean ± std over 3 seeds" in report
    assert "seeds: adaptive, per cell, for a 95 % CI of the mean dev score of ±0.001 points, " \
        "at most 3 seeds" in report and "two-stage rule" in report
    cells = pd.read_csv(tmp_path / "report" / "cells.csv")
    assert list(cells.n) == [3, 3] and (cells.dev_ci95 > 0.001).all()


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("case", ["tuned_distill", "degenerate_cell"])
def test_studies_that_used_to_crash_the_report_launch_report_and_verify(case, tiny_bert, data_dir, tmp_path):
    """A tuned distill study tunes bi_lr (no lr); a layer-0 CLS cell has constant embeddings, so every
    tuning trial is degenerate. Both ended `launch` in a traceback; both must end with exit 0."""
    if case == "tuned_distill":
        study = write_study(tmp_path, tiny_bert, data_dir, trainable="distill", ablate={"mode": ["self"]},
                            tune={"params": {"bi_lr": {"loguniform": [1e-5, 1e-4]}}, "trials": 2,
                                  "startup_trials": 1},
                            replicate={"seeds": [0]},
                            train={"layer": 2, "cycles": 1, "bi_epochs": 1, "bi_batch_size": 16, "cross_epochs": 1,
                                   "cross_batch_size": 16, "bi_max_seq_length": 16, "cross_max_seq_length": 32},
                            data={"max_train_samples": 48, "max_eval_samples": 40}, report={"columns": "mode"})
    else:
        # layer 0 CLS: one vector for every sentence; layer 0 mean pooling scores (a random tiny BERT's CLS is
        # collapsed at every layer, so mean pooling is the cell that is not degenerate)
        study = write_study(tmp_path, tiny_bert, data_dir, ablate={"layer": [0], "pooling": ["cls", "mean"]},
                            tune={"params": {"lr": {"loguniform": [1e-5, 1e-4]}}, "trials": 2, "startup_trials": 1},
                            replicate={"seeds": [0]}, train={"epochs": 1, "batch_size": 16, "max_seq_length": 16},
                            data={"max_train_samples": 48, "max_eval_samples": 40})
    storage = str(tmp_path / "studies")
    launched = run_cli("launch", str(study), "--storage", storage, cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "Traceback" not in launched.stdout + launched.stderr
    report = (tmp_path / "reports" / "e2e" / "report.md").read_text()
    status = run_cli("status", "e2e", "--storage", storage, cwd=tmp_path)
    assert status.returncode == 0
    if case == "tuned_distill":
        tuning = next(line for line in report.splitlines() if line.startswith("| self | 2"))
        assert "| Bi-encoder LR |" in report and "e-05" in tuning  # the tuned key the plan names, with its value
    else:
        assert "finished: 5 completed" in launched.stdout and "(1 replicate skipped" in launched.stdout
        assert "skipped: every tuning trial degenerate" in report
        assert "skipped: every tuning trial degenerate" in status.stdout
    verified = run_cli("verify", str(tmp_path / "reports" / "e2e"), cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stderr


def test_ctrl_c_stops_honestly_and_resume_finishes_the_study(tiny_bert, data_dir, tmp_path):
    """SIGINT to the launch's process group (what Ctrl-C in a terminal sends, Ray's workers included):
    exit 130, one line naming `orchestrator resume e2e`, none of Tune's Tuner.restore advice; with
    output going to a file, a line per finished trial while it runs; resume finishes with no duplicate
    and no RUNNING run."""
    study = write_study(tmp_path, tiny_bert, data_dir, tune=None, replicate={"seeds": [0, 1, 2]},
                        train={"epochs": 4, "batch_size": 8, "max_seq_length": 32},
                        data={"max_train_samples": 400, "max_eval_samples": 100})
    env = {k: v for k, v in {**os.environ, "HF_HUB_OFFLINE": "1"}.items() if k != "RAY_AUTH_MODE"}
    log = open(tmp_path / "launch.log", "w")  # noqa: SIM115 (the child writes it)
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "launch", str(study), "--storage",
                               str(tmp_path / "studies")], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    deadline = time.monotonic() + 300
    while "[2/6]" not in (tmp_path / "launch.log").read_text() and time.monotonic() < deadline:
        assert driver.poll() is None, (tmp_path / "launch.log").read_text()[-2000:]
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGINT)
    assert driver.wait(timeout=180) == 130
    log.close()
    output = (tmp_path / "launch.log").read_text()
    assert "interrupted: orchestrator resume e2e" in output and "Tuner.restore" not in output
    assert "e2e: launching 6 planned trials" in output
    lines = [line for line in output.splitlines() if line.startswith("[")]
    assert lines[0].startswith("[1/6] layer=") and " completed dev_spearman " in lines[0]
    assert "elapsed · ETA" in lines[0]
    assert not (tmp_path / "reports" / "e2e").exists()  # no partial report
    parents, children = runs_of(tmp_path)
    assert parents[0].info.status == "KILLED" and "RUNNING" not in {c.info.status for c in children}
    assert "KILLED" in {c.info.status for c in children}  # the trials the stop hit, continued by resume

    resumed = run_cli("resume", "e2e", "--storage", str(tmp_path / "studies"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "e2e: finished: 6 completed" in resumed.stdout
    assert "e2e: resuming 6 planned trials (2 cells;" in resumed.stderr
    parents, children = runs_of(tmp_path)
    keys = Counter(c.data.tags["orchestrator.trial_key"] for c in children)
    assert len(children) == 6 and max(keys.values()) == 1
    assert not [c for c in children if c.info.status == "RUNNING"]
    assert all(c.data.tags["outcome"] == "completed" for c in children)  # nothing the stop hit counts as failed


def test_a_second_launch_of_a_running_study_is_refused_in_one_line(tiny_bert, data_dir, tmp_path):
    """Two terminals, one study: the second launch (or resume, or sync) is refused while the first
    holds the folder; it used to run every trial twice into one journal."""
    study = write_study(tmp_path, tiny_bert, data_dir, tune=None, replicate={"seeds": [0, 1]},
                        train={"epochs": 50, "batch_size": 8, "max_seq_length": 32},  # outlasts the checks
                        data={"max_train_samples": 2000, "max_eval_samples": 100})
    env = {k: v for k, v in {**os.environ, "HF_HUB_OFFLINE": "1"}.items() if k != "RAY_AUTH_MODE"}
    storage = str(tmp_path / "studies")
    first = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "launch", str(study), "--storage", storage],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    journal = tmp_path / "studies" / "e2e" / "journal.jsonl"
    deadline = time.monotonic() + 300
    while not (journal.exists() and '"issued"' in journal.read_text()) and time.monotonic() < deadline:
        assert first.poll() is None
        time.sleep(0.2)
    for args in (["launch", str(study), "--storage", storage, "--resume"], ["resume", "e2e", "--storage", storage],
                 ["sync", "e2e", "--storage", storage]):
        second = run_cli(*args, cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        assert second.stderr.startswith("error: NAME: 'e2e' is not valid; pid ") and second.stderr.count("\n") == 1
        assert "is running this study now" in second.stderr
    assert first.poll() is None  # still running: every refusal above met a live holder
    os.killpg(first.pid, signal.SIGINT)
    assert first.wait(timeout=180) == 130
    issued = Counter(json.loads(line)["key"] for line in journal.read_text().splitlines()
                     if json.loads(line)["event"] == "issued")
    assert issued and max(issued.values()) == 1  # no trial issued twice


def test_a_trials_worker_waits_for_the_last_trials_thread_before_it_is_handed_on():
    """Tune hands a finished trial's worker to the next trial only if the last trial's training thread ends
    within TUNE_FUNCTION_THREAD_TIMEOUT_S (its default 2 s): on a loaded CI machine a pruned trial took longer
    to wind down, the next trial failed ("Trainable runner reuse requires reset_config()") and the study hung.
    The workers a launch starts read the longer wait."""
    script = ("import os, ray\nfrom orchestrator.run.ray_session import connect_ray\nconnect_ray(None)\n"
              "print(ray.get(ray.remote(lambda: os.environ.get('TUNE_FUNCTION_THREAD_TIMEOUT_S')).remote()))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TUNE_FUNCTION_THREAD_TIMEOUT_S")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "300"
