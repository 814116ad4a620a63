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
    replicate runs, the mean dev score (what selection uses), parameters, and why a cell is missing."""
    metric = metric or runs.test_metric
    dev = f"best_{runs.metric}"
    rows = []
    replicates = runs.replicates()
    for cell, group in replicates.groupby("cell", sort=False):
        done = group[group.outcome == "completed"]
        values = done[metric].dropna() if metric in done else pd.Series(dtype=float)
        first = group.iloc[0]
        row = {axis: first[axis] for axis in runs.axes}
        row.update({"cell": cell, "n": int(values.size), "mean": values.mean() if values.size else math.nan,
                    "std": values.std(ddof=1) if values.size > 1 else math.nan,
                    "dev": done[dev].mean() if dev in done and len(done) else math.nan,
                    "params": done["params"].mean() if "params" in done and len(done) else math.nan,
                    "seeds": sorted(int(s) for s in done.seed), "run_ids": list(done.run_id),
                    "models": sorted(p for p in done.get("model_path", pd.Series(dtype=str)).dropna())})
        if "test_pearson" in done and metric == "test_spearman":
            row["pearson_mean"] = done["test_pearson"].mean() if len(done) else math.nan
            row["pearson_std"] = done["test_pearson"].std(ddof=1) if len(done) > 1 else math.nan
        row["missing"] = None if values.size else _why_missing(group)
        row["rising"] = still_rising(done)
        devs = done[dev].dropna() if dev in done else pd.Series(dtype=float)
        row["dev_ci95"] = (float(t_dist.ppf(0.975, devs.size - 1) * devs.std(ddof=1) / math.sqrt(devs.size))
                           if devs.size >= 2 else math.nan)
        rows.append(row)
    planned = _cells_without_replicates(runs, {r["cell"] for r in rows})
    for cell, values, reason in planned:
        rows.append({**values, "cell": cell, "n": 0, "mean": math.nan, "std": math.nan, "dev": math.nan,
                     "params": math.nan, "seeds": [], "run_ids": [], "models": [], "missing": reason,
                     "rising": math.nan})
    return pd.DataFrame(rows)


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
        return "degenerate (constant embeddings: correlation undefined)"
    return "not finished"


def seed_rule_note(runs: StudyRuns) -> str | None:
    """Which seed rule ran, and what adaptive seeds do to the std (measured by
    benchmarks/adaptive_seeds.py: 20,000 simulated cells, 3 first seeds, at most 10)."""
    until = runs.replicate.get("until") or {}
    if until.get("dev_ci95") is None:
        return None
    rule = until.get("rule", "two_stage")
    how = ("the first seeds' dev spread fixed each cell's total once (two-stage rule; Stein's interval covers "
           "95 %); the std it reports runs about 3 % below a fixed n's" if rule == "two_stage" else
           "seeds were added one at a time while the dev CI was wider (sequential rule): it stops on a small "
           "spread, so the std runs about 7 % low and the dev CI covers about 91 %, not 95 %")
    return (f"seeds: adaptive, per cell, for a 95 % CI of the mean dev score of ±{until['dev_ci95']:g} points, at "
            f"most {runs.replicate.get('max_seeds')} seeds (replicate.until; dev only): {how} "
            "(benchmarks/adaptive_seeds.py); n is what each cell got, cells.csv has each dev_ci95")


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
