"""The tuning-budget table's "Rising" rule, simulated: how often it fires for a search still improving at
its last trial and for a saturated one, against the rule it replaced and two tests on the curve's end.

A cell's search is N tuning trials with a dev score each, in the order they ran. Still improving:
Optuna's TPE (the project's sampler, 3 random startup trials as `tune.startup_trials` defaults) on a
synthetic dev surface of 4 or 6 tuned parameters, 85 - 20 * sum((x - x*)^2) + N(0, 0.5^2) on the unit cube
with the optimum x* drawn per cell, which TPE is still climbing at 20 trials; and scores whose mean rises
by 1, 2 or 3 noise sd over the N trials (linear), a dial of how fast the search improves. Saturated:
random search on the same surface and independent draws of one distribution (a normal; and one with a
fifth of the trials far worse, as diverged learning rates give), where the trials' order means nothing.
Converged early: TPE on one tuned parameter, which finds the optimum within a few trials and then
scatters around it; its first (random) trials are worse, so an order test sees a rise that is over.

Rules, each at one-sided level 0.05 where it is a test:
- trend (the report's, reports.evp.still_rising): Kendall's tau of dev score on trial number, exact;
- share 10 % (the rule before): the with-replacement curve's last step over 10 % of its whole rise;
- last gain: the expected best of N draws from all N trials minus that of N - 1 draws from the first
  N - 1 (the curve's last step, with the trials in their order), against 999 random orders;
- last quarter: the same over the last quarter of the trials (N draws from all against N - N/4 from the
  first N - N/4), against 999 random orders.

    python benchmarks/rising.py [--cells 400] [--trials 20]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reports.evp import RISING_LEVEL, curve, max_probabilities, still_rising  # noqa: E402

PERMUTATIONS = 999
OLD_SHARE = 0.1


def tpe_scores(trials: int, parameters: int, seed: int, sampler: str = "tpe") -> np.ndarray:
    """Dev scores of one search (Optuna, in trial order) on the synthetic surface."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(10_000 + seed)
    optimum = rng.uniform(0.3, 0.7, parameters)

    def dev(trial) -> float:
        x = np.array([trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(parameters)])
        return float(85 - 20 * np.sum((x - optimum) ** 2) + rng.normal(0, 0.5))

    chosen = (optuna.samplers.TPESampler(seed=seed, n_startup_trials=3) if sampler == "tpe"
              else optuna.samplers.RandomSampler(seed=seed))
    study = optuna.create_study(direction="maximize", sampler=chosen)
    study.optimize(dev, n_trials=trials)
    return np.array([t.value for t in study.trials])


def drift_scores(trials: int, rise: float, rng: np.random.Generator) -> np.ndarray:
    """Scores whose mean rises linearly by `rise` noise sd from the first trial to the last."""
    return rise * np.linspace(0, 1, trials) + rng.normal(size=trials)


def bad_tail_scores(trials: int, rng: np.random.Generator) -> np.ndarray:
    """Independent draws where a fifth of the trials are far worse (diverged or too small learning rates)."""
    bad = rng.random(trials) < 0.2
    return np.where(bad, rng.normal(-5, 2, trials), rng.normal(0, 1, trials))


def old_share_rule(scores: np.ndarray) -> bool:
    """The rule before: the last trial adds over 10 % of the with-replacement curve's rise."""
    values = curve(scores).expected_best.to_numpy()
    whole = values[-1] - values[0]
    return bool(whole > 0 and values[-1] - values[-2] > OLD_SHARE * whole)


def expected_best_of_prefix(orders: np.ndarray, prefix: int, draws: int) -> np.ndarray:
    """Per row of `orders` (scores in some trial order): the expected best of `draws` draws with replacement
    from its first `prefix` trials."""
    return np.sort(orders[:, :prefix], axis=1) @ max_probabilities(prefix, draws)


