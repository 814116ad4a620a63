"""Almost Stochastic Order against the paired t-test, simulated: how often each says "cell A is better than
cell B" over n seeds, when it is not (type-I error) and when it is by a shift like a layer study's (power).

Each simulated comparison draws n seed scores (Spearman ×100) per cell: B's from N(0, sigma²), A's from
N(delta, sigma²), seed s of A and of B sharing a fraction `rho` of their noise (the same seed in both cells;
0 by default: a layer's score and another's barely move together over seeds). Each test decides in A's favour:

- ASO (reports.aso): ε_min(A, B) < τ = 0.2 at confidence 0.95 (1,000 resamples), unpaired, one-directional;
- t, two-sided (the report's †): the paired t-test over the n seeds, p < 0.05 and A's mean above B's;
- t, one-sided: the paired t-test's p < 0.05 for "A above B", the directional test ASO is closest to.

Rates are over `--comparisons` comparisons per row, ± their binomial standard error. It also times a table of
300 comparisons (5 seeds each) in one call and one call each.

    python benchmarks/aso.py [--comparisons 10000] [--rho 0.0] [--resamples 1000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import ttest_rel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reports.aso import THRESHOLD, aso  # noqa: E402

LEVEL = 0.05
SIGMAS = (0.3, 0.6, 1.0)  # seed sd of a cell's test Spearman ×100, the layer studies' ±
DELTAS = (0.0, 0.5, 1.0, 2.0)  # A's true advantage in points; 0 is a null
SEEDS = (3, 5, 10)
CHUNK = 250  # comparisons per aso call, each call with its own bootstrap seed


def draw(sigma: float, delta: float, seeds: int, rho: float, comparisons: int,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(A, B): (comparisons, seeds) scores, seed s of A and of B sharing `rho` of their noise."""
    shared = rng.normal(size=(comparisons, seeds))
    own = math.sqrt(1 - rho ** 2)
    a = delta + sigma * (rho * shared + own * rng.normal(size=(comparisons, seeds)))
    b = sigma * (rho * shared + own * rng.normal(size=(comparisons, seeds)))
    return a, b


def rejections(sigma: float, delta: float, seeds: int, rho: float, comparisons: int, resamples: int,
               seed: int = 0) -> dict[str, float]:
    """Each test's rate of deciding for A over `comparisons` simulated comparisons."""
    rng = np.random.default_rng(seed)
    a, b = draw(sigma, delta, seeds, rho, comparisons, rng)
    eps_min = np.concatenate([aso(a[start:start + CHUNK], b[start:start + CHUNK], num_bootstrap=resamples,
                                  seed=seed * 10_000 + start).eps_min for start in range(0, comparisons, CHUNK)])
    two_sided = ttest_rel(a, b, axis=1)
    one_sided = ttest_rel(a, b, axis=1, alternative="greater")
    return {"aso": float(np.mean(eps_min < THRESHOLD)),
            "t": float(np.mean((two_sided.pvalue < LEVEL) & (two_sided.statistic > 0))),
            "t_one": float(np.mean(one_sided.pvalue < LEVEL)),
            "eps_median": float(np.median(eps_min))}


def rate(found: float, comparisons: int) -> str:
    return f"{found:6.1%} ± {math.sqrt(found * (1 - found) / comparisons):4.1%}"


def time_table(resamples: int) -> tuple[float, float]:
    """Seconds for 300 comparisons of 5 seeds against 5: in one call, and one call each."""
    rng = np.random.default_rng(1)
    cells, baselines = rng.normal(size=(300, 5)), rng.normal(size=(300, 5))
    started = time.perf_counter()
    aso(cells, baselines, num_bootstrap=resamples)
    batch = time.perf_counter() - started
    started = time.perf_counter()
    for cell, baseline in zip(cells, baselines, strict=True):
        aso(cell, baseline, num_bootstrap=resamples)
    return batch, time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=10_000, help="simulated comparisons per row")
    parser.add_argument("--rho", type=float, default=0.0, help="share of seed noise A and B have in common")
    parser.add_argument("--resamples", type=int, default=1000, help="ASO's bootstrap resamples")
    args = parser.parse_args(argv)
    if args.comparisons < 1 or args.resamples < 1 or not 0 <= args.rho < 1:
        parser.error(f"--comparisons {args.comparisons} --resamples {args.resamples} --rho {args.rho}: give 1 or "
                     "more comparisons and resamples and a rho in [0, 1)")
    started = time.perf_counter()
    batch, each = time_table(args.resamples)
    print(f"300 comparisons (5 seeds against 5, {args.resamples} resamples): {batch:.2f} s in one call, "
          f"{each:.2f} s one call each")
    print(f"{args.comparisons} simulated comparisons per row, seed noise shared by A and B: rho = {args.rho}; "
          f"each test's rate of deciding A > B (ASO: eps_min < {THRESHOLD}; t: paired, p < {LEVEL}), ± its "
          "binomial standard error; delta = 0 is the type-I error")
    print(f"{'sigma':>5} {'delta':>5} {'d/sd':>5} {'n':>3} | {'ASO eps<0.2':>14} {'t two-sided':>14} "
          f"{'t one-sided':>14} | {'median eps':>10}")
    nulls: dict[str, list[float]] = {"aso": [], "t": [], "t_one": []}
    aso_nulls: dict[int, list[float]] = {n: [] for n in SEEDS}
    for row, (sigma, delta, seeds) in enumerate((s, d, n) for s in SIGMAS for d in DELTAS for n in SEEDS):
        found = rejections(sigma, delta, seeds, args.rho, args.comparisons, args.resamples, seed=row)
        if delta == 0:
            for key in nulls:
                nulls[key].append(found[key])
            aso_nulls[seeds].append(found["aso"])
        print(f"{sigma:>5.1f} {delta:>5.1f} {delta / sigma:>5.2f} {seeds:>3} | {rate(found['aso'], args.comparisons)} "
              f"{rate(found['t'], args.comparisons)} {rate(found['t_one'], args.comparisons)} | "
              f"{found['eps_median']:>10.3f}")
    by_seeds = ", ".join(f"{min(found):.1%}–{max(found):.1%} at n = {n}" for n, found in aso_nulls.items())
    print(f"type-I error, the largest over the {len(nulls['aso'])} nulls: ASO {max(nulls['aso']):.1%} ({by_seeds}), "
          f"t two-sided {max(nulls['t']):.1%}, t one-sided {max(nulls['t_one']):.1%} (a rate's standard error at "
          f"5 %: {math.sqrt(0.05 * 0.95 / args.comparisons):.1%}); {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
