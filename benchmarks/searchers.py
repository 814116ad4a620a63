"""Which searcher should a cell's tuning use? Five methods on one real search space, whole-run numbers.

The space is real: all-MiniLM-L6-v2 cut at k=3, STS-B train capped (full dev and test), lr x warmup_ratio x
weight_decay x pooling (36 configurations), several epochs, every trial trained with the tuning seed.

1. The grid runs for real through the launcher (Ray, MLflow): every configuration to the last epoch, its
   test scored once. Its per-epoch dev curves are what a tuning trial of that configuration reports:
   training is seeded per round (`--check-real` runs TPE + ASHA for real once and prints the largest
   difference between its curves and the grid's).
2. The project's own searcher and pruner (`StudyState`: per-cell Optuna sampler, successive halving in the
   cell) replay on the grid's measured curves, 2 slots in simulated time, for many searcher seeds
   (`tune.sampler_seed`), at several trial budgets:
     random       `sampler: random, scheduler: none`   random search, every trial to the end
     random+ASHA  `sampler: random, scheduler: asha`
     TPE          `sampler: tpe, scheduler: none`
     TPE+ASHA     `sampler: tpe, scheduler: asha`      the project's defaults (grace 1, reduction 3, startup 3)
     TPE+ASHA*    the best grace x reduction x startup, chosen on other searcher seeds than those reported
   and the grid itself (every configuration once, to the end).

Printed per method and budget, over the reported searcher seeds: the whole run's trial-epochs (and % of the
grid's), simulated wall time on 2 slots, the selected configuration's dev gap to the grid's best (mean and
worst), the probability that it is within the margin of the grid's best, and its test score (what the grid
measured for that configuration: the same seed trains the same model).

    python benchmarks/searchers.py --data-dir ../shared/data --keep /tmp/searchers   # about 30 min on 2 cores
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
from pathlib import Path

import yaml

from orchestrator.config import parse_study
from orchestrator.journal import Journal, Outcome, TrialRecord
from orchestrator.launcher import connect_ray, launch
from orchestrator.planning import build_plan
from orchestrator.study_state import StudyState

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SPACE = {"lr": [2e-5, 6e-5, 2e-4], "warmup_ratio": [0.0, 0.1], "weight_decay": [0.0, 0.1],
         "pooling": ["mean", "cls", "max"]}
NAMES = tuple(SPACE)
TUNE_SEED = 10_000
DEFAULT = {"grace_epochs": 1, "reduction_factor": 3, "startup_trials": 3}
METHODS = {"random": {"sampler": "random", "scheduler": "none"},
           "random+ASHA": {"sampler": "random", "scheduler": "asha"},
           "TPE": {"sampler": "tpe", "scheduler": "none"},
           "TPE+ASHA": {"sampler": "tpe", "scheduler": "asha"}}


def study(name: str, args, folder: Path, tune: dict | None) -> dict:
    base = {"name": name, "trainable": "finetune", "task": "stsb", "model": MODEL,
            "train": {"epochs": args.epochs, "batch_size": 32, "max_seq_length": 128, "loss": "cosine_mse"},
            "data": {"max_train_samples": args.train_samples}, "data_dir": args.data_dir,
            "resources": {"cpu": 1}, "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}
    if tune is None:  # the grid: every configuration is a cell, trained once with the tuning seed, test scored
        return {**base, "ablate": {"layer": args.layer, **SPACE}, "replicate": {"seeds": [TUNE_SEED]}}
    return {**base, "ablate": {"layer": args.layer}, "replicate": {"seeds": [0]},
            "tune": {"params": {k: {"choice": v} for k, v in SPACE.items()}, "seed": TUNE_SEED, **tune}}


def run_study(spec: dict, folder: Path) -> list[dict]:
    """Launch (or, when `folder` kept it from an earlier run, resume: nothing finished reruns) a study;
    its journal's events."""
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    journal = folder / "studies" / spec["name"] / "journal.jsonl"
    launch(path, storage=folder / "studies", progress=False, resume=journal.exists())
    return Journal(journal).events()


def curves_of(events: list[dict], metric: str, phase: str) -> dict[str, tuple[tuple, list[float], float | None]]:
    """Per trial key: its configuration, its dev per epoch, and its test score when one was measured."""
    issued = {e["key"]: e for e in events if e.get("event") == "issued" and e["phase"] == phase}
    trials = {k: [tuple(e["config"][n] for n in NAMES), [], None] for k, e in issued.items()}
    test = metric.replace("dev_", "test_", 1)
    for event in events:
        if event.get("event") == "result" and event["key"] in trials:
            if metric in event["metrics"]:
                trials[event["key"]][1].append(float(event["metrics"][metric]))
            if test in event["metrics"]:
                trials[event["key"]][2] = float(event["metrics"][test])
    return {k: tuple(v) for k, v in trials.items()}


