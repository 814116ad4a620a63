"""The cluster path for real on one machine: a two-node Ray cluster (separate `ray start`
processes on loopback addresses, token authentication on), an MLflow tracking server, and
faults injected while a study runs. Each test launches through the CLI, as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.study.journal import Journal
from tests.services import MlflowServer, free_port

pytestmark = pytest.mark.slow

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"  # loopback addresses: Ray resolves 127.0.0.1 to the host's IP
BIN = Path(sys.executable).parent


def matching(pattern: str) -> list[int]:
    """Processes whose command line matches `pattern` (pgrep -f)."""
    return [int(p) for p in subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
            if int(p) != os.getpid()]


def process_tree(pattern: str) -> list[int]:
    """The processes matching `pattern` and all their descendants."""
    tree, frontier = set(matching(pattern)), list(matching(pattern))
    while frontier:
        children = subprocess.run(["pgrep", "-P", str(frontier.pop())], capture_output=True, text=True).stdout
        new = [int(c) for c in children.split() if int(c) not in tree]
        frontier += new
        tree.update(new)
    return sorted(tree)


def kill_pids(pids, sig: int = signal.SIGKILL) -> int:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return len(list(pids))


def kill_matching(pattern: str, sig: int = signal.SIGKILL) -> int:
    """Signal every process whose command line contains `pattern`; how many there were."""
    return kill_pids(matching(pattern), sig)


class RayCluster:
    """A head node and a worker node, each its own `ray start`, sharing one token file."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        token = folder / "ray_token"
        token.write_text(secrets.token_hex(32))
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "HF_HUB_OFFLINE": "1", "RAY_health_check_period_ms": "1000",
                    "RAY_health_check_failure_threshold": "3"}
        # every process of this cluster carries this path, so teardown kills by it; short, because Ray's
        # socket paths under it must stay within 107 bytes
        self.temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))

    def ray(self, *args: str) -> None:
        subprocess.run([str(BIN / "ray"), *args], env=self.env, check=True, capture_output=True, timeout=180)

    def start(self) -> RayCluster:
        self.ray("start", "--head", f"--node-ip-address={HEAD_IP}", f"--port={self.port}", "--num-cpus=1",
                 "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.temp}")
        self.add_worker()
        return self

    def add_worker(self) -> None:
        self.ray("start", f"--address={self.address}", f"--node-ip-address={WORKER_IP}", "--num-cpus=1",
                 "--disable-usage-stats")

    def kill_worker_node(self) -> int:
        """SIGKILL every process of the worker node: those naming its address and all their
        descendants (worker processes rename themselves `ray::...`, so only the tree finds them)."""
        return kill_pids(process_tree(f"node.ip.address={WORKER_IP}"))

    def kill_trial_processes(self) -> int:
        """SIGKILL this cluster's trial processes (and no other Ray's on the machine)."""
        trials = set(process_tree(str(self.temp))) & set(matching("ray::ImplicitFunc"))
        return kill_pids(trials)

    def stop(self) -> None:
        kill_matching(str(self.temp))
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture()
def cluster(tmp_path):
    cluster = RayCluster(tmp_path).start()
    yield cluster
    cluster.stop()


@pytest.fixture()
def server(tmp_path):
    server = MlflowServer(tmp_path).start()
    yield server
    server.stop()


def write_study(folder: Path, model: str, data_dir: Path, uri: str, **changes) -> Path:
    study = {"name": "cluster", "trainable": "finetune", "task": "stsb", "model": model,
             "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
             "train": {"epochs": 3, "batch_size": 8, "max_seq_length": 32},
             "data": {"max_train_samples": 400, "max_eval_samples": 80}, "data_dir": str(data_dir),
             "resources": {"cpu": 1}, "max_concurrent": 2,  # one CPU per node: two trials run on two nodes
             "max_failures": 2, "tracking": {"mlflow_uri": uri},
             "report": {"baseline": {"layer": 2}}}
    study.update(changes)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def orchestrator(*args: str, env: dict, cwd: Path, timeout: int = 900, background: bool = False):
    command = [sys.executable, "-m", "orchestrator.cli", *args]
    if background:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def child_runs(uri: str, name: str = "cluster"):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return client, [r for r in runs if "mlflow.parentRunId" in r.data.tags], \
        [r for r in runs if r.data.tags.get("orchestrator.role") == "study"]


