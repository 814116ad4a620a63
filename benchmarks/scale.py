"""What a 10,000-trial study costs the driver: everything but the training, measured at two sizes.

A real `finetune` study (all-MiniLM-L6-v2, per-cell TPE + ASHA over lr and warmup_ratio, 3 replicate seeds
per cell, 3 epochs) is launched through the real `launch`: study folder, lock, journal, plan, per-cell
Optuna studies, the Tune adapters (`PlanSearcher`, `CellScheduler`, `TrackingCallback`, `ProgressCallback`
writing its lines to a file) and MLflow on SQLite. Only Ray Tune's trial execution is replaced, by an
in-process executor whose trials take no time: each reports seeded dev scores (a smooth function of the
configuration, the cell and the seed) through the same adapter calls Tune makes, `SLOTS` trials at a time.
Ray Tune's own cost per trial is measured apart, by benchmarks/orchestration.py.

Per size: the driver's cost per trial (and its parts: ask, tell + journal, pruner, MLflow, progress), its
cost over the first and the last tenth of the trials (what grows with the study shows there), `status` and
`report` and `verify` as a user runs them (the CLI, a fresh process), `results()` and its curves (a fresh
Python, imports included), the replay a `resume` does, and MLflow's store size. The last line:
    scale: N trials, driver X ms/trial (1k: Y), status S s, report R s, results() T s

    python benchmarks/scale.py --data-dir ../shared/data --trials 10000      # about 20 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml
from instant import instant_executor  # benchmarks/instant.py, beside this script

from orchestrator.journal import Journal
from orchestrator.launcher import launch
from orchestrator.study import Study

SLOTS = 16
PER_CELL = 100  # trials per cell: 97 tuning trials and 3 replicates
AXES = {"layer": [1, 2, 3, 4, 5], "pooling": ["mean", "cls", "max", "mean_sqrt_len"],
        "max_seq_length": [64, 96, 128, 192, 256]}


class Timers:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
        return timed


def dev_score(config: dict, seed: int, epoch: int) -> float:
    """Seeded and smooth: a best lr near 5e-5, a cell offset, a learning curve, seed noise."""
    noise = random.Random(f"{seed} {config.get('lr')} {config['layer']} {config['pooling']}").gauss(0, 0.4)
    lr_term = 6 * (math.log10(config["lr"]) + 4.3) ** 2
    return (60 + 4 * config["layer"] - 2 * (config["pooling"] != "mean") + 0.01 * config["max_seq_length"]
            - lr_term - 10 * (config.get("warmup_ratio", 0.1) - 0.1) ** 2 + 3 * math.log(epoch) + noise)


def executor(timers: Timers, ticks: list[tuple[int, float]]):
    """Tune's part of a launch, in process (benchmarks/instant.py), each adapter call timed."""
    return instant_executor(dev_score, SLOTS, timers.wrap,
                            on_finished=lambda n: ticks.append((n, time.perf_counter())))