def replay(spec: dict, grid: dict[tuple, list[float]], slots: int, base_dir: Path,
           folder: Path) -> tuple[int, int, tuple | None]:
    """The project's searcher and pruner driven by the grid's measured curves: each slot asks the study
    state for the next trial, and every time unit each running trial reports one epoch. Returns the
    trial-epochs used, the time units taken, and the configuration the state selects (None: none
    finished)."""
    plan = build_plan(parse_study(spec), base_dir)
    journal_path = Path(tempfile.mkstemp(suffix=".jsonl", dir=folder)[1])
    state = StudyState(plan, Journal(journal_path))
    running: dict[str, list] = {}
    used = units = 0
    while True:
        while len(running) < slots:
            record = state.next_trial()
            if not isinstance(record, TrialRecord) or record.phase != "tune":
                break  # running trials block the rest, or tuning is over (replicates are not compared)
            running[record.key] = [tuple(record.tuned[n] for n in NAMES), 0]
        if not running:
            journal_path.unlink()
            best = state.best_tuned(plan.cells[0])
            return used, units, None if best is None else tuple(best.tuned[n] for n in NAMES)
        units += 1
        for key in list(running):  # one time unit: every running trial trains one more epoch
            config, epoch = running[key][0], running[key][1] + 1
            running[key][1] = epoch
            used += 1
            stop = state.on_result(key, {"epoch": epoch, plan.metric: grid[config][epoch - 1]})
            if stop or epoch == plan.epochs:
                state.on_finished(key, Outcome.COMPLETED)  # stopped early: the state records it as pruned
                del running[key]


