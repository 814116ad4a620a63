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

MLflow's writes are made by a writer thread (the tracker's default): "mlflow" in the driver's parts is
then the time to queue them, and the writer's own time making the requests is printed per trial beside
the wait for its queue as the launch ends; `--writer inline` makes them on the driver's thread as before,
`--writer both` measures both ways side by side.

`--tracking-uri postgresql+server` measures the same sizes again with MLflow behind a tracking server on a
private PostgreSQL cluster (Debian's `postgresql`, `initdb` into a temp folder, tests/services.py; psycopg
from the extra `ablation-orchestrator[postgres]`) and prints both stores side by side; `sqlite+server` (an
MLflow server on SQLite) and a running server's http(s):// URL work too.

    python benchmarks/scale.py --data-dir ../shared/data --trials 10000      # about 20 minutes on 2 cores
    python benchmarks/scale.py --small 200 --trials 1000 --tracking-uri postgresql+server --writer both
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.services: the private PostgreSQL and server
from orchestrator.run.launcher import launch  # noqa: E402
from orchestrator.run.resilient_tracker import ResilientTracker  # noqa: E402
from orchestrator.study.folder import StudyFolder  # noqa: E402
from orchestrator.study.journal import Journal  # noqa: E402

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


def executor(timers: Timers, ticks: list[tuple[int, float]], trackers: list | None = None):
    """Tune's part of a launch, in process (benchmarks/instant.py), each adapter call timed; `trackers`
    receives the launch's MLflow tracker (its writer thread's busy time is read after the launch)."""
    execute = instant_executor(dev_score, SLOTS, timers.wrap,
                               on_finished=lambda n: ticks.append((n, time.perf_counter())))

    def run(plan, state, tracker, *rest) -> None:
        if trackers is not None:
            trackers.append(tracker)
        execute(plan, state, tracker, *rest)
    return run


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


class Store:
    """Where a measured study is tracked: SQLite in the study's temp folder, or a tracking server (started
    here on PostgreSQL or SQLite, each on 127.0.0.1, or one already running at an http(s):// URL)."""

    NAMES = {"sqlite": "SQLite file", "postgresql+server": "server on PostgreSQL", "sqlite+server": "server on SQLite"}

    def __init__(self, kind: str, folder: Path):
        self.kind, self.folder, self.services = kind, folder, []
        self.name = self.NAMES.get(kind, kind)
        if kind == "sqlite":
            self.uri = f"sqlite:///{folder / 'mlflow.db'}"
        elif kind in ("postgresql+server", "sqlite+server"):
            from tests.services import MlflowServer, PostgresCluster

            backend = None
            if kind == "postgresql+server":
                self.services.append(PostgresCluster().start())
                backend = self.services[-1].uri
            self.services.append(MlflowServer(folder, backend).start())
            self.uri = self.services[-1].uri
        else:
            self.uri = kind

    def size_mb(self) -> float | None:
        """The backend store's size (None for a server run elsewhere)."""
        if self.kind in ("sqlite", "sqlite+server"):
            return (self.folder / ("mlflow.db" if self.kind == "sqlite" else "server.db")).stat().st_size / 2**20
        if self.kind == "postgresql+server":
            import psycopg

            pg = self.services[0]
            with psycopg.connect(host="127.0.0.1", port=pg.port, user=pg.role, password=pg.password,
                                 dbname=pg.database) as connection:
                return connection.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 2**20
        return None

    def close(self) -> None:
        for service in reversed(self.services):
            service.stop()


