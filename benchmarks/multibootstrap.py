"""The Multi-Bootstrap against the report's two separate tests, simulated: type-I error and power of a
comparison of two cells (procedures) over n paired seeds and m test pairs.

Each simulated comparison draws m test pairs: a latent similarity z, gold = z + N(0, 0.5^2), an error every
model shares, w ~ N(0, 0.4^2) per pair. Each cell is a procedure with its own errors on these pairs,
u ~ N(0, kappa^2) per pair (the same for all its seeds; drawn apart for the two cells, so on the
population of pairs they score the same and on m pairs one fits better by chance), and each of its seed runs
predicts z + w + u + q * sigma * N(0, 1) with a seed's quality q = exp(lambda * N(0, 1)) (some seeds train
better). The two cells are equal procedures (a null: a claim that one scores higher is wrong) unless the
first cell's sigma is lower (power). Tests, two-sided at 0.05, no correction (one comparison):

- seed t-test (the report's †): paired t-test over the n seeds' Spearman, the test pairs fixed;
- pair bootstrap (‡): the seed-averaged Spearman difference over resampled test pairs, the seeds fixed;
- Multi-Bootstrap (reports.multibootstrap): seeds and test pairs resampled jointly (Sellam et al. 2022).

The seed t-test answers for these m pairs, the pair bootstrap for these n seeds; a claim about the
procedures needs both sources of chance, which only the joint resampling takes.

    python benchmarks/multibootstrap.py [--comparisons 300] [--pairs 300] [--resamples 200]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import ttest_rel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reports.bootstrap import _spearman_rows, resampled_p  # noqa: E402
from reports.multibootstrap import per_seed_differences, seed_weights  # noqa: E402

LEVEL = 0.05


@dataclass(frozen=True)
class Scenario:
    name: str
    kappa: float  # sd of a cell's own errors per test pair
    quality: float  # lambda: sd of log seed quality
    sigma: float  # a seed run's own noise per pair
    better: float = 0.0  # the first cell's noise is (1 - better) times the second's: > 0 is a true difference


SCENARIOS = (
    Scenario("null: seeds differ little", 0.0, 0.0, 0.1),
    Scenario("null: seeds differ much", 0.0, 0.3, 0.15),
    Scenario("null: cells' own pair errors", 0.15, 0.0, 0.15),
    Scenario("null: both", 0.15, 0.3, 0.15),
    Scenario("effect: first cell's noise half", 0.0, 0.3, 0.15, better=0.5),
    Scenario("effect, with cells' own pair errors", 0.15, 0.3, 0.15, better=0.5),
)


def draw(scenario: Scenario, seeds: int, pairs: int, rng: np.random.Generator):
    """(gold, first cell's predictions (seeds, pairs), second's)."""
    z = rng.normal(size=pairs)
    gold = z + 0.5 * rng.normal(size=pairs)
    shared = 0.4 * rng.normal(size=pairs)
    cells = []
    for index in range(2):
        own = scenario.kappa * rng.normal(size=pairs)
        scale = scenario.sigma * (1 - scenario.better if index == 0 else 1.0)
        quality = np.exp(scenario.quality * rng.normal(size=(seeds, 1)))
        cells.append(z + shared + own + scale * quality * rng.normal(size=(seeds, pairs)))
    return gold, cells[0], cells[1]


def rejections(scenario: Scenario, seeds: int, pairs: int, comparisons: int, resamples: int,
               seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    hits = {"t": 0, "pairs": 0, "joint": 0}
    seed_sd, differences = [], []
    for _ in range(comparisons):
        gold, first, second = draw(scenario, seeds, pairs, rng)
        scores = [_spearman_rows(cell, np.tile(gold, (seeds, 1))) for cell in (first, second)]
        seed_sd.append(scores[1].std(ddof=1))
        differences.append(float(np.mean(scores[0] - scores[1])))
        hits["t"] += ttest_rel(scores[0], scores[1]).pvalue < LEVEL
        pair_index = rng.integers(0, pairs, size=(resamples, pairs))
        per_seed = per_seed_differences(first, second, gold, pair_index)  # both bootstraps share the pairs drawn
        hits["pairs"] += resampled_p(per_seed.mean(axis=1)) < LEVEL
        seed_index = rng.integers(0, seeds, size=(resamples, seeds))
        hits["joint"] += resampled_p((seed_weights(seed_index, seeds) * per_seed).sum(axis=1)) < LEVEL
    out = {name: count / comparisons for name, count in hits.items()}
    return {**out, "seed_sd": float(np.mean(seed_sd)), "difference": float(np.mean(differences)),
            "difference_sd": float(np.std(differences))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=300, help="simulated comparisons per scenario and n")
    parser.add_argument("--pairs", type=int, default=300, help="test pairs m (300: a capped STS-B test split)")
    parser.add_argument("--resamples", type=int, default=200, help="bootstrap resamples per comparison")
    parser.add_argument("--seeds", default="3,5,10", help="the n of paired seeds to simulate, comma-separated")
    args = parser.parse_args()
    if args.comparisons < 1 or args.pairs < 3 or args.resamples < 1:
        parser.error(f"--comparisons and --resamples must be at least 1 and --pairs at least 3, but got "
                     f"--comparisons={args.comparisons} --pairs={args.pairs} --resamples={args.resamples}")
    ns = [int(n) for n in args.seeds.split(",")]
    print(f"{args.comparisons} simulated comparisons per row, m = {args.pairs} test pairs, {args.resamples} resamples, "
          f"two-sided at {LEVEL}; rejection rate ± its binomial standard error. seed sd: the sd of one cell's "
          "Spearman ×100 over its seeds; Δ: the mean difference (± its sd over comparisons)")
    print(f"{'scenario':<40} {'n':>3} {'seed sd':>7} {'Δ ± sd':>13} | {'seed t-test':>13} {'pair boot.':>13} "
          f"{'Multi-Boot.':>13}")
    started = time.perf_counter()
    for index, scenario in enumerate(SCENARIOS):
        for n in ns:
            found = rejections(scenario, n, args.pairs, args.comparisons, args.resamples, seed=100 * index + n)
            rates = [f"{found[k]:>6.1%} ± {math.sqrt(found[k] * (1 - found[k]) / args.comparisons):4.1%}"
                     for k in ("t", "pairs", "joint")]
            spread = f"{found['difference']:+.2f} ± {found['difference_sd']:.2f}"
            print(f"{scenario.name:<40} {n:>3} {found['seed_sd']:>7.2f} {spread:>13} | "
                  + " ".join(f"{r:>13}" for r in rates))
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
