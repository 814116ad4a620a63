"""`orchestrator doctor`: is this cluster, storage, tracker, data and model ready for a study?

Each check is one line (ok or FAIL with the reason and the fix); any failure makes the command
exit non-zero. Node-level checks run a zero-CPU task pinned to every alive node, so they work
on a busy cluster and prove what each node, not only the driver, can see.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from trainables.errors import UserInputError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def _node_report(storage: str, token: str) -> dict:
    """Runs on one node: its versions, and whether it can write and read the shared storage."""
    import ray
    import torch

    info = {"node_ip": ray.util.get_node_ip_address(), "ray": ray.__version__, "python": platform.python_version(),
            "torch": torch.__version__, "storage_error": None}
    try:
        folder = Path(storage) / ".doctor"
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f"{info['node_ip']}-{token}.txt"
        probe.write_text(token)
        info["storage_written"] = str(probe)
    except OSError as exc:
        info["storage_error"] = f"{type(exc).__name__}: {exc}"
    return info


def cluster_checks(ray, storage: Path, gpu_per_trial: float = 0.0, cpu_per_trial: float = 1.0) -> list[Check]:
    """Nodes and resources, the same Ray / Python / torch on every node, storage from every node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"]]
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0), total.get("GPU", 0)
    checks = [Check("ray cluster", bool(nodes), f"{len(nodes)} node(s) alive, {cpus:g} CPUs, {gpus:g} GPUs")]
    if gpu_per_trial > gpus:
        checks.append(Check("gpus", False, f"trials ask for {gpu_per_trial:g} GPU, the cluster has {gpus:g}; "
                                           "use resources.gpu: 0 or a cluster with GPUs"))
    if cpu_per_trial > max((n["Resources"].get("CPU", 0) for n in nodes), default=0):
        checks.append(Check("cpus", False, f"trials ask for {cpu_per_trial:g} CPUs, no node has that many; "
                                           "lower resources.cpu"))
    token = uuid.uuid4().hex
    remote = ray.remote(num_cpus=0)(_node_report)
    futures = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
               .remote(str(storage), token) for n in nodes]
    try:
        reports = ray.get(futures, timeout=120)
    except Exception as exc:  # a node that cannot run a task at all
        return checks + [Check("nodes run tasks", False, f"{type(exc).__name__}: {exc}")]
    import torch

    mine = (ray.__version__, platform.python_version(), torch.__version__)
    mismatched = [r for r in reports if (r["ray"], r["python"], r["torch"]) != mine]
    checks.append(Check("versions", not mismatched,
                        f"ray {mine[0]}, python {mine[1]}, torch {mine[2]} on the driver and every node" if not
                        mismatched else "different on " + ", ".join(
                            f"{r['node_ip']} (ray {r['ray']}, python {r['python']}, torch {r['torch']})"
                            for r in mismatched) + "; install the same versions everywhere"))
    unreadable = []
    for r in reports:
        path = r.get("storage_written")
        if r["storage_error"] or not path or not Path(path).is_file() or Path(path).read_text() != token:
            unreadable.append(f"{r['node_ip']} ({r['storage_error'] or 'its file is not visible to the driver'})")
        elif path:
            Path(path).unlink(missing_ok=True)
    checks.append(Check("storage", not unreadable, f"{storage} written by every node and read back by the driver"
                        if not unreadable else f"{storage} not shared with: {', '.join(unreadable)}; give --storage a "
                                               "file system every node mounts (NFS, EFS, a ReadWriteMany volume)"))
    auth = os.environ.get("RAY_AUTH_MODE", "")
    checks.append(Check("ray auth", True, "token authentication on (RAY_AUTH_MODE=token)" if auth == "token" else
                        "no RAY_AUTH_MODE set here; a cluster reachable by others should use RAY_AUTH_MODE=token "
                        "with the same RAY_AUTH_TOKEN(_PATH) on every node and the driver"))
    return checks


