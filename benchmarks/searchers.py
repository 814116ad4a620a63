"""Which searcher should a cell's tuning use? Optuna's samplers and pruners, whole-run numbers, on several problems.

By default (a few minutes on 2 cores) three simulated problems, each one cell whose trials report a dev score per
epoch (9 epochs) from a known surface, so the selected configuration's true score is known:
  lr x warmup     lr {loguniform: [1e-5, 1e-3]} x warmup_ratio {uniform: [0, 0.3]}: a tilted quadratic ridge
  lr + pooling    lr {loguniform: [1e-5, 1e-3]} and pooling from 4 choices, each with its own best lr
  grid            lr 6 values x warmup_ratio 3 values x pooling 3 values (54 configurations): discrete
A configuration's dev curve rises to its level, faster for a larger lr (so the first epochs favour large rates
that end lower: pruning can be misled), with noise of sd 0.4 fixed per configuration and epoch (a seeded
trial reports the same curve every time). The project's own searcher and pruner (`StudyState`: each cell's
Optuna sampler and pruner, as a launch builds them) run each problem, 2 slots in simulated time, for many
searcher seeds (`tune.sampler_seed`): every `tune.sampler` with `scheduler: none`, and TPE and random search
with `scheduler: asha` and `hyperband` (grace 1, reduction 3, startup 3: the defaults). A budget of N trials
is the run's first N trials (one run per seed at the largest budget; with pruning, the first N trials' rungs
also saw the concurrent later trials). Printed per problem, method and budget over the seeds: the selected
configuration's gap to the surface's best (its true final score, not the noisy one it was chosen by), mean and
worst; the share of seeds within the margin; trial-epochs as % of N full trials. A sampler that cannot search
a space is refused at validate, as in a study, and shown as n/a.

    python benchmarks/searchers.py                                          # about 5 min on 2 cores

`--real` runs the earlier real problem instead (about 30 min on 2 cores): all-MiniLM-L6-v2 cut at k=3, STS-B
train capped (full dev and test), lr x warmup_ratio x weight_decay x pooling (36 configurations), 4 epochs,
every trial trained with the tuning seed.

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
     GP, QMC, brute force  `sampler: gp | qmc | bruteforce, scheduler: none` (CMA-ES: the space is lists only)
     TPE+ASHA*    the best grace x reduction x startup, chosen on other searcher seeds than those reported
   and the grid itself (every configuration once, to the end).

Printed per method and budget, over the reported searcher seeds: the whole run's trial-epochs (and % of the
grid's), simulated wall time on 2 slots, the selected configuration's dev gap to the grid's best (mean and
worst), the probability that it is within the margin of the grid's best, and its test score (what the grid
measured for that configuration: the same seed trains the same model).

    python benchmarks/searchers.py --real --data-dir ../shared/data --keep /tmp/searchers   # about 30 min
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.study.config import parse_study
from orchestrator.study.journal import Journal, Outcome, ReadOnlyJournal, TrialRecord
from orchestrator.study.plan import Cell, StudyPlan, build_plan
from orchestrator.study.state import StudyState
from search_spaces.optuna_samplers import space_problems
from search_spaces.params import parse_tuned

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SPACE = {"lr": [2e-5, 6e-5, 2e-4], "warmup_ratio": [0.0, 0.1], "weight_decay": [0.0, 0.1],
         "pooling": ["mean", "cls", "max"]}
NAMES = tuple(SPACE)
TUNE_SEED = 10_000
DEFAULT = {"grace_epochs": 1, "reduction_factor": 3, "startup_trials": 3}
METHODS = {"random": {"sampler": "random", "scheduler": "none"},
           "random+ASHA": {"sampler": "random", "scheduler": "asha"},
           "TPE": {"sampler": "tpe", "scheduler": "none"},
           "TPE+ASHA": {"sampler": "tpe", "scheduler": "asha"},
           "GP": {"sampler": "gp", "scheduler": "none"},
           "QMC": {"sampler": "qmc", "scheduler": "none"},
           "brute force": {"sampler": "bruteforce", "scheduler": "none"}}


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
    from orchestrator.run.launcher import launch

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


# --- simulated problems: known surfaces, many samplers -----------------------------------------------------------

SIM_EPOCHS = 9
SIM_METHODS = {"random": ("random", "none"), "TPE": ("tpe", "none"), "GP": ("gp", "none"),
               "CMA-ES": ("cmaes", "none"), "QMC": ("qmc", "none"), "brute force": ("bruteforce", "none"),
               "random+ASHA": ("random", "asha"), "random+HB": ("random", "hyperband"),
               "TPE+ASHA": ("tpe", "asha"), "TPE+HB": ("tpe", "hyperband")}
POOLING_LR = {"mean": (80.0, -4.0), "cls": (78.5, -3.5), "max": (79.5, -4.3), "mean_sqrt_len": (79.8, -3.9)}
GRID_POOLING = {"mean": 0.0, "cls": -1.5, "max": -0.5}


def ridge(lr: float, warmup: float) -> float:
    """A tilted quadratic ridge in log lr and warmup: best 80 at lr 1.6e-4, warmup 0.1."""
    u, v = math.log10(lr) + 3.8, (warmup - 0.1) / 0.1
    return 80.0 - 6 * u * u - 1.5 * v * v - 3 * u * v


@dataclass(frozen=True)
class Problem:
    name: str
    space: dict  # tune.params as a study file writes them
    level: Callable[[dict], float]  # a configuration's dev score after the last epoch, without noise
    best: float  # the surface's best level over the space

    def dev(self, config: dict, epoch: int) -> float:
        """The dev score a seeded trial reports: rising to its level, faster for a larger lr; noise fixed per
        configuration and epoch."""
        rate = 0.3 + 0.25 * (math.log10(config["lr"]) + 5)
        noise = random.Random(f"{self.name}|{sorted(config.items())}|{epoch}").gauss(0, 0.4)
        level = self.level(config)
        return level - (level - 30) * math.exp(-rate * epoch) + noise


def _dense_best(level: Callable[[dict], float], pooling: list[str] | None, warmup: bool) -> float:
    lrs = [10 ** (-5 + 2 * i / 400) for i in range(401)]
    warmups = [0.3 * j / 200 for j in range(201)] if warmup else [0.1]
    return max(level({"lr": lr, "warmup_ratio": w, **({"pooling": p} if p else {})})
               for lr in lrs for w in warmups for p in (pooling or [None]))


def ridge_level(config: dict) -> float:
    return ridge(config["lr"], config["warmup_ratio"])


def pooled_level(config: dict) -> float:
    """Each pooling its own best lr and its own best score: best 80 with mean pooling at lr 1e-4."""
    top, best_lr = POOLING_LR[config["pooling"]]
    return top - 7 * (math.log10(config["lr"]) - best_lr) ** 2


def grid_level(config: dict) -> float:
    return ridge(config["lr"], config["warmup_ratio"]) + GRID_POOLING[config["pooling"]]


def _problems() -> dict[str, Problem]:
    grid = {"lr": [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4], "warmup_ratio": [0.0, 0.1, 0.2], "pooling": list(GRID_POOLING)}
    grid_best = max(grid_level(dict(zip(grid, values, strict=True))) for values in itertools.product(*grid.values()))
    return {"lr x warmup": Problem("lr x warmup", {"lr": {"loguniform": [1e-5, 1e-3]},
                                                   "warmup_ratio": {"uniform": [0.0, 0.3]}},
                                   ridge_level, _dense_best(ridge_level, None, True)),
            "lr + pooling": Problem("lr + pooling", {"lr": {"loguniform": [1e-5, 1e-3]}, "pooling": list(POOLING_LR)},
                                    pooled_level, _dense_best(pooled_level, list(POOLING_LR), False)),
            "grid": Problem("grid", grid, grid_level, grid_best)}


PROBLEMS = _problems()


def simulated_plan(problem: Problem, tune: dict) -> StudyPlan:
    """A one-cell plan of the problem's space, as `build_plan` makes it, with no model or data behind it."""
    study = parse_study({"name": "simulated", "model": "simulated", "train": {"epochs": SIM_EPOCHS},
                         "tune": {"params": problem.space, "seed": TUNE_SEED, **DEFAULT, **tune}})
    tuned = {name: parse_tuned(f"tune.params.{name}", raw) for name, raw in problem.space.items()}
    return StudyPlan(study, (Cell(0, {}),), tuned, (0,), {}, "dev_spearman", "max", SIM_EPOCHS)


