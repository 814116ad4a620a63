"""The maths of a report: per-cell mean and sample std over seeds, dev-based selection, the best
test value per column, missing cells with the reason. Rendering does none of this."""

from __future__ import annotations

import math
import re

import pandas as pd
from scipy.stats import t as t_dist

from reports.collect import StudyRuns


def row_key(values: dict, axes: list[str]) -> str:
    return ", ".join(f"{values[a]}" for a in axes) if axes else "all"


def summarize(runs: StudyRuns, metric: str | None = None) -> pd.DataFrame:
    """One row per ablation cell: mean / std (ddof=1) / n of the test metric over completed
    replicate runs, the mean dev score (what selection uses), parameters, and why a cell is missing.
    Under adaptive seeds the std is over the first-stage seeds only (the stopping never selects
    them; over all n it runs low) and `dev_ci95` is Stein's interval under the two-stage rule."""
    metric = metric or runs.test_metric
    dev = f"best_{runs.metric}"
    first = first_stage_seeds(runs)
    rows = []
    replicates = runs.replicates()
    for cell, group in replicates.groupby("cell", sort=False):
        done = group[group.outcome == "completed"]
        values = done[metric].dropna() if metric in done else pd.Series(dtype=float)
        in_first = of_seeds(values, done, first)
        first_row = group.iloc[0]
        row = {axis: first_row[axis] for axis in runs.axes}
        row.update({"cell": cell, "n": int(values.size), "mean": values.mean() if values.size else math.nan,
                    "std": _std(in_first),
                    "dev": done[dev].mean() if dev in done and len(done) else math.nan,
                    "params": done["params"].mean() if "params" in done and len(done) else math.nan,
                    "seeds": sorted(int(s) for s in done.seed), "run_ids": list(done.run_id),
                    "models": sorted(p for p in done.get("model_path", pd.Series(dtype=str)).dropna())})
        if first is not None:
            row.update({"std_seeds": int(in_first.size), "std_all_seeds": _std(values)})
        if "test_pearson" in done and metric == "test_spearman":
            pearson = done["test_pearson"].dropna()
            row["pearson_mean"] = pearson.mean() if len(pearson) else math.nan
            row["pearson_std"] = _std(of_seeds(pearson, done, first))
        row["missing"] = None if values.size else _why_missing(group)
        row["degenerate"] = int(len(done) - values.size)
        spreads = _spreads(done, metric, values.index)
        row["cosine_spread"] = float(spreads.max()) if len(spreads) else math.nan
        row["caveat"] = cell_caveat(len(done), int(values.size), spreads) if values.size else None
        row["rising"] = still_rising(done)
        row["dev_ci95"] = dev_interval(done, dev, first, (runs.replicate.get("until") or {}).get("rule", "two_stage"))
        rows.append(row)
    planned = _cells_without_replicates(runs, {r["cell"] for r in rows})
    for cell, values, reason in planned:
        rows.append({**values, "cell": cell, "n": 0, "mean": math.nan, "std": math.nan, "dev": math.nan,
                     "params": math.nan, "seeds": [], "run_ids": [], "models": [], "missing": reason,
                     "rising": math.nan, "degenerate": 0, "cosine_spread": math.nan, "caveat": None})
    return pd.DataFrame(rows)


def of_seeds(values: pd.Series, done: pd.DataFrame, seeds: set[int] | None) -> pd.Series:
    """The values of the runs whose seed is in `seeds` (all of them for None)."""
    return values if seeds is None else values[done.loc[values.index, "seed"].isin(seeds)]


def _std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if values.size > 1 else math.nan


def first_stage_seeds(runs: StudyRuns) -> set[int] | None:
    """The planned seeds (`replicate.seeds`) of a study whose rule may add more (`replicate.until`);
    None for a fixed number of seeds."""
    until = runs.replicate.get("until") or {}
    if until.get("dev_ci95") is None:
        return None
    if runs.record is not None and runs.record.seeds:
        return {int(s) for s in runs.record.seeds}
    seeds = runs.replicate.get("seeds", [0])
    return set(range(seeds)) if isinstance(seeds, int) else {int(s) for s in seeds}


def dev_interval(done: pd.DataFrame, dev: str, first: set[int] | None, rule: str) -> float:
    """Half-width of the 95 % interval of the cell's mean dev score: Stein's under the two-stage rule
    (the first stage's std over all n seeds, t with k-1 degrees of freedom: exact), else Student's t
    over all n (exact for a fixed n; under the sequential rule it covers less, as the footnote says)."""
    scored = done.dropna(subset=[dev]) if dev in done else done.iloc[:0]
    devs = scored[dev].astype(float) if dev in scored else pd.Series(dtype=float)
    stage = devs[scored.seed.isin(first)] if first is not None and rule == "two_stage" else devs
    if stage.size < 2:
        return math.nan
    return float(t_dist.ppf(0.975, stage.size - 1) * stage.std(ddof=1) / math.sqrt(devs.size))


