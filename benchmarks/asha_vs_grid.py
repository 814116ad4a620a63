"""Does per-cell TPE + ASHA save compute at equal quality? Grid against the project's searcher, side by side.

The search space is real: all-MiniLM-L6-v2 cut at k=3, STS-B train capped (full dev), lr x warmup_ratio x
weight_decay, several epochs, every trial trained with the tuning seed.

1. The grid, run for real through the launcher (Ray, MLflow): every configuration to the last epoch. Its
   per-epoch dev curves are what a trial of that configuration reports.
2. The project's per-cell TPE + ASHA, run for real through the launcher once, with as many trials as the
   grid has configurations (the default tune.sampler_seed, 1000). Its curves must equal the grid's for the same
   configuration (training is seeded per round); the script prints the largest difference.
3. Because they are equal, the same searcher and pruner (`StudyState`: seeded TPE, successive halving in
   the cell) replay on the grid's measured curves for many searcher seeds and for other grace / reduction /
   startup settings, on 2 slots in simulated time (every trial-epoch costs one unit here: one k, one data
   size). The real run's own settings are replayed too, printed beside the real run.

Printed, side by side: the dev of the configuration each selects (the best trial run to the end), and the
trial-epochs each used to first reach the grid's best dev - 0.3 (a trial-epoch whose dev is at least that), as
a fraction of the full grid's trial-epochs.

    python benchmarks/asha_vs_grid.py --data-dir ../shared/data            # about 20 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from orchestrator.config import parse_study
from orchestrator.journal import Journal, Outcome, TrialRecord
from orchestrator.launch import connect_ray, launch
from orchestrator.plan import build_plan
from orchestrator.study_state import StudyState

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SPACE = {"lr": [2e-5, 6e-5, 2e-4], "warmup_ratio": [0.0, 0.1, 0.3], "weight_decay": [0.0, 0.1]}
NAMES = tuple(SPACE)
TUNE_SEED = 10_000


def study(name: str, args, folder: Path, tune: dict | None) -> dict:
    base = {"name": name, "trainable": "finetune", "task": "stsb", "model": MODEL,
            "train": {"epochs": args.epochs, "batch_size": 32, "max_seq_length": 128, "loss": "cosine_mse"},
            "data": {"max_train_samples": args.train_samples}, "data_dir": args.data_dir,
            "resources": {"cpu": 1}, "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}
    if tune is None:  # the grid: every configuration is a cell, trained once with the tuning seed
        return {**base, "ablate": {"layer": args.layer, **SPACE}, "replicate": {"seeds": [TUNE_SEED]}}
    return {**base, "ablate": {"layer": args.layer}, "replicate": {"seeds": [0]},
            "tune": {"params": {k: {"choice": v} for k, v in SPACE.items()}, "seed": TUNE_SEED, **tune}}


def run_study(spec: dict, folder: Path) -> tuple[float | None, list[dict]]:
    """Launch (or, when `folder` kept it from an earlier run, resume: nothing finished reruns) a
    study; its wall time (None when resumed: not the whole study's) and its journal."""
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    journal = folder / "studies" / spec["name"] / "journal.jsonl"
    resumed = journal.exists()
    started = time.perf_counter()
    launch(path, storage=folder / "studies", progress=False, resume=resumed)
    return (None if resumed else time.perf_counter() - started), Journal(journal).events()


def curves_of(events: list[dict], metric: str, phase: str) -> tuple[dict, list[tuple[tuple, float]]]:
    """Per trial key: (its configuration, its dev per epoch); and every trial-epoch's (configuration,
    dev) in the order it arrived. TPE may draw a configuration twice: each draw is its own trial."""
    issued = {e["key"]: e for e in events if e.get("event") == "issued" and e["phase"] == phase}
    trials = {k: (tuple(e["config"][n] for n in NAMES), []) for k, e in issued.items()}
    order = []
    for event in events:
        if event.get("event") == "result" and event["key"] in trials and metric in event["metrics"]:
            value = float(event["metrics"][metric])
            trials[event["key"]][1].append(value)
            order.append((trials[event["key"]][0], value))
    return trials, order


def wall(seconds: float | None) -> str:
    return "not timed (resumed from an earlier run)" if seconds is None else f"{seconds / 60:.1f} min"


def first_reach(order: list[float], target: float) -> int | None:
    """Trial-epochs spent up to and including the first one whose dev reaches the target."""
    return next((i + 1 for i, value in enumerate(order) if value >= target), None)


def selected(trials: dict[str, tuple[tuple, list[float]]], epochs: int) -> float:
    """The best dev of the trials that ran to the end: what the cell's replicates would be trained with."""
    return max(max(curve) for _, curve in trials.values() if len(curve) == epochs)


def replay(spec: dict, grid: dict[tuple, list[float]], slots: int, base_dir: Path,
           folder: Path) -> tuple[list[float], float]:
    """The project's searcher and pruner driven by the grid's measured curves: each slot asks the
    study state for the next trial, and every time unit each running trial reports one epoch.
    Returns every trial-epoch's dev in order, and the dev of the trial the state selects."""
    plan = build_plan(parse_study(spec), base_dir)
    journal_path = Path(tempfile.mkstemp(suffix=".jsonl", dir=folder)[1])
    state = StudyState(plan, Journal(journal_path))
    running: dict[str, list] = {}
    order: list[float] = []
    while True:
        while len(running) < slots:
            record = state.next_trial()
            if not isinstance(record, TrialRecord) or record.phase != "tune":
                break  # running trials block the rest, or tuning is over (replicates are not compared)
            running[record.key] = [tuple(record.tuned[n] for n in NAMES), 0]
        if not running:
            best = state.best_tuned(plan.cells[0])
            return order, max(float(r[plan.metric]) for r in best.results)
        for key in list(running):  # one time unit: every running trial trains one more epoch
            config, epoch = running[key][0], running[key][1] + 1
            running[key][1] = epoch
            order.append(grid[config][epoch - 1])
            stop = state.on_result(key, {"epoch": epoch, plan.metric: order[-1]})
            if stop or epoch == plan.epochs:
                state.on_finished(key, Outcome.COMPLETED)  # stopped early: the state records it as pruned
                del running[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=1500)
    parser.add_argument("--searcher-seeds", type=int, default=20, help="replays per setting")
    parser.add_argument("--margin", type=float, default=0.3)
    parser.add_argument("--keep", help="keep the grid and the real run here; a rerun resumes them (nothing retrains)")
    args = parser.parse_args()
    args.data_dir = str(Path(args.data_dir).resolve())
    size = len(list(itertools.product(*SPACE.values())))
    default = {"trials": size, "scheduler": "asha"}  # grace, reduction and startup: the project's defaults

    connect_ray("local")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep).resolve() if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        grid_spec = study("grid", args, folder, None)
        grid_wall, grid_events = run_study(grid_spec, folder)
        metric = build_plan(parse_study(grid_spec), folder).metric
        grid_trials, grid_order = curves_of(grid_events, metric, "replicate")
        grid = {config: curve for config, curve in grid_trials.values()}
        assert len(grid) == size and all(len(c) == args.epochs for c in grid.values()), "the grid did not finish"
        best = max(max(c) for c in grid.values())
        target = best - args.margin
        total = size * args.epochs

        real_spec = study("asha", args, folder, default)
        real_wall, real_events = run_study(real_spec, folder)
        real, real_order = curves_of(real_events, metric, "tune")
        drift = max(abs(a - b) for config, curve in real.values() for a, b in zip(curve, grid[config], strict=False))
        replayed, replay_selected = replay(real_spec, grid, 2, folder, Path(tmp))

        print(f"MiniLM k={args.layer}, STS-B train capped at {args.train_samples} pairs, full dev; {size} "
              f"configurations x {args.epochs} epochs = {total} trial-epochs; metric {metric}")
        print(f"grid: best dev {best:.2f}; target (best - {args.margin}) {target:.2f}; wall {wall(grid_wall)} "
              f"on 2 slots; {sum(max(c) >= target for c in grid.values())} of {size} configurations reach the "
              f"target; in its own run order it first reached it after "
              f"{first_reach([v for _, v in grid_order], target)} trial-epochs")
        print(f"TPE + ASHA, real run (tune.sampler_seed 1000): {len(real_order)} trial-epochs, wall "
              f"{wall(real_wall)} (with one replicate run); selected dev {selected(real, args.epochs):.2f}; "
              f"first reached the target after {first_reach([v for _, v in real_order], target)} trial-epochs; "
              f"{len({c for c, _ in real.values()})} distinct configurations in {len(real)} trials; its curves differ "
              f"from the grid's by at most {drift:.4f}")
        print(f"its replay on the grid's curves: {len(replayed)} trial-epochs, selected dev {replay_selected:.2f}, "
              f"first reach after {first_reach(replayed, target)}")

        print(f"\nreplays on the grid's curves, {args.searcher_seeds} searcher seeds per setting, 2 slots; the full "
              f"grid costs {total} trial-epochs")
        print(f"{'grace':>5} {'rf':>3} {'startup':>7} {'selected dev mean/min':>21} {'trial-epochs used':>18} "
              f"{'% of grid':>9} {'to target: median':>18} {'% of grid':>9} {'reached':>8}")
        settings = [(g, rf, s) for g in (1, 2) for rf in (2, 3, 4) for s in (3, 5, 8)]
        for grace, rf, startup in settings:
            bests, used, reach = [], [], []
            for seed in range(args.searcher_seeds):
                spec = study("asha", args, folder, {**default, "grace_epochs": grace, "reduction_factor": rf,
                                                     "startup_trials": startup, "sampler_seed": 1000 + 7 * seed})
                order, chosen = replay(spec, grid, 2, folder, Path(tmp))
                bests.append(chosen)
                used.append(len(order))
                reach.append(first_reach(order, target))
            hits = [r for r in reach if r is not None]
            median = statistics.median(hits) if hits else float("nan")
            print(f"{grace:>5} {rf:>3} {startup:>7} {statistics.mean(bests):>14.2f}/{min(bests):>6.2f} "
                  f"{statistics.mean(used):>18.1f} {100 * statistics.mean(used) / total:>8.1f}% "
                  f"{median:>18.1f} {100 * median / total:>8.1f}% "
                  f"{len(hits):>4}/{len(reach)}")


if __name__ == "__main__":
    main()