def wait_for(journal: Journal, predicate, process, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(journal.events()):
            return
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.2)
    raise AssertionError("the study did not get there in time")


def early_in_training(events: list[dict], most: int = 2) -> set[str]:
    """Unfinished trials that saved at least one and at most `most` checkpoints: killing them now
    interrupts them mid-trial, not as they finish."""
    done = {e["key"] for e in events if e["event"] == "finished"}
    saved = Counter(e["key"] for e in events if e["event"] == "checkpoint")
    return {key for key, count in saved.items() if count <= most and key not in done}


def shape(report: str) -> str:
    """A report with every number blanked: what must not depend on where the study ran."""
    return re.sub(r"\d+(\.\d+)?", "#", report)


def test_a_study_on_two_nodes_tracked_by_a_server_reports_like_a_local_one(cluster, server, tiny_bert, data_dir,
                                                                            tmp_path):
    doctor = orchestrator("doctor", "--address", cluster.address, "--storage", str(tmp_path / "shared"),
                          "--tracking-uri", server.uri, env=cluster.env, cwd=tmp_path, timeout=300)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr[-2000:]
    assert "ok    ray cluster: 2 node(s) alive, 2 CPUs" in doctor.stdout
    assert "written by every node and read back by the driver" in doctor.stdout
    # the artifact store through the server, from a task pinned to each of the two nodes
    assert "ok    tracking artifacts: the artifact store (mlflow-artifacts:/1) " \
        "written by every node (2) and read back" in doctor.stdout.splitlines()

    study = write_study(tmp_path, tiny_bert, data_dir, server.uri)
    result = orchestrator("launch", str(study), "--address", cluster.address, "--storage", str(tmp_path / "shared"),
                          env=cluster.env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    client, children, parents = child_runs(server.uri)
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["ray.node_ip"] for c in children} == {HEAD_IP, WORKER_IP}  # trials ran on both nodes
    for run in children:  # per-pair predictions arrive through the server's artifact proxy
        path = client.download_artifacts(run.info.run_id, "test_predictions.csv", str(tmp_path / run.info.run_id))
        assert len(pd.read_csv(path)) == 80
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {"study.yaml", "study_record.json"}
    events = [json.loads(line) for line in (tmp_path / "shared" / "cluster" / "journal.jsonl").read_text().splitlines()]
    written = {e["path"] for e in events if e["event"] == "checkpoint"}
    removed = {e["path"] for e in events if e["event"] == "checkpoint_removed"}
    shared = str(tmp_path / "shared" / "cluster" / "ray")
    assert len(removed) == 4 and removed <= written and all(p.startswith(shared) for p in written)
    assert not list(Path(shared).rglob("trainer_state.json"))  # the shared storage keeps no finished checkpoint

    local_dir = tmp_path / "local"
    local_dir.mkdir()
    local = write_study(local_dir, tiny_bert, data_dir, "sqlite:///mlflow.db")
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    result = orchestrator("launch", str(local), "--storage", str(local_dir / "studies"), env=env, cwd=local_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    remote_report = orchestrator("report", "cluster", "--tracking-uri", server.uri, "--out", str(tmp_path / "r"),
                                 env=cluster.env, cwd=tmp_path)
    assert remote_report.returncode == 0, remote_report.stderr[-2000:]
    local_report = (local_dir / "reports" / "cluster" / "report.md").read_text()
    assert shape((tmp_path / "r" / "report.md").read_text()) == shape(local_report)


def test_a_killed_trial_worker_resumes_from_its_checkpoint(cluster, tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, "sqlite:///mlflow.db",
                        train={"epochs": 4, "batch_size": 8, "max_seq_length": 32},
                        data={"max_train_samples": 400, "max_eval_samples": 80})
    driver = orchestrator("launch", str(study), "--address", cluster.address, "--storage", str(tmp_path / "shared"),
                          env=cluster.env, cwd=tmp_path, background=True)
    journal = Journal(tmp_path / "shared" / "cluster" / "journal.jsonl")
    wait_for(journal, lambda events: any(e["event"] == "checkpoint" for e in events), driver)
    victim = next(e for e in journal.events() if e["event"] == "result")["key"]
    killed_at, killed = time.monotonic(), cluster.kill_trial_processes()
    assert killed >= 1  # SIGKILL the trial processes mid-epoch
    checkpoints = len([e for e in journal.events() if e["event"] == "checkpoint"])
    wait_for(journal, lambda events: len([e for e in events if e["event"] == "checkpoint"]) > checkpoints, driver)
    print(f"killed {killed} trial process(es); training checkpointed again after {time.monotonic() - killed_at:.0f} s")
    out, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-3000:]
    retried = {e["key"] for e in journal.events() if e["event"] == "retry"}
    assert victim in retried
    records = journal.records()
    assert all(r.outcome.value == "completed" for r in records.values())
    assert Counter(r.cell for r in records.values() if r.phase == "replicate") == {0: 2, 1: 2}  # every seed
    client, children, _ = child_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(children) == 4 and not [c for c in children if c.info.status == "RUNNING"]
    for run in children:
        if run.data.tags["orchestrator.trial_key"] in retried:
            epochs = [m.step for m in client.get_metric_history(run.info.run_id, "dev_spearman")]
            assert sorted(epochs) == [1, 2, 3, 4]  # continued from its checkpoint, no epoch trained twice
            assert int(run.data.tags["ray.retries"]) >= 1