def _spreads(done: pd.DataFrame, metric: str, scored: pd.Index) -> pd.Series:
    """The cosine spread of each scored run whose split was collapsed (`test_cosine_spread`)."""
    column = metric.split("_", 1)[0] + "_cosine_spread"
    if column not in done:
        return pd.Series(dtype=float)
    return pd.to_numeric(done.loc[scored, column], errors="coerce").dropna()


def cell_caveat(completed: int, scored: int, spreads: pd.Series) -> str | None:
    """What a cell's number does not show: seeds whose encoder had collapsed (every cosine within 1e-4
    of the others: a real ranking, but of nearly identical vectors) and seeds left out as degenerate
    (no correlation, so no score: the mean is over the others). Worded so that its short form (up to
    the first " (") keeps the spread and the count."""
    parts = []
    if len(spreads):
        low, high = float(spreads.min()), float(spreads.max())
        span = scientific(high) if scientific(low) == scientific(high) else f"{scientific(low)} to {scientific(high)}"
        seeds = "" if len(spreads) == scored else f" in {len(spreads)} of {scored} seeds"
        parts.append(f"collapsed, cosine spread {span}{seeds}")
    if completed > scored:
        parts.append(f"{completed - scored} of {completed} seeds degenerate, the mean over the other {scored} "
                     "(constant output: correlation undefined)")
    return "; ".join(parts) or None


