"""The cluster recipes cannot run here; they are checked against Ray 2.60's cluster-launcher
schema and for the structure a RayJob needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import yaml

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "cluster"


def test_the_cluster_launcher_yaml_passes_ray_s_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((RECIPES / "ray-cluster.yaml").read_text())
    validate_config(prepare_config(config))  # the launcher fills defaults, then checks the schema
    assert config["head_node_type"] in config["available_node_types"]
    assert "orchestrator launch examples/stsb_layers.yaml" in (RECIPES / "ray-cluster.yaml").read_text()
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts)


def test_a_broken_launcher_yaml_is_caught_by_the_same_check():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((RECIPES / "ray-cluster.yaml").read_text())
    config["available_node_types"]["head"]["node_confg"] = config["available_node_types"]["head"].pop("node_config")
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


def test_the_rayjob_runs_the_study_with_gpus_shared_storage_and_token_auth():
    job = yaml.safe_load((RECIPES / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert "orchestrator launch examples/stsb_layers.yaml --address auto" in spec["entrypoint"]
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["shared"] == "/mnt/shared" and "/mnt/shared/studies" in spec["entrypoint"]
        assert {v["name"] for v in pod["volumes"]} == {"shared"}
    gpu = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpu["nvidia.com/gpu"] == "1"
