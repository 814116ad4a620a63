"""What the report's statistics cost at 300 cells: `build_report` of a synthetic study of `--rows` x `--layers`
cells (30 x 10 = 300 by default), `--seeds` replicates each, the last layer of each row its baseline, once with the
tests the report always runs (the seed t-test †, power, Holm) and once with every column a study can ask for
besides: the pair bootstrap ‡ over `--pairs` test pairs per run (predictions held in memory, so no MLflow
download is timed), practical equivalence (`report.rope`), Almost Stochastic Order (`report.aso`) and the seeds
to detect a difference (`report.detect`). Both sides write markdown, LaTeX and CSV with the figures, each from
the same start (the runs in memory) to the same end (every file written); `--repeats` turns, each side its best.

    python benchmarks/report_columns.py                       # 300 cells, 5 seeds, 1,379 pairs
    python benchmarks/report_columns.py --rows 3 --layers 4 --seeds 3 --pairs 50
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from reports.build import build_report
from reports.collect import StudyRuns


@dataclass(frozen=True)
class InMemoryRuns(StudyRuns):
    """StudyRuns whose replicates' test predictions are held here instead of in MLflow."""

    held: dict | None = None

    def predictions(self, run_id: str) -> pd.DataFrame | None:
        return (self.held or {}).get(run_id)


def synthetic_study(rows: int, layers: int, seeds: int, pairs: int, report: dict, with_predictions: bool):
    """Cells task=t × layer=l; a cell's mean rises with its layer, seeds scatter by 0.5 points; each run's
    predictions are the gold scores plus noise that shrinks with the layer (so its Spearman follows)."""
    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, pairs)
    runs, held = [], {}
    for task in range(rows):
        for layer in range(1, layers + 1):
            for seed in range(seeds):
                run_id = f"t{task}l{layer}s{seed}"
                runs.append({"run_id": run_id, "trial_key": f"t{task}-l{layer}-s{seed}",
                             "cell": f"task=t{task},layer={layer}", "phase": "replicate", "seed": seed,
                             "outcome": "completed", "status": "FINISHED", "error": None, "task": f"t{task}",
                             "layer": layer, "test_spearman": 70.0 + layer + rng.normal(0, 0.5),
                             "best_dev_spearman": 75.0 + layer + rng.normal(0, 0.5), "epoch": 2, "best_epoch": 1})
                if with_predictions:
                    held[run_id] = pd.DataFrame({"pair": np.arange(pairs), "score": gold,
                                                 "prediction": gold + rng.normal(0, 2.0 / layer, pairs)})
    return InMemoryRuns("columns", pd.DataFrame(runs), ["task", "layer"], "dev_spearman",
                        {"baseline": {"layer": "last"}, **report}, planned_seeds=seeds, held=held)


def timed(runs: StudyRuns) -> float:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        build_report(runs, Path(folder), ("markdown", "latex", "csv"))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=30, help="tasks (rows of the ablation table)")
    parser.add_argument("--layers", type=int, default=10, help="layers per task (its columns; the last: the baseline)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=1379, help="test pairs per run (STS-B test has 1,379)")
    parser.add_argument("--repeats", type=int, default=1, help="turns; each side keeps its best")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    for name in ("rows", "layers", "seeds", "pairs", "repeats"):
        if getattr(args, name) < (2 if name in ("layers", "seeds") else 1):
            parser.error(f"--{name} {getattr(args, name)}: too few")
    cells = args.rows * args.layers
    sides = {"always": (synthetic_study(args.rows, args.layers, args.seeds, args.pairs, {}, False)),
             "every column": synthetic_study(args.rows, args.layers, args.seeds, args.pairs,
                                             {"rope": 1.0, "aso": True, "detect": 1.0}, True)}
    best = {name: float("inf") for name in sides}
    for _ in range(args.repeats):
        for name, runs in sides.items():
            best[name] = min(best[name], timed(runs))
    comparisons = args.rows * (args.layers - 1)
    print(f"{cells} cells ({args.rows} rows x {args.layers} layers), {args.seeds} seeds, {comparisons} comparisons "
          f"against the baseline, {args.pairs} test pairs a run; build_report (markdown, LaTeX, CSV, figures), the "
          f"best of {args.repeats}:")
    for name, seconds in best.items():
        print(f"  {name:>12}: {seconds:7.2f} s")
    print(f"every column / always: {best['every column'] / best['always']:.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cells": cells, "seeds": args.seeds, "pairs": args.pairs,
                                               "seconds": best}, indent=1))


if __name__ == "__main__":
    main()