DOCTOR_EXPERIMENT = "orchestrator-doctor"  # where the tracking checks write their probe run (then deleted)


QUICK_REQUESTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
                  "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # a failing store fails a check, not hangs it


@contextlib.contextmanager
def _quick_requests():
    """MLflow's requests without retries for the duration of the checks; the caller's settings come back."""
    saved = {name: os.environ.get(name) for name in QUICK_REQUESTS}
    os.environ.update(QUICK_REQUESTS)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _artifact_probe(uri: str, run_id: str, token: str) -> dict:
    """Runs on one node: writes a small artifact into the probe run, through the tracking URI as this
    node sees it (a proxied artifact store through the server, any other store directly)."""
    import ray
    from mlflow.tracking import MlflowClient

    node_ip = ray.util.get_node_ip_address()
    try:
        with _quick_requests():
            MlflowClient(uri).log_text(run_id, token, f"doctor/{node_ip.replace(':', '_')}.txt")
        return {"node_ip": node_ip, "error": None}
    except Exception as exc:  # the node cannot reach the server or the artifact store
        return {"node_ip": node_ip, "error": _one_line(exc)}


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def _milliseconds(seconds: list[float]) -> str:
    return f"median {1000 * statistics.median(seconds):.0f} ms, max {1000 * max(seconds):.0f} ms"


def tracking_checks(uri: str, ray=None, base: Path | None = None, requests: int = 10) -> list[Check]:
    """A SQLite store: writable. A tracking server: it answers, its backend store takes a run's writes and
    gives them back, its artifact store takes a file from every node (a task per node when `ray` is
    given, else from here), and the round-trip time of a write and of a read."""
    from orchestrator.study.store_check import check_tracking_uri

    if not uri.startswith(("http://", "https://")):
        try:
            check_tracking_uri(uri, base or Path.cwd())
            return [Check("tracking", True, uri)]
        except UserInputError as exc:
            return [Check("tracking", False, str(exc))]
    import urllib.request

    started = time.perf_counter()
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10) as answer:
            answer.read()
    except OSError as exc:
        return [Check("tracking server", False, f"{uri} does not answer ({exc}); start it or fix the URL")]
    checks = [Check("tracking server", True, f"{uri} answers in {1000 * (time.perf_counter() - started):.0f} ms")]
    with _quick_requests():
        return checks + _server_checks(uri, ray, requests)


