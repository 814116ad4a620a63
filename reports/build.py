"""A study's report folder: report.md (tables and figures), one .tex per table, runs.csv,
stats.csv and the figures (PNG and PDF)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from reports.aggregate import (
    SUITE_METRICS,
    best_per_column,
    cycle_summary,
    dev_selected,
    row_groups,
    seed_rule_note,
    stage_seed_note,
    suite_summary,
    summarize,
)
from reports.collect import StudyRuns
from reports.plots import layer_plot, pareto_plot
from reports.render import BEST_NOTE, N_NOTE, SELECTED_NOTE, Cell, Grid, to_latex, to_markdown
from reports.significance import BOOTSTRAP_SAMPLES, CORRECTIONS, LEVEL, compare_to_baseline, marks

PROVENANCE = "provenance.json"  # what produced the report and from which store: for verify
FORMATS = ("markdown", "latex", "csv")


def layout(runs: StudyRuns) -> tuple[list[str], str | None]:
    """(row axes, column axis): `report.columns` or `layer` across, the other axes down."""
    column = runs.report.get("columns") or ("layer" if "layer" in runs.axes else (runs.axes[-1] if runs.axes else None))
    rows = runs.report.get("rows") or [a for a in runs.axes if a != column]
    return rows, column


def _sort_key(value):
    return (0, value, "") if isinstance(value, int | float) else (1, 0, str(value))


def ablation_grid(runs: StudyRuns, summary: pd.DataFrame, stats: pd.DataFrame, rows: list[str], column: str,
                  decimals: int) -> Grid:
    selected = dev_selected(summary, rows, column)
    best = best_per_column(summary, rows, column)
    significant = marks(stats, float(runs.report.get("alpha", LEVEL))) if not stats.empty else {}
    columns = sorted(summary[column].unique(), key=_sort_key)
    grid_rows = []
    for key, group in row_groups(summary, rows):
        cells = []
        for value in columns:
            match = group[group[column] == value]
            if not len(match):
                cells.append(Cell(note="not in the study"))
                continue
            row = match.iloc[0]
            cells.append(Cell(mean=row["mean"], std=row["std"], bold=row["cell"] in best,
                              selected=selected.get(key) == value, mark=significant.get(row["cell"], ""),
                              note=row["missing"] if isinstance(row["missing"], str) else None,
                              n=int(row["n"]), planned=runs.planned_seeds))
        grid_rows.append((key, cells))
    metric = runs.test_metric.replace("test_", "test ")
    title = f"{runs.name}: {metric} ×100 by {column} (mean ± std over seeds)"
    notes = [BEST_NOTE, SELECTED_NOTE, N_NOTE] + _significance_notes(runs, stats) + [
        note for note in (seed_rule_note(runs), stage_seed_note(runs)) if note]
    return Grid(title, ", ".join(rows) or "", [f"{column} {c}" for c in columns], grid_rows, notes, decimals)


def _significance_notes(runs: StudyRuns, stats: pd.DataFrame) -> list[str]:
    baseline = runs.report.get("baseline")
    if not baseline or stats.empty:
        return []
    what = ", ".join(f"{k}={v}" for k, v in baseline.items())
    alpha = float(runs.report.get("alpha", LEVEL))
    correction = runs.report.get("correction", "holm")
    paired = int(stats.paired_p.notna().sum())
    resampled = int(stats.bootstrap_p.notna().sum())
    corrected = (f"{CORRECTIONS[correction]}-corrected over the table's comparisons ({paired} paired, "
                 f"{resampled} bootstrap)" if correction != "none" else "uncorrected")
    notes = [f"† p < {alpha} against the baseline ({what}) of the row, paired over seeds (t-test; Wilcoxon "
             f"signed-rank with 6 or more seeds); ‡ p < {alpha}, paired bootstrap over test pairs "
             f"({BOOTSTRAP_SAMPLES} resamples); p-values {corrected}; raw and corrected ones in stats.csv"]
    refused = stats.dropna(subset=["bootstrap_refused"]) if "bootstrap_refused" in stats else stats.iloc[:0]
    if len(refused):
        notes.append(f"no bootstrap for {', '.join(refused.cell)}: {refused.bootstrap_refused.iloc[0]}")
    return notes


def headline_grid(runs: StudyRuns, summary: pd.DataFrame, rows: list[str], decimals: int) -> Grid | None:
    """The paper's table: per row the dev-selected layer k, the truncated model's parameters,
    test Spearman/Pearson at k, the same at the last layer, and the difference."""
    if "layer" not in runs.axes or runs.test_metric != "test_spearman":
        return None
    selected = dev_selected(summary, rows, "layer")
    out = []
    for key, group in row_groups(summary, rows):
        if key not in selected:
            continue
        at_k = group[group.layer == selected[key]].iloc[0]
        last = group[group.layer == group.layer.max()].iloc[0]
        delta = at_k["mean"] - last["mean"]
        out.append((key, [Cell(text=str(selected[key])),
                          Cell(text="—" if math.isnan(at_k["params"]) else f"{at_k['params'] / 1e6:.1f}"),
                          Cell(mean=at_k["mean"], std=at_k["std"]),
                          Cell(mean=at_k.get("pearson_mean", math.nan), std=at_k.get("pearson_std", math.nan)),
                          Cell(text=str(last["layer"])), Cell(mean=last["mean"], std=last["std"]),
                          Cell(text="—" if math.isnan(delta) else f"{delta:+.{decimals}f}")]))
    if not out:
        return None
    return Grid(f"{runs.name}: dev-selected layer against the last layer (test ×100)", ", ".join(rows) or "",
                ["k (dev)", "params (M)", "Spearman at k", "Pearson at k", "last", "Spearman at last", "Δ"],
                out, [], decimals)


def suite_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """The SentEval-style table (STS12-16, STS-B, SICK-R, average) of every cell, as miCSE's."""
    suite = suite_summary(runs)
    if suite.empty:
        return None
    labels = [label for label, _ in SUITE_METRICS]
    rows = []
    for cell, group in suite.groupby("cell", sort=False):
        by_set = {r["set"]: r for _, r in group.iterrows()}
        rows.append((cell, [Cell(mean=by_set[label]["mean"], std=by_set[label]["std"], bold=bool(by_set[label]["best"]))
                            for label in labels]))
    return Grid(f"{runs.name}: STS suite, test Spearman ×100 of cosine (mean ± std over seeds)", "cell", labels,
                rows, [BEST_NOTE, "STS12-16: all subsets of a year pooled (SentEval's \"all\"); STS-B and SICK-R: "
                       "test splits"], decimals)