def test_the_second_node_dies_and_its_trials_finish_on_the_head(cluster, tiny_bert, data_dir, tmp_path):
    # until Ray declares the node dead (3 missed 1 s heartbeats) a retry may land on it again
    study = write_study(tmp_path, tiny_bert, data_dir, "sqlite:///mlflow.db", max_failures=5,
                        train={"epochs": 6, "batch_size": 8, "max_seq_length": 32},
                        data={"max_train_samples": 400, "max_eval_samples": 80})
    driver = orchestrator("launch", str(study), "--address", cluster.address, "--storage", str(tmp_path / "shared"),
                          env=cluster.env, cwd=tmp_path, background=True)
    journal = Journal(tmp_path / "shared" / "cluster" / "journal.jsonl")
    # one on each node, each with at least 3 of its 6 epochs to go: on a loaded machine the two trials' first two
    # epochs need not overlap (a CI run of 4 epochs, at most 2 checkpoints, found no moment they did)
    wait_for(journal, lambda events: len(early_in_training(events, most=3)) == 2, driver)
    started = time.monotonic()
    assert cluster.kill_worker_node() >= 1
    out, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-3000:]
    records = journal.records()
    assert len(records) == 4 and all(r.outcome.value == "completed" for r in records.values())
    client, children, _ = child_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    moved = [c for c in children if c.data.tags.get("ray.nodes", "").split(",")[-1] == HEAD_IP
             and WORKER_IP in c.data.tags.get("ray.nodes", "")]
    assert moved, [c.data.tags.get("ray.nodes") for c in children]  # a trial of the dead node finished on the head
    assert {c.data.tags["orchestrator.trial_key"] for c in moved} <= {e["key"] for e in journal.events()
                                                                      if e["event"] == "retry"}
    assert not [c for c in children if c.info.status == "RUNNING"]
    print(f"recovered {len(moved)} trial(s) of the dead node in {time.monotonic() - started:.0f} s")


def outage_study(folder: Path, model: str, data_dir: Path, uri: str, seeds: int = 2) -> Path:
    return write_study(folder, model, data_dir, uri, train={"epochs": 4, "batch_size": 8, "max_seq_length": 32},
                       data={"max_train_samples": 400, "max_eval_samples": 80}, replicate={"seeds": seeds})


