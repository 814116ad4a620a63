"""`orchestrator doctor`: is this cluster, storage, tracker, data and model ready for a study?

Each check is one line (ok or FAIL with the reason and the fix); any failure makes the command
exit non-zero. Node-level checks run a zero-CPU task pinned to every alive node, so they work
on a busy cluster and prove what each node, not only the driver, can see.
"""

from __future__ import annotations

import os
import platform
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


def study_checks(study_file: Path) -> list[Check]:
    """The study file, its model (offline or online), its data, and its tracking URI."""
    from orchestrator.config import load_study, models_of
    from orchestrator.planning import build_plan, check_tracking_uri
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