def _server_checks(uri: str, ray, requests: int) -> list[Check]:
    """The backend store (a probe run's writes read back), the latency, and the artifact store."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client, run, checks = MlflowClient(uri), None, []
    try:
        experiment = client.get_experiment_by_name(DOCTOR_EXPERIMENT)
        if experiment is None:
            experiment_id = client.create_experiment(DOCTOR_EXPERIMENT)
        else:
            experiment_id = experiment.experiment_id
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment_id)
        run = client.create_run(experiment_id, run_name="doctor")
        writes, reads = [], []
        for step in range(requests):
            started = time.perf_counter()
            client.log_batch(run.info.run_id, metrics=[Metric("probe", float(step), int(time.time() * 1000), step)])
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            client.get_run(run.info.run_id)
            reads.append(time.perf_counter() - started)
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "probe"))
        checks.append(Check("tracking backend", steps == list(range(requests)),
                            f"a run created, {requests} writes read back" if steps == list(range(requests)) else
                            f"{requests} writes made, {len(steps)} read back; the server's backend store loses writes"))
        checks.append(Check("tracking latency", True, f"a write {_milliseconds(writes)}; a read {_milliseconds(reads)} "
                                                      f"({requests} requests each)"))
        checks.append(_artifact_check(client, uri, run, ray))
    except Exception as exc:  # the server answers but its backend store (the database) does not take writes
        checks.append(Check("tracking backend", False, f"{_one_line(exc)}; check the server's --backend-store-uri "
                                                       "(is the database up and writable?)"))
    finally:
        if run is not None:
            _remove_probe(client, uri, run)
    return checks


def _artifact_check(client, uri: str, run, ray) -> Check:
    token = uuid.uuid4().hex
    if ray is None:
        reports = [{"node_ip": "this machine", "error": None}]
        try:
            client.log_text(run.info.run_id, token, "doctor/this-machine.txt")
        except Exception as exc:  # the artifact store refuses, or is not reachable from here
            reports[0]["error"] = _one_line(exc)
    else:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(num_cpus=0)(_artifact_probe)
        try:
            reports = ray.get([remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(uri, run.info.run_id, token) for n in ray.nodes() if n["Alive"]],
                timeout=120)
        except Exception as exc:  # a node that cannot run the probe within two minutes
            return Check("tracking artifacts", False, f"the probe did not run on every node ({_one_line(exc)})")
    failed = [f"{r['node_ip']} ({r['error']})" for r in reports if r["error"]]
    where = f"the artifact store ({run.info.artifact_uri.rsplit('/', 2)[0]})"
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as folder:
            written = [a.path for a in client.list_artifacts(run.info.run_id, "doctor")]
            unread = [path for path in written
                      if Path(client.download_artifacts(run.info.run_id, path, folder)).read_text() != token]
    except Exception as exc:  # written (or not) but not readable from here
        return Check("tracking artifacts", False, f"{where} not readable from this machine ({_one_line(exc)})")
    if failed or unread or len(written) < len(reports):
        problem = "; ".join(failed) or f"{len(written)} of {len(reports)} files read back"
        return Check("tracking artifacts", False, f"{where} not written by every node: {problem}; every node must "
                                                  "reach the server (not 127.0.0.1 on a cluster) and its store")
    writers = f"every node ({len(reports)})" if ray else "this machine"
    return Check("tracking artifacts", True, f"{where} written by {writers} and read back")


def _remove_probe(client, uri: str, run) -> None:
    """The probe run and its files go (the run to MLflow's trash, as `mlflow gc` expects)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    for remove in (lambda: get_artifact_repository(run.info.artifact_uri, tracking_uri=uri).delete_artifacts(),
                   lambda: client.delete_run(run.info.run_id)):
        with contextlib.suppress(Exception):  # a store that cannot delete keeps a few bytes; nothing needs them
            remove()


def study_checks(study_file: Path) -> list[Check]:
    """The study file, its model (offline or online), its data, and its tracking URI."""
    from orchestrator.study.config import load_study, models_of
    from orchestrator.study.plan import build_plan
    from orchestrator.study.store_check import check_tracking_uri
    from trainables.data.tasks import task_name
    from trainables.models.encoder import load_config, resolve_model_path

    checks = []
    try:
        study = load_study(study_file)
    except UserInputError as exc:
        return [Check("study file", False, str(exc))]
    checks.append(Check("study file", True, f"{study_file} ({study.trainable} on {task_name(study.task)})"))
    for model in models_of(study):
        try:
            load_config(model)
            where = resolve_model_path(model)
            offline = os.environ.get("HF_HUB_OFFLINE", "0") in ("1", "true", "yes")
            checks.append(Check("model", True, f"{model} from {where}" + (" (offline)" if offline else "")))
        except UserInputError as exc:
            checks.append(Check("model", False, str(exc)))
    if not study.tracking.mlflow_uri.startswith(("http://", "https://")):  # a server: checked with the cluster
        try:
            check_tracking_uri(study.tracking.mlflow_uri, study_file.parent)
            checks.append(Check("tracking", True, study.tracking.mlflow_uri))
        except UserInputError as exc:
            checks.append(Check("tracking", False, str(exc)))
    try:
        plan = build_plan(study, study_file.parent.resolve())
        checks.append(Check("data and plan", True, f"{len(plan.cells)} cells, "
                            f"{plan.tuning_trials + plan.replicate_trials} trials; data from "
                            f"{plan.base.get('data_dir') or 'the hub'}"))
    except UserInputError as exc:
        checks.append(Check("data and plan", False, str(exc)))
    return checks
