"""What the launch path costs against running the trainable bare, in one process, side by side.

1. Per trial and per report: the same finetune config (all-MiniLM-L6-v2 cut at k=2, real STS-B
   slices) run bare in-process, and as a study of N identical trials run one at a time through
   Ray Tune + the plan searcher + MLflow, at 1 and at E epochs; the difference per trial, and its
   growth per extra epoch (one report + one checkpoint each), is Ray's overhead.
2. Busy fraction: a study of several cells on 2 slots; the sum of trial times (MLflow run
   start/end) over slots x wall time of the study.

    python benchmarks/orchestration.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from orchestrator.run.launcher import launch
from orchestrator.run.ray_session import connect_ray
from trainables.contract import collect
from trainables.kinds import get_kind

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def study_file(folder: Path, name: str, data_dir: str, epochs: int, seeds: list[int], layers: list[int],
               cpu: int) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "trainable": "finetune", "task": "stsb", "model": MODEL, "ablate": {"layer": layers},
        "replicate": {"seeds": seeds}, "train": {"epochs": epochs, "batch_size": 32, "max_seq_length": 64},
        "data": {"max_train_samples": 300, "max_eval_samples": 200}, "data_dir": data_dir,
        "resources": {"cpu": cpu}, "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}))
    return path


def bare_seconds(data_dir: str, epochs: int) -> float:
    started = time.perf_counter()
    get_kind("finetune").run({"model": MODEL, "task": "stsb", "layer": 2, "epochs": epochs, "batch_size": 32,
                  "max_seq_length": 64, "max_train_samples": 300, "max_eval_samples": 200, "data_dir": data_dir,
                  "num_threads": 2, "device": "cpu", "seed": 0}, collect([]))
    return time.perf_counter() - started


def spans(folder: Path, name: str) -> list[tuple[float, float]]:
    """(start, end) of each trial's MLflow run, in start order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.phase = 'replicate'")
    return sorted((r.info.start_time / 1000, r.info.end_time / 1000) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    data_dir = str(Path(args.data_dir).resolve())

    started = time.perf_counter()
    connect_ray("local")
    ray_start = time.perf_counter() - started
    bare_seconds(data_dir, 1)  # warm the page cache and the import of every module
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for epochs in (1, args.epochs):
            bare = sum(bare_seconds(data_dir, epochs) for _ in range(2)) / 2
            name = f"serial{epochs}"
            path = study_file(folder, name, data_dir, epochs, list(range(args.trials)), [2], cpu=2)
            launched = time.time()
            launch(path, storage=folder / "studies", max_concurrent=1, progress=False)
            times = spans(folder, name)
            warm = [end - start for start, end in times[1:]]  # the first trial also starts the worker
            first_extra = times[0][1] - launched - bare
            rows.append((epochs, bare, sum(warm) / len(warm), first_extra))
        print(f"Ray start: {ray_start:.1f} s once per launch; launch to the end of the first trial, beyond the bare "
              f"trial (validation, MLflow setup, the worker's start and imports): {rows[0][3]:.1f} s once per launch")
        print(f"{'epochs':>6} {'bare s/trial':>13} {'in Ray s/trial':>15} {'overhead s':>11} {'overhead %':>11}")
        for epochs, bare, study, _ in rows:
            overhead = study - bare
            print(f"{epochs:>6} {bare:>13.2f} {study:>15.2f} {overhead:>11.2f} {100 * overhead / bare:>10.1f}%")
        (e1, b1, s1, _), (e2, b2, s2, _) = rows
        per_report = ((s2 - b2) - (s1 - b1)) / (e2 - e1)
        fixed = (s1 - b1) - per_report
        print(f"per trial on a reused worker: {fixed:.2f} s fixed + {per_report:.2f} s per report (epoch); on a "
              f"one-minute trial of {args.epochs} epochs: {100 * (fixed + args.epochs * per_report) / 60:.1f} %")

        name = "busy"
        path = study_file(folder, name, data_dir, 2, [0, 1], [1, 2, 3, 4], cpu=1)
        started = time.perf_counter()
        launch(path, storage=folder / "studies", progress=False)
        wall = time.perf_counter() - started
        times = spans(folder, name)
        first, last = times[0][0], max(end for _, end in times)
        busy = sum(end - start for start, end in times)
        print(f"busy fraction, 4 cells x 2 seeds on 2 slots: {100 * busy / (2 * (last - first)):.1f} % between the "
              f"first trial start and the last trial end ({last - first:.1f} s); {100 * busy / (2 * wall):.1f} % "
              f"of the whole launch ({wall:.1f} s: validation, MLflow setup and worker start included)")


if __name__ == "__main__":
    main()
