"""How often the report's ≈ mark (`report.rope`: P(equivalent) ≥ 0.95 from the Bayesian correlated t-test over
seeds, reports.equivalence) calls two cells practically equivalent, against the frequentist test of equivalence,
TOST (two one-sided paired t-tests at α = 0.05: the mean difference significantly above −rope and below +rope).

Two cells over n paired seeds whose differences are normal with mean δ and sd σ (Spearman x 100 points, as the
layer studies' seeds vary), rope r. The error that matters is calling equivalent what is not: its worst case is
δ = r, on the region's edge, where either rule should say ≈ in at most 5 % of comparisons (TOST holds that by
construction). Its power is ≈ at δ = 0. Each row: the share of `--comparisons` simulated comparisons marked ≈ by
each rule, ± its binomial standard error.

    python benchmarks/equivalence.py
    python benchmarks/equivalence.py --comparisons 2000 --seeds 3,5
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy.stats import t as t_dist

from reports.equivalence import EQUIVALENT, posterior_probabilities

ALPHA = 0.05


def bayes_equivalent(differences: np.ndarray, rope: float) -> np.ndarray:
    """P(equivalent) ≥ 0.95 per row of `differences` (comparisons x seeds): posterior_probabilities, vectorised."""
    n = differences.shape[1]
    mean, sd = differences.mean(axis=1), differences.std(axis=1, ddof=1)
    scale = sd / math.sqrt(n)
    within = t_dist.cdf(rope, n - 1, mean, scale) - t_dist.cdf(-rope, n - 1, mean, scale)
    return within >= EQUIVALENT


def tost_equivalent(differences: np.ndarray, rope: float) -> np.ndarray:
    """Both one-sided paired t-tests reject at α: the mean above −rope and below +rope."""
    n = differences.shape[1]
    mean, sd = differences.mean(axis=1), differences.std(axis=1, ddof=1)
    scale = sd / math.sqrt(n)
    lower = t_dist.sf((mean + rope) / scale, n - 1)  # H0: mean <= -rope
    upper = t_dist.cdf((mean - rope) / scale, n - 1)  # H0: mean >= +rope
    return np.maximum(lower, upper) < ALPHA


def rate(marked: np.ndarray) -> tuple[float, float]:
    share = float(marked.mean())
    return share, math.sqrt(share * (1 - share) / len(marked))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comparisons", type=int, default=20_000, help="simulated comparisons per row")
    parser.add_argument("--sigmas", default="0.3,0.6,1.0", help="sd of the paired differences (points)")
    parser.add_argument("--seeds", default="3,5,10")
    parser.add_argument("--rope", type=float, default=1.0, help="the region of practical equivalence (points)")
    parser.add_argument("--deltas", default="0,0.5,1,1.5", help="true mean differences, as multiples of the rope")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.comparisons < 1 or args.rope <= 0:
        parser.error("--comparisons: at least 1; --rope: above 0")
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    check = rng.normal(0.3, 0.6, (50, 4))  # the vectorised rule is the report's, comparison for comparison
    assert np.array_equal(bayes_equivalent(check, args.rope),
                          [posterior_probabilities(row, args.rope)[1] >= EQUIVALENT for row in check])
    print(f"{args.comparisons} simulated comparisons per row; rope = {args.rope:g} points; the share marked "
          f"equivalent by the report's rule (Bayesian, P(equivalent) >= {EQUIVALENT:g}) and by TOST (alpha = "
          f"{ALPHA:g}), ± its binomial standard error; delta = rope is the worst case of a false equivalence")
    print(f"{'sigma':>5} {'delta':>5} {'n':>3} | {'report (Bayes)':>15} {'TOST':>15}")
    rows, worst = [], {"bayes": 0.0, "tost": 0.0}
    for sigma in (float(v) for v in args.sigmas.split(",")):
        for multiple in (float(v) for v in args.deltas.split(",")):
            delta = multiple * args.rope
            for n in (int(v) for v in args.seeds.split(",")):
                differences = rng.normal(delta, sigma, (args.comparisons, n))
                bayes, bayes_se = rate(bayes_equivalent(differences, args.rope))
                tost, tost_se = rate(tost_equivalent(differences, args.rope))
                if multiple >= 1:
                    worst["bayes"], worst["tost"] = max(worst["bayes"], bayes), max(worst["tost"], tost)
                rows.append({"sigma": sigma, "delta": delta, "n": n, "bayes": bayes, "tost": tost})
                print(f"{sigma:5.1f} {delta:5.2f} {n:3d} | {100 * bayes:6.1f}% ± {100 * bayes_se:4.1f}% "
                      f"{100 * tost:6.1f}% ± {100 * tost_se:4.1f}%", flush=True)
    print(f"false equivalence, the largest at delta >= rope: report {100 * worst['bayes']:.1f}%, TOST "
          f"{100 * worst['tost']:.1f}%; {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "rows": rows, "worst": worst}, f, indent=1)


if __name__ == "__main__":
    main()