def cycle_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """Distillation: bi- and cross-encoder Spearman on dev after every cycle (and on test when the
    runs asked for the per-cycle test diagnostic)."""
    cycles = cycle_summary(runs)
    if cycles.empty:
        return None
    numbers = sorted(cycles["cycle"].unique())
    rows = []
    for (cell, encoder, split), group in cycles.groupby(["cell", "encoder", "split"], sort=False):
        by_cycle = {r["cycle"]: r for _, r in group.iterrows()}
        rows.append((f"{cell} · {encoder} · {split}",
                     [Cell(mean=by_cycle[c]["mean"], std=by_cycle[c]["std"]) if c in by_cycle else Cell(text="—")
                      for c in numbers]))
    return Grid(f"{runs.name}: Spearman ×100 after each distillation cycle (mean ± std over seeds)",
                "cell · encoder · split", [f"cycle {c}" for c in numbers], rows,
                ["the run's own test figure is the dev-selected cycle's (best bi-encoder dev), scored once; test "
                 "rows appear only with the diagnostic test_every_round: true and are never used"], decimals)


def tuning_grid(runs: StudyRuns) -> Grid | None:
    tuning = runs.runs[runs.runs.phase == "tune"]
    if tuning.empty:
        return None
    rows = []
    dev = f"best_{runs.metric}"
    for cell, group in tuning.groupby("cell", sort=False):
        done = group[group.outcome == "completed"]
        best = done.loc[done[dev].idxmax()] if len(done) and dev in done else None
        rows.append((cell, [Cell(text=str(len(group))), Cell(text=str(int((group.outcome == "pruned").sum()))),
                            Cell(text=str(int(group.outcome.isin(["failed", "diverged"]).sum()))),
                            Cell(text="—" if best is None else f"{best['lr']:.2e}"),
                            Cell(mean=math.nan if best is None else best[dev])]))
    tuning_seeds = sorted({int(s) for s in tuning.seed.dropna()})
    replicate_seeds = sorted({int(s) for s in runs.replicates().seed.dropna()})
    overlap = set(tuning_seeds) & set(replicate_seeds)
    note = (f"tuning trials trained with seed {', '.join(map(str, tuning_seeds))}; replicates with "
            f"{', '.join(map(str, replicate_seeds)) or 'none yet'}" +
            ("; disjoint, so no replicate reruns a tuning trial" if not overlap else
             f"; seeds {sorted(overlap)} were used by both (a study launched before tuning seeds were separate)"))
    return Grid(f"{runs.name}: tuning per cell (dev only)", "cell",
                ["trials", "pruned", "failed", "best lr", f"best {runs.metric}"], rows, [note], 2)