def simulate(problem_name: str, method: str, trials: int, seed: int, slots: int = 2) -> list[tuple]:
    """One run of the project's searcher and pruner on a simulated problem: per trial in the order issued, (its
    epochs, whether it completed, its best dev, its configuration's true level)."""
    problem = PROBLEMS[problem_name]
    sampler, scheduler = SIM_METHODS[method]
    plan = simulated_plan(problem, {"sampler": sampler, "scheduler": scheduler, "trials": trials,
                                    "sampler_seed": 1000 + 7 * seed})
    with tempfile.TemporaryDirectory() as folder:
        state = StudyState(plan, ReadOnlyJournal(Path(folder) / "journal.jsonl"))  # nothing to resume: no writes
        running: dict[str, int] = {}
        while True:
            while len(running) < slots:
                record = state.next_trial()
                if not isinstance(record, TrialRecord) or record.phase != "tune":
                    break
                running[record.key] = 0
            if not running:
                break
            for key in list(running):  # one time unit: every running trial trains one more epoch
                epoch = running[key] = running[key] + 1
                stop = state.on_result(key, {"epoch": epoch, "dev_spearman": problem.dev(state.records[key].tuned,
                                                                                         epoch)})
                if stop or epoch == SIM_EPOCHS:
                    state.on_finished(key, Outcome.COMPLETED)  # stopped early: the state records it as pruned
                    del running[key]
        records = [state.records[f"c0-t{n}"] for n in range(trials)]
        return [(len(r.results), r.outcome == Outcome.COMPLETED, max(x["dev_spearman"] for x in r.results),
                 problem.level(r.tuned)) for r in records]