def curve_end_p(scores: np.ndarray, last: int, rng: np.random.Generator) -> float:
    """One-sided permutation p of the gain the last `last` trials add to the expected best of N draws."""
    n = len(scores)
    orders = np.vstack([scores, scores[np.argsort(rng.random((PERMUTATIONS, n)), axis=1)]])
    gain = expected_best_of_prefix(orders, n, n) - expected_best_of_prefix(orders, n - last, n)
    return float((1 + np.sum(gain[1:] >= gain[0] - 1e-12)) / (1 + PERMUTATIONS))


def fires(scores: np.ndarray, rng: np.random.Generator) -> dict[str, bool]:
    n = len(scores)
    return {"trend": still_rising(scores), "share 10 %": old_share_rule(scores),
            "last gain": curve_end_p(scores, 1, rng) < RISING_LEVEL,
            "last quarter": curve_end_p(scores, max(1, n // 4), rng) < RISING_LEVEL}


def scenarios(trials: int, cells: int, cheap: int):
    """(name, kind, number of cells, draw(cell) -> scores)."""
    return [
        ("TPE, 4 tuned parameters", "improving", cells, lambda i, rng: tpe_scores(trials, 4, i)),
        ("TPE, 6 tuned parameters", "improving", cells, lambda i, rng: tpe_scores(trials, 6, i)),
        ("mean rises 1 sd (linear)", "dial", cheap, lambda i, rng: drift_scores(trials, 1.0, rng)),
        ("mean rises 2 sd (linear)", "dial", cheap, lambda i, rng: drift_scores(trials, 2.0, rng)),
        ("mean rises 3 sd (linear)", "dial", cheap, lambda i, rng: drift_scores(trials, 3.0, rng)),
        ("random search, 4 parameters", "saturated", cells, lambda i, rng: tpe_scores(trials, 4, i, "random")),
        ("independent normal draws", "saturated", cheap, lambda i, rng: rng.normal(size=trials)),
        ("independent, a fifth far worse", "saturated", cheap, lambda i, rng: bad_tail_scores(trials, rng)),
        ("TPE, 1 tuned parameter", "converged", cells, lambda i, rng: tpe_scores(trials, 1, i)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=400, help="simulated cells per Optuna scenario")
    parser.add_argument("--cheap-cells", type=int, default=4000, help="simulated cells per drawn-score scenario")
    parser.add_argument("--trials", type=int, default=20, help="completed tuning trials per cell (N)")
    args = parser.parse_args()
    if args.trials < 4:
        parser.error(f"--trials must be at least 4 (below, no order reaches p < {RISING_LEVEL}), but got "
                     f"--trials={args.trials}")
    rules = ("trend", "share 10 %", "last gain", "last quarter")
    print(f"N = {args.trials} completed trials per cell; each rule's rate of firing, ± its binomial standard error")
    print(f"{'scenario':<32} {'kind':<10} {'cells':>5} | " + " | ".join(f"{r:>13}" for r in rules))
    started = time.perf_counter()
    rates: dict[str, list[float]] = {}
    for index, (name, kind, count, draw) in enumerate(scenarios(args.trials, args.cells, args.cheap_cells)):
        rng = np.random.default_rng(index)
        hits = {rule: 0 for rule in rules}
        for i in range(count):
            for rule, fired in fires(draw(i, rng), rng).items():
                hits[rule] += fired
        shown = []
        for rule in rules:
            rate = hits[rule] / count
            shown.append(f"{rate:>6.1%} ± {math.sqrt(rate * (1 - rate) / count):4.1%}")
        rates.setdefault(kind, []).append(hits["trend"] / count)
        print(f"{name:<32} {kind:<10} {count:>5} | " + " | ".join(f"{s:>13}" for s in shown))
    improving, saturated = min(rates["improving"]), max(rates["saturated"])
    print(f"the report's rule (trend) fires in {improving:.1%} or more of the still-improving TPE cells at N = "
          f"{args.trials} (goal >= 80 %: {'met' if improving >= 0.8 else 'NOT met'}) and in {saturated:.1%} or "
          f"fewer of the saturated ones (goal <= 10 %: {'met' if saturated <= 0.1 else 'NOT met'}); "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