def producer() -> dict[str, str]:
    """The package version and git commit that produce a report (it carries them)."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("ablation-orchestrator")
    except PackageNotFoundError:
        package = "0+unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"version": package, "commit": commit}


def build_report(runs: StudyRuns, out: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write the report folder; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    decimals = int(runs.report.get("decimals", 2))
    rows, column = layout(runs)
    summary = summarize(runs)
    baseline_spec = runs.report.get("baseline") or {}
    stats = pd.DataFrame()
    if column and baseline_spec.get(column) is not None and not summary.empty:
        stats = compare_to_baseline(runs, summary, rows, column, baseline_spec[column], runs.test_metric,
                                    correction=runs.report.get("correction", "holm"))

    grids: list[tuple[str, Grid]] = []
    if column and not summary.empty:
        grids.append(("ablation", ablation_grid(runs, summary, stats, rows, column, decimals)))
        headline = headline_grid(runs, summary, rows, decimals)
        if headline is not None:
            grids.append(("headline", headline))
    for name, extra in (("suite", suite_grid(runs, decimals)), ("cycles", cycle_grid(runs, decimals))):
        if extra is not None:
            grids.append((name, extra))
    tuning = tuning_grid(runs)
    if tuning is not None:
        grids.append(("tuning", tuning))

    figures = []
    if column and not summary.empty and summary["mean"].notna().any():
        selected = dev_selected(summary, rows, column)
        figures.append(layer_plot(summary, rows, column, selected, runs.test_metric, out / "score_by_layer"))
        if summary["params"].notna().any():
            figures.append(pareto_plot(summary, rows, runs.test_metric, out / "score_by_params"))
        written += [p for stem in figures for p in (stem.with_suffix(".png"), stem.with_suffix(".pdf"))]

    runs.runs.to_csv(out / "runs.csv", index=False)  # always: every table is recomputed from it
    written.append(out / "runs.csv")
    if not summary.empty:
        traced = summary.assign(run_ids=summary.run_ids.map(";".join),
                                models=summary.get("models", pd.Series([[]] * len(summary))).map(";".join))
        traced.to_csv(out / "cells.csv", index=False)
        written.append(out / "cells.csv")
    if not stats.empty:
        stats.to_csv(out / "stats.csv", index=False)
        written.append(out / "stats.csv")
    if "latex" in formats:
        for name, grid in grids:
            path = out / f"{name}.tex"
            path.write_text(to_latex(grid, f"{runs.name}-{name}"))
            written.append(path)
    provenance = producer()
    sources = runs.sources or [{"study": runs.name, "tracking_uri": runs.tracking_uri, "study_uid": runs.study_uid}]
    (out / PROVENANCE).write_text(json.dumps({**provenance, "study": runs.name, "tracking_uri": runs.tracking_uri,
                                              "study_uid": runs.study_uid, "sources": sources,
                                              "formats": list(formats)}, indent=1))
    written.append(out / PROVENANCE)
    markdown = [f"# {runs.name}", "", f"Produced by ablation-orchestrator {provenance['version']} (commit "
                f"{provenance['commit'][:12]}); `orchestrator verify` recomputes every number from MLflow.", "",
                f"{len(runs.replicates())} replicate runs, "
                f"{int((runs.runs.phase == 'tune').sum())} tuning runs. Data: `runs.csv` (one row per run), "
                "`cells.csv` (one row per cell)" + (", `stats.csv` (tests against the baseline)." if not stats.empty
                                                    else "."), ""]
    for _, grid in grids:
        markdown += [to_markdown(grid), ""]
    for stem in figures:
        markdown += [f"![{stem.name}]({stem.name}.png)", ""]
    if "markdown" in formats:
        (out / "report.md").write_text("\n".join(markdown))
        written.append(out / "report.md")
    return written