def summarize(runs: list[tuple[int, int, tuple | None]], grid: dict, tests: dict, best: float,
              margin: float) -> dict:
    chosen = [c for _, _, c in runs if c is not None]
    gaps = [best - max(grid[c]) for c in chosen]
    return {"epochs": statistics.mean(u for u, _, _ in runs), "units": statistics.mean(t for _, t, _ in runs),
            "gap": statistics.mean(gaps), "worst": max(gaps),
            "within": sum(g <= margin + 1e-9 for g in gaps) / len(runs),
            "test": statistics.mean(tests[c] for c in chosen), "none": len(runs) - len(chosen)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("ORCHESTRATOR_DATA_DIR", "../shared/data"),
                        help="the data folder (default: $ORCHESTRATOR_DATA_DIR, else ../shared/data)")
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=1500)
    parser.add_argument("--searcher-seeds", type=int, default=30, help="replays per method and budget (reported)")
    parser.add_argument("--budgets", default="9,18,36", help="trials per run, comma-separated")
    parser.add_argument("--margin", type=float, default=0.3)
    parser.add_argument("--check-real", action="store_true", help="also run TPE + ASHA for real once (~10 min)")
    parser.add_argument("--keep", help="keep the grid (and the real run) here; a rerun resumes them (nothing retrains)")
    args = parser.parse_args()
    args.data_dir = str(Path(args.data_dir).resolve())
    budgets = [int(b) for b in args.budgets.split(",")]
    size = len(list(itertools.product(*SPACE.values())))

    connect_ray("local")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep).resolve() if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        grid_spec = study("grid", args, folder, None)
        events = run_study(grid_spec, folder)
        metric = build_plan(parse_study(grid_spec), folder).metric
        measured = curves_of(events, metric, "replicate")
        grid = {config: curve for config, curve, _ in measured.values()}
        tests = {config: test for config, _, test in measured.values()}
        assert len(grid) == size and all(len(c) == args.epochs and tests[k] is not None for k, c in grid.items()), \
            "the grid did not finish"
        best_config = max(grid, key=lambda c: max(grid[c]))
        best = max(grid[best_config])
        total = size * args.epochs
        print(f"MiniLM k={args.layer}, STS-B train capped at {args.train_samples} pairs, full dev and test; {size} "
              f"configurations ({' x '.join(f'{k} {v}' for k, v in SPACE.items())}) x {args.epochs} epochs = "
              f"{total} trial-epochs; metric {metric}")
        print(f"grid: best dev {best:.2f} at {dict(zip(NAMES, best_config, strict=True))}, test "
              f"{tests[best_config]:.2f}; {sum(best - max(c) <= args.margin for c in grid.values())} of {size} "
              f"configurations within {args.margin} of it; dev range {min(max(c) for c in grid.values()):.2f}"
              f"-{best:.2f}")

        if args.check_real:
            real = curves_of(run_study(study("real", args, folder, {"trials": size, "scheduler": "asha"}), folder),
                             metric, "tune")
            drift = max(abs(a - b) for config, curve, _ in real.values()
                        for a, b in zip(curve, grid[config], strict=False))
            print(f"TPE + ASHA run for real ({size} trials): its dev curves differ from the grid's by at most "
                  f"{drift:.4f}")

        def runs(tune: dict, seeds: range) -> list:
            return [replay(study("r", args, folder, {**tune, "sampler_seed": 1000 + 7 * s}), grid, 2, folder,
                           Path(tmp)) for s in seeds]

        reported, selection = range(args.searcher_seeds), range(500, 500 + args.searcher_seeds)
        sweep = [{"grace_epochs": g, "reduction_factor": rf, "startup_trials": st}
                 for g in (1, 2) for rf in (2, 3, 4) for st in (3, 5, 8)]
        setting_scores = []
        for setting in sweep:  # the best setting at the full budget, on searcher seeds that are not reported
            s = summarize(runs({**METHODS["TPE+ASHA"], **setting, "trials": size}, selection), grid, tests, best,
                          args.margin)
            setting_scores.append((-s["within"], s["epochs"], setting))
        best_setting = min(setting_scores, key=lambda t: t[:2])[2]
        methods = {**{name: {**tune, **DEFAULT} for name, tune in METHODS.items()},
                   "TPE+ASHA*": {**METHODS["TPE+ASHA"], **best_setting}}
        print(f"TPE+ASHA* = grace {best_setting['grace_epochs']}, reduction {best_setting['reduction_factor']}, "
              f"startup {best_setting['startup_trials']}: the most often within {args.margin} (then the fewest "
              f"trial-epochs) of {len(sweep)} settings at {size} trials, on {len(selection)} other searcher seeds")

        print(f"\nreplays on the grid's curves, {len(reported)} searcher seeds each, 2 slots; the grid: {total} "
              f"trial-epochs, {total // 2} time units, gap 0, test {tests[best_config]:.2f}")
        header = (f"{'method':<12}{'trials':>7}{'trial-epochs':>13}{'% grid':>7}{'time':>6}{'gap mean':>9}"
                  f"{'worst':>7}{f'P(<={args.margin})':>10}{'test':>7}")
        print(header)
        table = {}
        for trials in budgets:
            for name, tune in methods.items():
                s = table[name, trials] = summarize(runs({**tune, "trials": trials}, reported), grid, tests, best,
                                                    args.margin)
                print(f"{name:<12}{trials:>7}{s['epochs']:>13.1f}{100 * s['epochs'] / total:>6.0f}%{s['units']:>6.1f}"
                      f"{s['gap']:>9.2f}{s['worst']:>7.2f}{s['within']:>10.2f}{s['test']:>7.2f}"
                      + (f"  ({s['none']} runs selected nothing)" if s["none"] else ""))
        print(f"{'grid':<12}{size:>7}{total:>13.1f}{100:>6.0f}%{total / 2:>6.1f}{0:>9.2f}{0:>7.2f}{1:>10.2f}"
              f"{tests[best_config]:>7.2f}")
        print()
        for trials in budgets:
            top = max(methods, key=lambda n: (table[n, trials]["within"], -table[n, trials]["epochs"]))
            cheapest = min(methods, key=lambda n: table[n, trials]["epochs"])
            print(f"at {trials} trials: most often within {args.margin}: {top} ({table[top, trials]['within']:.2f}, "
                  f"{table[top, trials]['epochs']:.1f} trial-epochs); cheapest: {cheapest} "
                  f"({table[cheapest, trials]['epochs']:.1f} trial-epochs, {table[cheapest, trials]['within']:.2f})")
        always = [(s["epochs"], name, trials) for (name, trials), s in table.items() if s["within"] >= 1.0]
        if always:
            epochs, name, trials = min(always)
            print(f"cheapest within {args.margin} of the grid's best for every searcher seed: {name} at {trials} "
                  f"trials ({epochs:.1f} trial-epochs, {100 * epochs / total:.0f} % of the grid's)")
        else:
            print(f"no method and budget is within {args.margin} of the grid's best for every searcher seed")


if __name__ == "__main__":
    main()
