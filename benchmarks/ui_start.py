"""How long `orchestrator ui NAME` takes to print its URL, what it runs, and whether it stays quiet.

Makes a small study (instant trials: a real study folder and MLflow store, no training), then starts
`orchestrator ui` N times: the seconds until the URL line, the processes under it once the URL is
printed and their memory (proportional set size, shared pages split between the processes that map
them; RSS beside it), the lines it wrote to stderr (none expected: no traceback, no warning), and
whether the page answers through the proxy. Ctrl-C (SIGINT) stops each start.

    python benchmarks/ui_start.py --starts 20
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]


def make_study(folder: Path) -> Path:
    """A two-cell study, trials instant, tracked in `folder/mlflow.db`; returns its storage folder. This
    checkout makes it (the `ui` of another, `--tree`, is timed on the same folder)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import save_tiny_bert

    from benchmarks.instant import instant_executor
    from orchestrator.run.launcher import launch

    model = save_tiny_bert(folder / "tiny")
    data = folder / "data" / "stsb"
    data.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        rows = [f"main-captions\tx\t2024\t{i:04d}\t{i % 5}.0\ta cat sits {i}\ta dog runs {i}" for i in range(20)]
        (data / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    study = folder / "ui.yaml"
    study.write_text(yaml.safe_dump({
        "name": "ui", "model": str(model), "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
        "tune": {"params": {"lr": {"loguniform": [1e-5, 1e-4]}}, "trials": 2, "startup_trials": 1},
        "train": {"epochs": 2}, "data_dir": str(folder / "data"),
        "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}))
    launch(study, storage=folder / "studies", progress=False,
           executor=instant_executor(lambda config, seed, epoch: 50.0 + epoch + config.get("layer", 0)))
    return folder / "studies"


def tree_memory(pid: int) -> tuple[int, float, float]:
    """(processes, PSS MiB, RSS MiB) of `pid` and everything under it."""
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    pss = rss = 0
    for process in processes:
        try:
            info = process.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        pss += info.pss
        rss += info.rss
    return len(processes), pss / 2**20, rss / 2**20


def one_start(storage: Path, port: int, env: dict, tree: Path) -> dict:
    """One `orchestrator ui` of `tree` (run from its root: `python -m` puts the working folder first)."""
    started = time.monotonic()
    ui = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", "ui", "--storage", str(storage),
                           "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=tree)
    line = ui.stdout.readline()
    seconds = time.monotonic() - started
    url = line.split(": ", 1)[-1].split()[0] if "http://" in line else None
    processes, pss, rss = tree_memory(ui.pid) if url else (0, 0.0, 0.0)
    answered = False
    if url:
        with urllib.request.urlopen(url, timeout=30) as page:
            answered = page.status == 200 and b"<html" in page.read().lower()
    ui.send_signal(signal.SIGINT)
    try:
        out, err = ui.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        ui.kill()
        out, err = ui.communicate()
    return {"seconds": seconds, "url": url, "answered": answered, "processes": processes, "pss_mib": pss,
            "rss_mib": rss, "stderr_lines": [x for x in err.splitlines() if x.strip()], "exit": ui.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--port", type=int, default=5077)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose `orchestrator ui` runs "
                                                                 "(default: this one), to compare with another")
    args = parser.parse_args()
    tree = args.tree.resolve()
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as scratch:
        storage = make_study(Path(scratch))
        runs, load = [], os.getloadavg()[0]
        for number in range(1, args.starts + 1):
            run = one_start(storage, args.port, env, tree)
            runs.append(run)
            print(f"start {number:2d}: URL after {run['seconds']:5.1f} s, {run['processes']} processes, "
                  f"PSS {run['pss_mib']:.0f} MiB (RSS {run['rss_mib']:.0f} MiB), page "
                  f"{'answered' if run['answered'] else 'did NOT answer'}, exit {run['exit']}, "
                  f"{len(run['stderr_lines'])} stderr lines", flush=True)
            for text in run["stderr_lines"][:5]:
                print(f"    stderr: {text[:160]}")
    seconds = [r["seconds"] for r in runs]
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"\n{tree} ({commit}), {len(runs)} starts: URL after median {statistics.median(seconds):.1f} s, "
          f"min {min(seconds):.1f} s, "
          f"max {max(seconds):.1f} s; processes {sorted({r['processes'] for r in runs})}; PSS median "
          f"{statistics.median(r['pss_mib'] for r in runs):.0f} MiB; starts with any stderr line: "
          f"{sum(bool(r['stderr_lines']) for r in runs)}; with a traceback: "
          f"{sum(any('Traceback' in x for x in r['stderr_lines']) for r in runs)}; pages answered: "
          f"{sum(r['answered'] for r in runs)}; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
