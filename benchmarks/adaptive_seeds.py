"""Adaptive seeds, simulated: what each stopping rule does to the reported std and the dev interval.

Each simulated cell draws seed-level dev scores from N(mu, sigma) and a test score per seed that
shares a fraction `rho` of its noise with dev (a seed that is lucky on dev is partly lucky on test).
The rules of `orchestrator.study.seed_rules` decide how many seeds each cell gets; a fixed n is the
reference. Per regime (sigma, target, max_seeds) and rule it prints:

- the mean seeds and how often the cap `max_seeds` decided them;
- the bias of two std estimators against what a fixed number of seeds gives (a sample std is low by
  c4(n) at any fixed n: about 0.89 at n = 3, 0.97 at n = 10; the bias printed is on top of that):
  `all n`, the std over every seed of the cell, and `first`, the std over the first-stage seeds only
  (the planned `replicate.seeds`, which every rule always runs, so the stopping cannot select them);
- how often the dev interval covers the true mean: the t-interval over all n seeds and, for the
  two-stage rule, Stein's interval (the first stage's std over all n seeds: t_{k-1} s_k / sqrt(n)).

    python benchmarks/adaptive_seeds.py [--cells 20000] [--first 3] [--rho 0.8]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.study.seed_rules import ci95_half, seeds_needed, stein_half, wants_another  # noqa: E402


@dataclass(frozen=True)
class Regime:
    name: str
    sigma: float  # the seed-to-seed std of a cell's dev and test score
    target: float  # until.dev_ci95
    max_seeds: int


# the README's regime (the cap decides most cells) and three where it decides fewer (only sigma / target
# and max_seeds matter: the rules are scale-free)
REGIMES = (Regime("README: sigma 0.6, ±0.5, max 10", 0.6, 0.5, 10),
           Regime("sigma 0.6, ±0.5, max 30", 0.6, 0.5, 30),
           Regime("sigma 0.6, ±0.75, max 10", 0.6, 0.75, 10),
           Regime("sigma 0.6, ±1.0, max 10", 0.6, 1.0, 10))


def c4(n: int) -> float:
    """E[s] / sigma for n normal draws."""
    return math.sqrt(2 / (n - 1)) * math.exp(math.lgamma(n / 2) - math.lgamma((n - 1) / 2))


def seeds_taken(rule: str | None, dev: np.ndarray, first: int, target: float, max_seeds: int) -> int:
    """How many seeds the rule gives a cell whose seeds would score `dev` in order."""
    if rule is None:
        return first
    if rule == "two_stage":  # the total is fixed once, by the first stage (what wants_another applies)
        return seeds_needed(list(dev[:first]), target, max_seeds)
    n = first
    while n < max_seeds and wants_another(rule, list(dev[:n]), first, target, max_seeds)[0]:
        n += 1
    return n


def simulate(rule: str | None, regime: Regime, cells: int, first: int, rho: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    sigma, n_max = regime.sigma, regime.max_seeds
    used, capped, covered_t, covered_stein = [], 0, 0, 0
    std = {(split, how): [] for split in ("dev", "test") for how in ("all", "first")}
    for _ in range(cells):
        shared = rng.normal(0, 1, n_max)
        dev = sigma * shared
        test = sigma * (rho * shared + math.sqrt(1 - rho ** 2) * rng.normal(0, 1, n_max))
        n = seeds_taken(rule, dev, first, regime.target, n_max)
        used.append(n)
        capped += n == n_max and n > first
        for split, values in (("dev", dev), ("test", test)):
            std[split, "all"].append(np.std(values[:n], ddof=1) / sigma)
            std[split, "first"].append(np.std(values[:first], ddof=1) / sigma)
        covered_t += abs(dev[:n].mean()) <= ci95_half(list(dev[:n]))
        covered_stein += abs(dev[:n].mean()) <= stein_half(list(dev[:first]), n)
    expected_all = float(np.mean([c4(n) for n in used]))
    out = {"seeds": float(np.mean(used)), "capped": capped / cells, "t_coverage": covered_t / cells,
           "stein_coverage": covered_stein / cells}
    for (split, how), values in std.items():
        reference = expected_all if how == "all" else c4(first)
        out[f"{split}_{how}_bias"] = float(np.mean(values)) / reference - 1
        out[f"{split}_{how}_noise"] = float(np.std(values))  # how much one cell's std wanders (in sigma)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20_000)
    parser.add_argument("--first", type=int, default=3)
    parser.add_argument("--rho", type=float, default=0.8, help="share of dev noise a seed's test score shares")
    args = parser.parse_args()
    print(f"{args.cells} simulated cells per regime and rule, {args.first} first-stage seeds, dev-test noise "
          f"correlation {args.rho}. std bias: the mean std / sigma against a fixed n's (all n: c4(n) at each "
          f"cell's n; first: c4({args.first})); noise: the std of one cell's std / sigma")
    print(f"{'regime':<33} {'rule':<10} {'seeds':>5} {'capped':>6} | {'test std: all n':>15} {'first':>6} "
          f"{'noise all/first':>15} | {'dev std: all n':>14} {'first':>6} | {'t-CI cover':>10} {'Stein':>6}")
    for regime in REGIMES:
        for rule in ("two_stage", "sequential", None):
            if rule is None and regime is not REGIMES[0]:
                continue  # a fixed n does not depend on the regime
            found = simulate(rule, regime, args.cells, args.first, args.rho)
            stein = f"{found['stein_coverage']:.3f}" if rule == "two_stage" else "—"
            noise = f"{found['test_all_noise']:.2f}/{found['test_first_noise']:.2f}"
            print(f"{regime.name if rule is not None else '(any)':<33} {rule or f'fixed {args.first}':<10} "
                  f"{found['seeds']:>5.2f} {found['capped']:>6.0%} | {found['test_all_bias']:>+15.1%} "
                  f"{found['test_first_bias']:>+6.1%} {noise:>15} | {found['dev_all_bias']:>+14.1%} "
                  f"{found['dev_first_bias']:>+6.1%} | {found['t_coverage']:>10.3f} {stein:>6}")


if __name__ == "__main__":
    main()