def assert_fully_tracked(uri: str, epochs: int = 4, trials: int = 4) -> None:
    client, children, parents = child_runs(uri)
    assert len(children) == trials and len(parents) == 1 and parents[0].info.status == "FINISHED"
    keys = Counter(c.data.tags["orchestrator.trial_key"] for c in children)
    assert max(keys.values()) == 1  # no duplicate runs
    for run in children:
        assert run.info.status == "FINISHED" and run.data.tags["outcome"] == "completed"
        history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "dev_spearman"))
        assert history == list(range(1, epochs + 1))  # every epoch, once
        assert "test_spearman" in run.data.metrics
        assert "test_predictions.csv" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.parametrize("outage", ["stopped", "frozen"])
def test_a_tracking_server_outage_mid_study_loses_nothing(outage, server, tiny_bert, data_dir, tmp_path):
    """`stopped`: the server's processes are gone (connections refused), then it starts again. `frozen`: they are
    SIGSTOPped, then continued: the port still accepts connections and nothing answers (a hung server, an
    overloaded database behind it), so every write waits out its 15 s timeout."""
    study = outage_study(tmp_path, tiny_bert, data_dir, server.uri, seeds=4)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    driver = orchestrator("launch", str(study), "--storage", str(tmp_path / "studies"), env=env, cwd=tmp_path,
                          background=True)
    journal = Journal(tmp_path / "studies" / "cluster" / "journal.jsonl")
    wait_for(journal, lambda events: any(e["event"] == "result" for e in events), driver)
    if outage == "stopped":
        server.stop()
    else:
        os.killpg(server.process.pid, signal.SIGSTOP)
    down = len([e for e in journal.events() if e["event"] == "result"])
    seconds = 10 if outage == "stopped" else 25  # frozen: longer than a write's timeout
    time.sleep(seconds)  # training goes on while the tracker is down
    during = len([e for e in journal.events() if e["event"] == "result"])
    if outage == "stopped":
        server.start()
    else:
        os.killpg(server.process.pid, signal.SIGCONT)
    out, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-3000:]
    assert during > down  # results kept coming during the outage
    assert "training goes on" in err and "is back: replayed" in err
    replayed = re.search(r"is back: replayed \{[^}]*\}", err)[0]
    print(f"{outage} outage of about {seconds} s during {during - down} results; {replayed}")
    assert "report: reports/cluster/report.md" in out
    assert_fully_tracked(server.uri, trials=8)


def test_a_server_down_until_the_end_is_caught_up_by_sync(server, tiny_bert, data_dir, tmp_path):
    study = outage_study(tmp_path, tiny_bert, data_dir, server.uri)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ORCHESTRATOR_TRACKING_GRACE_S": "3"}
    driver = orchestrator("launch", str(study), "--storage", str(tmp_path / "studies"), env=env, cwd=tmp_path,
                          background=True)
    journal = Journal(tmp_path / "studies" / "cluster" / "journal.jsonl")
    wait_for(journal, lambda events: any(e["event"] == "result" for e in events), driver)
    server.stop()
    out, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-3000:]
    assert "cluster: finished: 4 completed" in out and "orchestrator sync cluster" in err
    server.start()
    synced = orchestrator("sync", "cluster", "--storage", str(tmp_path / "studies"), env=env, cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr[-2000:]
    assert "unfinished runs marked KILLED" in synced.stdout
    assert_fully_tracked(server.uri)
    again = orchestrator("sync", "cluster", "--storage", str(tmp_path / "studies"), env=env, cwd=tmp_path)
    assert "created 0 runs, logged 0 epochs, closed 0 runs" in again.stdout  # idempotent


def test_doctor_fails_one_line_per_problem_and_exits_1(tiny_bert, data_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    study = write_study(tmp_path, "no-such-org/no-such-model", data_dir, "sqlite:///mlflow.db")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = orchestrator("doctor", "--study", str(study), "--storage", str(blocker / "studies"), env=env,
                          cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("FAIL  model: model: 'no-such-org/no-such-model' is not valid") for line in lines)
    assert any(line.startswith("FAIL  storage: ") and "NotADirectoryError" in line for line in lines)
    assert any(line.startswith("ok    versions: ray ") for line in lines)
    assert any(line.startswith("ok    tracking: sqlite:///mlflow.db") for line in lines)