def measure(trials: int, data_dir: str, folder: Path, store: Store) -> dict:
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
            "tracking": {"mlflow_uri": store.uri}}
    path = folder / f"scale{trials}.yaml"
    path.write_text(yaml.safe_dump(spec))
    timers, ticks, trackers = Timers(), [], []
    original, drain = Journal.write, ResilientTracker.drain
    Journal.write = timers.wrap("journal", original)
    ResilientTracker.drain = timers.wrap("drain", drain)  # as the launch ends: the writes still queued
    try:
        started = time.perf_counter()
        result = launch(path, storage=folder / "studies", executor=executor(timers, ticks, trackers))
        launch_s = time.perf_counter() - started
    finally:
        Journal.write, ResilientTracker.drain = original, drain
    drain_s = timers.seconds.pop("drain", 0.0)
    assert result.finished and result.counts["issued"] == trials, result.counts
    first, last = ticks[0][1], ticks[-1][1]
    tenth = max(1, len(ticks) // 10)
    early = (ticks[tenth - 1][1] - first) / max(1, tenth - 1)
    late = (last - ticks[-tenth][1]) / max(1, tenth - 1)
    driver = (last - first) / max(1, len(ticks) - 1)

    started = time.perf_counter()
    StudyFolder.named(spec["name"], folder / "studies").state()
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
            "writer_ms": 1000 * trackers[0].busy_s / trials, "drain_s": drain_s,
            "writer": "a writer thread" if trackers[0].queue is not None else "inline",
            "late_ms": 1000 * late, "launch_s": launch_s,
            "parts": {k: 1000 * v / trials for k, v in sorted(timers.seconds.items(), key=lambda kv: -kv[1])},
            "replay_s": replay_s, "resume_s": resume_s, "status_s": status_s, "report_s": report_s,
            "verify_s": verify_s, "results_s": results_s, "curves_s": curves_s,
            "store_mb": store.size_mb(),
            "journal_mb": (folder / "studies" / spec["name"] / "journal.jsonl").stat().st_size / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("ORCHESTRATOR_DATA_DIR", "../shared/data"),
                        help="the data folder (default: $ORCHESTRATOR_DATA_DIR, else ../shared/data)")
    parser.add_argument("--trials", type=int, default=10_000, help="the large size (the small one is 1,000)")
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--tracking-uri", default="sqlite", help="sqlite (default), postgresql+server, sqlite+server "
                        "or a running server's http(s):// URL; any but sqlite is measured beside SQLite")
    parser.add_argument("--writer", default="background", choices=["background", "inline", "both"],
                        help="MLflow's writes on a writer thread (the default), on the driver's thread "
                        "(ORCHESTRATOR_TRACKING_WRITER=inline), or both, side by side")
    args = parser.parse_args()
    if args.tracking_uri not in Store.NAMES and not args.tracking_uri.startswith(("http://", "https://")):
        parser.exit(2, f"error: --tracking-uri: {args.tracking_uri} is not valid; use sqlite, postgresql+server, "
                       "sqlite+server or an http(s):// URL\n")
    data_dir = str(Path(args.data_dir).resolve())
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    kinds = ["sqlite"] + ([args.tracking_uri] if args.tracking_uri != "sqlite" else [])
    writers = ["background", "inline"] if args.writer == "both" else [args.writer]
    found: dict[tuple[str, str, int], dict] = {}
    for kind in kinds:
        for writer in writers:
            os.environ["ORCHESTRATOR_TRACKING_WRITER"] = writer
            for trials in (args.small, args.trials):
                with tempfile.TemporaryDirectory() as tmp:
                    store = Store(kind, Path(tmp))
                    try:
                        found[kind, writer, trials] = measure(trials, data_dir, Path(tmp), store)
                    finally:
                        store.close()
                print_measure(found[kind, writer, trials], store.name if len(kinds) > 1 else "")
    small, large = found["sqlite", writers[0], args.small], found["sqlite", writers[0], args.trials]
    print(f"scale: {large['trials']} trials, driver {large['driver_ms']:.1f} ms/trial (1k: {small['driver_ms']:.1f}), "
          f"status {large['status_s']:.1f} s, report {large['report_s']:.1f} s, results() {large['results_s']:.1f} s")
    if len(found) > 2:
        print_side_by_side(found)


def print_measure(m: dict, store: str) -> None:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in m["parts"].items())
    size = "n/a" if m["store_mb"] is None else f"{m['store_mb']:.1f} MiB"
    print(f"{store + ': ' if store else ''}{m['trials']} trials ({m['cells']} cells x {PER_CELL}): driver "
          f"{m['driver_ms']:.1f} ms/trial (first tenth {m['early_ms']:.1f}, last tenth {m['late_ms']:.1f}); per trial "
          f"in ms: {parts} (journal is inside ask, tell and pruner); launch {m['launch_s']:.0f} s in all", flush=True)
    print(f"    MLflow's writes ({m['writer']}): {m['writer_ms']:.1f} ms/trial making requests, {m['drain_s']:.1f} s "
          f"waited for the queue as the launch ended", flush=True)
    print(f"    replay {m['replay_s']:.1f} s, resume (nothing left) {m['resume_s']:.1f} s, status "
          f"{m['status_s']:.1f} s, report {m['report_s']:.1f} s, verify {m['verify_s']:.1f} s, results() "
          f"{m['results_s']:.1f} s, results(curves=True) {m['curves_s']:.1f} s; MLflow store {size}, journal "
          f"{m['journal_mb']:.1f} MiB", flush=True)


def print_side_by_side(found: dict) -> None:
    """One row per store and size: the driver's cost per trial, MLflow's part of it, and the verbs."""
    header = ("store", "trials", "driver ms/trial", "mlflow ms/trial", "writer ms/trial", "end wait s", "status s",
              "report s", "verify s", "results() s", "store MiB")
    rows = [header] + [(f"{Store.NAMES.get(kind, kind)}, {m['writer']}", str(trials), f"{m['driver_ms']:.1f}",
                        f"{m['parts'].get('mlflow', 0.0):.1f}", f"{m['writer_ms']:.1f}", f"{m['drain_s']:.1f}",
                        f"{m['status_s']:.1f}", f"{m['report_s']:.1f}",
                        f"{m['verify_s']:.1f}", f"{m['results_s']:.1f}",
                        "n/a" if m["store_mb"] is None else f"{m['store_mb']:.1f}")
                       for (kind, _, trials), m in found.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]))


if __name__ == "__main__":
    main()