def cli(*args: str) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run([str(Path(sys.executable).parent / "orchestrator"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"orchestrator {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return time.perf_counter() - started, out.stdout


def python(code: str) -> tuple[float, str]:
    """Seconds a fresh Python takes to run `code` (imports included, as a user's script pays them), and
    what it printed."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"python -c {code!r} failed ({out.returncode}):\n{out.stderr}")
    return time.perf_counter() - started, out.stdout.strip()


def measure(trials: int, data_dir: str, folder: Path) -> dict:
    cells = max(1, trials // PER_CELL)
    values, size = {}, 1
    for axis, options in AXES.items():  # the first axes that give `cells` cells
        take = min(len(options), max(1, cells // size))
        values[axis], size = options[:take], size * take
    assert size == cells, f"{trials} trials: choose a multiple of {PER_CELL} that the axes can make"
    spec = {"name": f"scale{trials}", "trainable": "finetune", "task": "stsb",
            "model": "sentence-transformers/all-MiniLM-L6-v2", "ablate": values,
            "tune": {"params": {"lr": {"loguniform": [1e-5, 1e-3]}, "warmup_ratio": {"uniform": [0.0, 0.3]}},
                     "trials": PER_CELL - 3},
            "replicate": {"seeds": [0, 1, 2]}, "train": {"epochs": 3}, "data_dir": data_dir,
            "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}
    path = folder / f"scale{trials}.yaml"
    path.write_text(yaml.safe_dump(spec))
    timers, ticks = Timers(), []
    original = Journal.write
    Journal.write = timers.wrap("journal", original)
    try:
        started = time.perf_counter()
        result = launch(path, storage=folder / "studies", executor=executor(timers, ticks))
        launch_s = time.perf_counter() - started
    finally:
        Journal.write = original
    assert result.finished and result.counts["issued"] == trials, result.counts
    first, last = ticks[0][1], ticks[-1][1]
    tenth = max(1, len(ticks) // 10)
    early = (ticks[tenth - 1][1] - first) / max(1, tenth - 1)
    late = (last - ticks[-tenth][1]) / max(1, tenth - 1)
    driver = (last - first) / max(1, len(ticks) - 1)

    started = time.perf_counter()
    Study.named(spec["name"], folder / "studies").state()
    replay_s = time.perf_counter() - started
    started = time.perf_counter()
    launch(folder / "studies" / spec["name"] / "study.yaml", storage=folder / "studies", resume=True,
           progress=False, executor=executor(Timers(), []))
    resume_s = time.perf_counter() - started
    status_s, _ = cli("status", spec["name"], "--storage", str(folder / "studies"))
    report_s, _ = cli("report", spec["name"], "--storage", str(folder / "studies"), "--out",
                      str(folder / "reports" / spec["name"]))
    verify_s, _ = cli("verify", str(folder / "reports" / spec["name"]))
    where = f"{spec['name']!r}, storage={str(folder / 'studies')!r}"
    results_s, rows = python(f"import orchestrator as orc; print(len(orc.results({where})))")
    assert int(rows) == trials, rows
    curves_s, _ = python(f"import orchestrator as orc; print(len(orc.results({where}, curves=True)))")
    return {"trials": trials, "cells": cells, "driver_ms": 1000 * driver, "early_ms": 1000 * early,
            "late_ms": 1000 * late, "launch_s": launch_s,
            "parts": {k: 1000 * v / trials for k, v in sorted(timers.seconds.items(), key=lambda kv: -kv[1])},
            "replay_s": replay_s, "resume_s": resume_s, "status_s": status_s, "report_s": report_s,
            "verify_s": verify_s, "results_s": results_s, "curves_s": curves_s,
            "store_mb": (folder / "mlflow.db").stat().st_size / 2**20,
            "journal_mb": (folder / "studies" / spec["name"] / "journal.jsonl").stat().st_size / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("ORCHESTRATOR_DATA_DIR", "../shared/data"),
                        help="the data folder (default: $ORCHESTRATOR_DATA_DIR, else ../shared/data)")
    parser.add_argument("--trials", type=int, default=10_000, help="the large size (the small one is 1,000)")
    parser.add_argument("--small", type=int, default=1_000)
    args = parser.parse_args()
    data_dir = str(Path(args.data_dir).resolve())
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    found = []
    for trials in (args.small, args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            m = measure(trials, data_dir, Path(tmp))
        found.append(m)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in m["parts"].items())
        print(f"{m['trials']} trials ({m['cells']} cells x {PER_CELL}): driver {m['driver_ms']:.1f} ms/trial "
              f"(first tenth {m['early_ms']:.1f}, last tenth {m['late_ms']:.1f}); per trial in ms: {parts} "
              f"(journal is inside ask, tell and pruner); launch {m['launch_s']:.0f} s in all", flush=True)
        print(f"    replay {m['replay_s']:.1f} s, resume (nothing left) {m['resume_s']:.1f} s, status "
              f"{m['status_s']:.1f} s, report {m['report_s']:.1f} s, verify {m['verify_s']:.1f} s, results() "
              f"{m['results_s']:.1f} s, results(curves=True) {m['curves_s']:.1f} s; MLflow store "
              f"{m['store_mb']:.1f} MiB, journal {m['journal_mb']:.1f} MiB", flush=True)
    small, large = found
    print(f"scale: {large['trials']} trials, driver {large['driver_ms']:.1f} ms/trial (1k: {small['driver_ms']:.1f}), "
          f"status {large['status_s']:.1f} s, report {large['report_s']:.1f} s, results() {large['results_s']:.1f} s")


if __name__ == "__main__":
    main()