def _simulate(task: tuple) -> tuple:
    started = time.process_time()
    return task, simulate(*task), time.process_time() - started


def refusal(problem: Problem, method: str, trials: int) -> str | None:
    tuned = {name: parse_tuned(f"tune.params.{name}", raw) for name, raw in problem.space.items()}
    problems = space_problems(SIM_METHODS[method][0], trials, tuned)
    return "n/a: " + ("continuous ranges" if SIM_METHODS[method][0] == "bruteforce" else "lists of values only") \
        if problems else None


def at_budget(run: list[tuple], budget: int, best: float) -> tuple[float, int] | None:
    """(the gap of the configuration the first `budget` trials select, their trial-epochs); None: none completed."""
    first = run[:budget]
    done = [t for t in first if t[1]]
    if not done:
        return None
    return best - max(done, key=lambda t: t[2])[3], sum(t[0] for t in first)


def simulated(seeds: int, budgets: list[int], margin: float, jobs: int) -> None:
    largest = max(budgets)
    tasks = [(p, m, largest, s) for p, problem in PROBLEMS.items() for m in SIM_METHODS
             if refusal(problem, m, largest) is None for s in range(seeds)]
    started = time.time()
    with ProcessPoolExecutor(max_workers=jobs, initializer=_one_thread) as pool:
        done = {task: (run, cpu) for task, run, cpu in pool.map(_simulate, tasks)}
    print(f"{len(PROBLEMS)} simulated problems, {SIM_EPOCHS} epochs a trial, 2 slots; {seeds} searcher seeds per "
          f"method; budgets {', '.join(map(str, budgets))} trials (the first N of a {largest}-trial run); margin "
          f"{margin} dev points; {time.time() - started:.0f} s wall on {jobs} processes")
    for name, problem in PROBLEMS.items():
        print(f"\n{name}: {problem.space}; best level {problem.best:.2f}")
        head = "".join(f"{f'N={b}: gap':>13}{'worst':>7}{f'P<={margin}':>8}{'ep%':>5}" for b in budgets)
        print(f"{'method':<12}{head}{'s/run':>7}")
        for method in SIM_METHODS:
            why = refusal(problem, method, largest)
            if why is not None:
                print(f"{method:<12}{why:>{33 * len(budgets) - 10}}")
                continue
            runs = [done[name, method, largest, s] for s in range(seeds)]
            cells = []
            for budget in budgets:
                scored = [at_budget(run, budget, problem.best) for run, _ in runs]
                gaps = [g for g, _ in filter(None, scored)]
                epochs = statistics.mean(e for _, e in filter(None, scored))
                cells.append(f"{statistics.mean(gaps):>13.2f}{max(gaps):>7.2f}"
                             f"{sum(g <= margin for g in gaps) / len(scored):>8.2f}"
                             f"{100 * epochs / (budget * SIM_EPOCHS):>4.0f}%")
            print(f"{method:<12}{''.join(cells)}{statistics.mean(cpu for _, cpu in runs):>7.2f}")


def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("ORCHESTRATOR_DATA_DIR", "../shared/data"),
                        help="the data folder (default: $ORCHESTRATOR_DATA_DIR, else ../shared/data)")
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=1500)
    parser.add_argument("--searcher-seeds", type=int, help="runs per method (reported; default 10, --real 30)")
    parser.add_argument("--budgets", help="trials per run, comma-separated (default 8,16; --real 9,18,36)")
    parser.add_argument("--margin", type=float, help="dev points from the best that count as found (default 0.5; "
                                                     "--real 0.3)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulated runs side by side")
    parser.add_argument("--real", action="store_true", help="the real MiniLM grid instead (~30 min)")
    parser.add_argument("--check-real", action="store_true", help="with --real: also run TPE + ASHA for real once "
                                                                  "(~10 min)")
    parser.add_argument("--keep", help="keep the grid (and the real run) here; a rerun resumes them (nothing retrains)")
    args = parser.parse_args()
    if not args.real:
        simulated(args.searcher_seeds or 10, [int(b) for b in (args.budgets or "8,16").split(",")],
                  0.5 if args.margin is None else args.margin, args.jobs)
        return
    args.searcher_seeds = args.searcher_seeds or 30
    args.margin = 0.3 if args.margin is None else args.margin
    args.data_dir = str(Path(args.data_dir).resolve())
    budgets = [int(b) for b in (args.budgets or "9,18,36").split(",")]
    size = len(list(itertools.product(*SPACE.values())))

    from orchestrator.run.ray_session import connect_ray

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