def scientific(value: float) -> str:
    """1.4e-5, not 1.4e-05."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def still_rising(done: pd.DataFrame) -> float:
    """The share of a cell's completed replicates whose best dev round was their last round: dev was
    still rising when training stopped (NaN when the runs do not say)."""
    if not len(done) or "best_epoch" not in done or "epoch" not in done:
        return math.nan
    known = done.dropna(subset=["best_epoch", "epoch"])
    if not len(known):
        return math.nan
    return float((known.best_epoch.astype(float) >= known.epoch.astype(float)).mean())


def _why_missing(group: pd.DataFrame) -> str:
    outcomes = set(group.outcome.dropna())
    if "diverged" in outcomes:
        return "diverged (loss became NaN)"
    if "failed" in outcomes:
        errors = group.error.dropna()
        return "failed: " + (errors.iloc[0][:120] if len(errors) else "see the run in MLflow")
    done = group[group.outcome == "completed"]
    flags = [c for c in ("test_degenerate", "degenerate") if c in done]
    if len(done) and any((done[c] == 1).any() for c in flags):
        return "degenerate (constant output: correlation undefined)"
    return "not finished"


# Measured by benchmarks/adaptive_seeds.py (20,000 simulated cells per regime and rule, 3 first-stage seeds, dev
# and test noise correlated 0.8): how far the std over all n seeds runs below a fixed n's (test, dev) in the
# README's regime (sigma 0.6, ±0.5, at most 10 seeds: max_seeds decides most cells) and its range over three
# regimes where max_seeds decides fewer (at most 30 seeds; ±0.75; ±1.0); how often each dev interval covered
# the true mean, over all four regimes. tests/test_benchmarks.py reruns the simulation against these.
SIMULATED = {
    "two_stage": {"test": (-0.035, -0.055, -0.082), "dev": (-0.075, -0.105, -0.149),
                  "t_cover": (0.910, 0.932), "stein_cover": (0.949, 0.952)},
    "sequential": {"test": (-0.068, -0.063, -0.080), "dev": (-0.129, -0.111, -0.143), "t_cover": (0.911, 0.944)},
}
# What the footnote quotes: the same figures as means of 20 runs of 20,000 cells each (one run's figure wanders
# by about ±0.2 points; SIMULATED's run drew high in the regimes capped at 10 seeds). Under the two-stage rule:
# docs/concepts/seeds-and-budgets.md's 20-run means. Under the sequential rule, which the docs give only as
# ranges over the regimes (test 6.7-7.9 % low, t-interval 91.4-94.5 %): 20 runs of tests/test_benchmarks.py's
# independent rewrite (generator seeds 1-20), which gives the two-stage figures above within 0.1 points.
MEAN_OF_RUNS = {
    "two_stage": {"test": (-0.039, -0.055, -0.086), "dev": (-0.079, -0.104, -0.151),
                  "t_cover": (0.909, 0.934), "stein_cover": (0.950, 0.950)},
    "sequential": {"test": (-0.072, -0.068, -0.078), "dev": (-0.132, -0.114, -0.142), "t_cover": (0.914, 0.945)},
}


def c4(n: int) -> float:
    """E[s] / σ for the sample std of n normal draws."""
    return math.sqrt(2 / (n - 1)) * math.exp(math.lgamma(n / 2) - math.lgamma((n - 1) / 2))


def _pct(value: float) -> str:
    return f"{abs(value) * 100:.1f} %"


def _span(a: float, b: float) -> str:
    low, high = sorted((abs(a), abs(b)))
    return f"{low * 100:.1f} %" if f"{low:.3f}" == f"{high:.3f}" else f"{low * 100:.1f}–{high * 100:.1f} %"


def seed_rule_note(runs: StudyRuns) -> str | None:
    """Which seed rule ran, what its std and interval are, and what the alternatives would have done
    (MEAN_OF_RUNS: benchmarks/adaptive_seeds.py's simulation, the mean of 20 runs)."""
    until = runs.replicate.get("until") or {}
    if until.get("dev_ci95") is None:
        return None
    rule = until.get("rule", "two_stage")
    first = first_stage_seeds(runs) or set()
    k = len(first)
    figures = MEAN_OF_RUNS.get(rule, MEAN_OF_RUNS["two_stage"])
    test, dev = figures["test"], figures["dev"]
    how = ("the first-stage seeds' dev spread fixed each cell's total once (two-stage rule)" if rule == "two_stage"
           else "one seed was added at a time while the dev interval was wider (sequential rule)")
    std = (f"± is the std over the {k} first-stage seeds (replicate.seeds), which no rule selects; over all n "
           f"seeds (cells.csv std_all_seeds) it ran {_pct(test[0])} low (dev {_pct(dev[0])}) in "
           f"benchmarks/adaptive_seeds.py's simulation of cells with σ 0.6, ±0.5, at most 10 seeds, and "
           f"{_span(test[1], test[2])} low (dev {_span(dev[1], dev[2])}) where max_seeds decided fewer cells "
           "(means of 20 runs)")
    if k >= 2:
        std += (f"; unbiased for what a fixed {k} seeds give, the first-stage std is itself low, as any sample std "
                f"of {k} seeds: on average c4({k}) = {c4(k):.3f} of σ, {_pct(1 - c4(k))} below it")
    if rule == "two_stage":
        interval = (f"dev_ci95 (cells.csv, status) is Stein's interval: t with {k - 1} degrees of freedom times the "
                    f"first stage's std over √n; it covered {_span(*figures['stein_cover'])} of the "
                    f"simulated means (the t-interval over all n: {_span(*figures['t_cover'])})")
    else:
        interval = (f"dev_ci95 is the t-interval over all n seeds, which covered only "
                    f"{_span(*figures['t_cover'])} of the simulated means (not 95 %)")
    return (f"seeds: adaptive, per cell, for a 95 % CI of the mean dev score of ±{until['dev_ci95']:g} points, at most "
            f"{runs.replicate.get('max_seeds')} seeds (replicate.until; dev only): {how}; n is what each cell got. "
            f"{std}. {interval}")


def stage_seed_note(runs: StudyRuns) -> str | None:
    """Which stage-seed policy the replicates ran with, when they used a shared stage."""
    replicates = runs.replicates()
    if "stage_seed" not in replicates or replicates.stage_seed.dropna().empty:
        return None
    used = replicates.dropna(subset=["stage_seed"])
    if (used.stage_seed.astype(int) == used.seed.astype(int)).all() and used.seed.nunique() > 1:
        return ("pretraining/teacher stages: one per replicate seed (stage_seed: per_seed), so mean ± std covers "
                "the stage as well")
    return (f"pretraining/teacher stages: one shared stage (stage_seed: shared, seed "
            f"{', '.join(str(int(s)) for s in sorted(used.stage_seed.unique()))}); mean ± std does not cover its "
            "variance")


def _cells_without_replicates(runs: StudyRuns, seen: set[str]) -> list[tuple[str, dict, str]]:
    """Cells of the plan with no replicate run: why (every tuning trial degenerate, failed or
    diverged, tuning still going on), or `not started` for cells with no run at all."""
    out = []
    tuning = runs.runs[runs.runs.phase == "tune"] if "phase" in runs.runs else runs.runs.iloc[:0]
    for cell, group in tuning.groupby("cell", sort=False):
        if cell in seen:
            continue
        values = {axis: group.iloc[0][axis] for axis in runs.axes}
        out.append((cell, values, tuning_skip_reason(group, f"best_{runs.metric}")))
        seen = seen | {cell}
    for cell, values in runs.planned_cells:
        if cell not in seen:
            out.append((cell, {axis: values.get(axis) for axis in runs.axes}, "not started"))
    return out


def usable_tuning(group: pd.DataFrame, dev: str) -> pd.DataFrame:
    """Tuning runs that finished with a dev score: the ones selection may choose from."""
    done = group[group.outcome == "completed"]
    return done[pd.to_numeric(done[dev], errors="coerce").notna()] if dev in done else done.iloc[:0]


def tuning_skip_reason(group: pd.DataFrame, dev: str) -> str:
    """Why a cell's tuning left nothing to replicate, from its tuning runs' outcomes."""
    if len(usable_tuning(group, dev)):
        return "not finished"
    outcomes = group.outcome.fillna("running")
    degenerate = int((outcomes == "completed").sum())  # completed without a dev score: constant embeddings
    counts = {"degenerate": degenerate, "diverged": int((outcomes == "diverged").sum()),
              "failed": int((outcomes == "failed").sum()), "pruned": int((outcomes == "pruned").sum())}
    unfinished = len(group) - sum(counts.values())
    if unfinished:
        return "not finished"
    only = [name for name, count in counts.items() if count == len(group)]
    if only:
        return f"skipped: every tuning trial {only[0]}"
    return "skipped: no tuning trial finished with a dev score (" + ", ".join(
        f"{count} {name}" for name, count in counts.items() if count) + ")"


def dev_selected(summary: pd.DataFrame, row_axes: list[str], column_axis: str,
                 mode: str = "max") -> dict[str, object]:
    """Per row, the column value with the best mean dev score (test never looks in)."""
    chosen = {}
    for key, group in row_groups(summary, row_axes):
        group = group.dropna(subset=["dev"])
        if len(group):
            best = group["dev"].idxmin() if mode == "min" else group["dev"].idxmax()
            chosen[key] = group.loc[best, column_axis]
    return chosen


def best_per_column(summary: pd.DataFrame, row_axes: list[str], column_axis: str) -> set[str]:
    """Cells holding the best test mean of their column; with a single row, the best of the row. A
    column with one filled cell has no best (a layer only the deeper model has)."""
    rows = list(row_groups(summary, row_axes))
    valid = summary.dropna(subset=["mean"])
    if not len(valid):
        return set()
    if len(rows) == 1:
        return {valid.loc[valid["mean"].idxmax(), "cell"]}
    return {group.loc[group["mean"].idxmax(), "cell"] for _, group in valid.groupby(column_axis) if len(group) > 1}


def row_groups(summary: pd.DataFrame, row_axes: list[str]):
    """(row key, that row's cells) in order of appearance; one row `all` without row axes."""
    if not row_axes:
        yield "all", summary
        return
    for values, group in summary.groupby(row_axes, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        yield row_key(dict(zip(row_axes, values, strict=True)), row_axes), group


SUITE_METRICS = (("STS12", "sts12"), ("STS13", "sts13"), ("STS14", "sts14"), ("STS15", "sts15"), ("STS16", "sts16"),
                 ("STS-B", "stsb"), ("SICK-R", "sick"), ("Avg.", "suite_avg"))


def suite_summary(runs: StudyRuns) -> pd.DataFrame:
    """The STS suite per cell, when the runs scored it: one row per (cell, set) with mean / std /
    n of test Spearman over completed replicates, and `best` on the best mean of each set."""
    columns = {label: f"test_{name}_spearman" for label, name in SUITE_METRICS}
    if runs.runs.empty or columns["Avg."] not in runs.runs:
        return pd.DataFrame()
    parts = []
    for label, metric in columns.items():
        part = summarize(runs, metric)[["cell", "mean", "std", "n"]].assign(set=label)
        if part["mean"].notna().any():
            part["best"] = part["mean"] == part["mean"].max()
        else:
            part["best"] = False
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


CYCLE_METRIC = re.compile(r"^cycle(\d+)_(partner_)?(cross_)?(dev|test)_spearman$")


def cycle_summary(runs: StudyRuns) -> pd.DataFrame:
    """Distillation per cycle, when the runs logged it: one row per (cell, encoder, split, cycle)
    with mean / std / n of Spearman over completed replicates. `encoder` is bi or cross, with a
    `partner ` prefix for the second pair of a mutual run."""
    found = [(c, CYCLE_METRIC.match(c)) for c in runs.runs.columns] if not runs.runs.empty else []
    rows = []
    for column, match in ((c, m) for c, m in found if m):
        cycle, partner, cross, split = int(match[1]), match[2], match[3], match[4]
        encoder = ("partner " if partner else "") + ("cross" if cross else "bi")
        for _, row in summarize(runs, column).iterrows():
            rows.append({"cell": row["cell"], "encoder": encoder, "split": split, "cycle": cycle,
                         "mean": row["mean"], "std": row["std"], "n": row["n"]})
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    order = {cell: i for i, cell in enumerate(dict.fromkeys(frame["cell"]))}
    return frame.sort_values(["cell", "encoder", "split", "cycle"], key=lambda c: c.map(order) if c.name == "cell"
                             else c, kind="stable").reset_index(drop=True)
