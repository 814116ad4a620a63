"""A study whose replicates train as fused arrays (`resources.fuse: 4`) launches on a local Ray and gives the
report a study with `fuse: off` gives (dev and test Spearman to 0.05 per trial: the same trainings to fp32
rounding), each member its own trial in the journal, MLflow and the report; killed mid-array, it resumes each
member from its own checkpoint and loses nothing (issue 56).

STS-B (real sentences, so no two predictions tie) on a tiny random BERT with dropout, batches of 8 pairs: one
chunk on a CPU, as every batch on a GPU, so that a member draws the dropout masks its trial alone draws; fp32,
whatever the CPU offers (bf16 would round the stacked and the single matmuls differently)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import yaml

import orchestrator as orc
from orchestrator.study.folder import JOURNAL, RECORD

pytestmark = pytest.mark.slow
SEEDS = [0, 1, 2, 3]


def study_file(folder, tiny_bert, data_dir, name: str, fuse, epochs: int = 2):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": tiny_bert, "replicate": {"seeds": SEEDS}, "data_dir": str(data_dir),
        "ablate": {"layer": [2]}, "train": {"epochs": epochs, "batch_size": 8, "max_seq_length": 32, "lr": 1e-3,
                  "precision": "fp32"},
        "data": {"max_train_samples": 96, "max_eval_samples": 80}, "resources": {"cpu": 1, "fuse": fuse},
        "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}))
    return path


def cli(folder, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=folder, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def by_seed(name: str, storage) -> dict:
    runs = orc.results(name, storage=storage)
    assert len(runs) == len(SEEDS) and set(runs.outcome) == {"completed"}, runs
    return runs.set_index("seed")


def test_a_study_of_fused_replicates_reports_what_the_study_without_fusion_reports(tiny_bert, data_dir, tmp_path):
    storage = tmp_path / "studies"
    fused = orc.launch(study_file(tmp_path, tiny_bert, data_dir, "fused", 4), storage=storage, progress=False)
    alone = orc.launch(study_file(tmp_path, tiny_bert, data_dir, "alone", "off"), storage=storage, progress=False)
    assert fused.finished and alone.finished
    together, apart = by_seed("fused", storage), by_seed("alone", storage)
    for column in ("best_dev_spearman", "test_spearman"):
        assert (together[column] - apart[column]).abs().max() < 0.05, (together[column], apart[column])
    assert together.test_spearman.nunique() == len(SEEDS)  # four trainings, not one copied
    curves = orc.results("fused", storage=storage, curves=True)
    assert curves.groupby("trial_key").epoch.apply(list).tolist() == [[1, 2]] * len(SEEDS)
    record = json.loads((storage / "fused" / RECORD).read_text())
    assert record["fusion"] == [{"members": 4, "why": "resources.fuse: 4", "tuning": False}]
    issued = [json.loads(line) for line in (storage / "fused" / JOURNAL).read_text().splitlines()]
    assert sorted(e["key"] for e in issued if e["event"] == "finished") == [f"c0-s{s}" for s in SEEDS]
    assert {e["metrics"]["fused_members"] for e in issued if e["event"] == "result"} == {4}

    for name in ("fused", "alone"):
        orc.report(name, storage=storage, out=tmp_path / "reports" / name)
    texts = {name: (tmp_path / "reports" / name / "report.md").read_text() for name in ("fused", "alone")}
    assert "fused arrays of up to 4 members (resources.fuse: 4)" in texts["fused"]
    assert "fused arrays" not in texts["alone"]
    verified = cli(tmp_path, "verify", str(tmp_path / "reports" / "fused"))
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr
    # a fused member rerun alone gives its numbers back (to the fused tolerance, said with the reason)
    again = cli(tmp_path, "reproduce", str(tmp_path / "reports" / "fused"), "--cell", "layer=2", "--seed", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "fused: this cell's replicates trained in arrays of up to 4" in again.stdout
    assert "match: every score within 0.05" in again.stdout, again.stdout


def test_a_fused_array_stopped_mid_study_resumes_every_member_from_its_checkpoint(tiny_bert, data_dir, tmp_path):
    """Ctrl-C once every member has its first checkpoint (of 4 epochs); `resume` finishes each member from it:
    no epoch trained or logged twice, one MLflow run per member."""
    from mlflow.tracking import MlflowClient

    study = study_file(tmp_path, tiny_bert, data_dir, "stop", 4, epochs=4)
    storage = tmp_path / "studies"
    script = tmp_path / "run.py"
    script.write_text("import sys\nimport orchestrator as orc\n"
                      f"try:\n    orc.launch({str(study)!r}, storage={str(storage)!r})\n"
                      "except orc.StudyInterrupted:\n    sys.exit(3)\n")
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 (the child writes it)
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    journal = storage / "stop" / JOURNAL
    deadline = time.monotonic() + 300

    def checkpoints() -> int:
        lines = journal.read_text().splitlines() if journal.exists() else []
        return sum(json.loads(line)["event"] == "checkpoint" for line in lines)

    while checkpoints() < len(SEEDS) and time.monotonic() < deadline:
        assert driver.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGINT)
    assert driver.wait(timeout=180) == 3, (tmp_path / "run.log").read_text()[-2000:]
    log.close()
    stopped = orc.status("stop", storage=storage)
    assert not stopped.complete and stopped.counts["completed"] == 0

    result = orc.resume("stop", storage=storage, progress=False)
    assert result.finished and result.counts["completed"] == len(SEEDS)
    curves = orc.results("stop", storage=storage, curves=True)
    assert curves.groupby("trial_key").epoch.apply(list).tolist() == [[1, 2, 3, 4]] * len(SEEDS)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    children = [r for r in client.search_runs([client.get_experiment_by_name("stop").experiment_id])
                if "mlflow.parentRunId" in r.data.tags]
    assert Counter(r.data.tags["orchestrator.trial_key"] for r in children) == {f"c0-s{s}": 1 for s in SEEDS}
    assert {r.info.status for r in children} == {"FINISHED"}
    history = client.get_metric_history(children[0].info.run_id, "dev_spearman")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # no epoch logged twice


def test_fused_tuning_members_are_pruned_out_of_their_array_on_a_local_ray(tiny_bert, data_dir, tmp_path):
    """Tuning arrays on Ray: the cell's pruner stops members after a round, the Ray actor that carries its word
    tells the array before the next one, and the member trains no further round (its journal ends at the epoch
    it was pruned at) while the others go on to the end and the replicates of the winner run."""
    from mlflow.tracking import MlflowClient

    path = study_file(tmp_path, tiny_bert, data_dir, "tuned", 4, epochs=3)
    raw = yaml.safe_load(path.read_text())
    raw.update(tune={"params": {"lr": {"loguniform": [1e-5, 3e-3]}}, "trials": 4, "startup_trials": 4,
                     "grace_epochs": 1, "reduction_factor": 2}, replicate={"seeds": [0, 1]})
    del raw["train"]["lr"]
    path.write_text(yaml.safe_dump(raw))
    storage = tmp_path / "studies"
    result = orc.launch(path, storage=storage, progress=False)
    assert result.finished and result.counts["pruned"] >= 1, result.counts
    events = [json.loads(line) for line in (storage / "tuned" / JOURNAL).read_text().splitlines()]
    epochs: dict[str, list[int]] = {}
    for event in events:
        if event["event"] == "result":
            epochs.setdefault(event["key"], []).append(event["metrics"]["epoch"])
    outcomes = {e["key"]: e["outcome"] for e in events if e["event"] == "finished"}
    for key in (f"c0-t{n}" for n in range(4)):
        assert epochs[key] == list(range(1, len(epochs[key]) + 1)), (key, epochs[key])
        assert (len(epochs[key]) < 3) == (outcomes[key] == "pruned"), (key, epochs[key], outcomes[key])
    tuning = {key: found for key, found in epochs.items() if "-t" in key}
    for event in (e for e in events if e["event"] == "result" and e["key"] in tuning):  # the array shrinks
        epoch = event["metrics"]["epoch"]
        assert event["metrics"]["fused_members"] == sum(len(found) >= epoch for found in tuning.values())
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {r.data.tags["orchestrator.trial_key"]: r for r in
            client.search_runs([client.get_experiment_by_name("tuned").experiment_id])
            if "mlflow.parentRunId" in r.data.tags}
    assert sorted(runs) == ["c0-s0", "c0-s1", "c0-t0", "c0-t1", "c0-t2", "c0-t3"]
    killed = {key for key, run in runs.items() if run.info.status == "KILLED"}
    assert killed == {key for key, outcome in outcomes.items() if outcome == "pruned"}
