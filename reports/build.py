"""A study's report folder: report.md (tables and figures), one .tex per table, runs.csv,
stats.csv and the figures (PNG and PDF)."""

from __future__ import annotations

import json
import math
import numbers
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
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
    tuning_skip_reason,
    usable_tuning,
)
from reports.bootstrap import BOOTSTRAP_SAMPLES
from reports.captions import (
    axes_label,
    caption,
    cell_labels,
    collapse_n,
    constants_phrase,
    shows_n,
    test_metric_phrase,
    values_label,
    varying,
)
from reports.captions import labels as report_labels
from reports.collect import StudyRuns
from reports.compute import compute_grid
from reports.diagnostics import diagnostics_grid
from reports.equivalence import add_equivalence, equivalence_grid, equivalence_marks, equivalence_note
from reports.evp import budget_grid, budget_plot
from reports.labels import axis_label, format_value, in_sentence, metric_label, value_label
from reports.latex import latex_document, to_latex
from reports.layer_scores import every_layer_grid, every_size_grid, layer_size_grid
from reports.pareto import frontier_figure, frontier_grid
from reports.plots import layer_plot, pareto_plot
from reports.power import add_power, attach_power_note
from reports.provenance import provenance_lines, record_provenance
from reports.render import N_NOTE, Cell, Grid, Note, markdown_notes, to_markdown
from reports.render import _number as text_of
from reports.significance import (
    CORRECTIONS,
    LEVEL,
    MIN_SEEDS,
    SEED_TESTS,
    compare_to_baseline,
    comparisons_factor,
    marks,
    reachable,
    smallest_p,
)
from reports.stochastic_order import add_aso, aso_grid

BEST_NOTE = "bold: the best test mean of the column"
PROVENANCE = "provenance.json"  # what produced the report and from which store: for verify
FORMATS = ("markdown", "latex", "csv")


def layout(runs: StudyRuns) -> tuple[list[str], str | None]:
    """(row axes, column axis): `report.columns` or `layer` across, the other axes down; an axis
    with one value is no row (the caption names it)."""
    column = runs.report.get("columns") or ("layer" if "layer" in runs.axes else (runs.axes[-1] if runs.axes else None))
    rows = runs.report.get("rows") or [a for a in runs.axes if a != column]
    return varying(runs, rows), column


def label_of(runs: StudyRuns, name) -> str:
    """An axis as tables and plots show it (`report.labels`, else `Layer` for `layer`)."""
    return axis_label(name, report_labels(runs))


def row_label(runs: StudyRuns, group: pd.DataFrame, rows: list[str]) -> str:
    """A row's label: its axis values (`all-MiniLM-L6-v2`), or the metric when there is one row."""
    if rows:
        return values_label(runs, group.iloc[0], rows)
    return metric_label(runs.test_metric, report_labels(runs), split=False)


def _sort_key(value):
    """Numbers in numeric order (numpy's too: 2 before 10), then names alphabetically."""
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return (0, float(value), "") if is_number else (1, 0.0, str(value))


def ablation_grid(runs: StudyRuns, summary: pd.DataFrame, stats: pd.DataFrame, rows: list[str], column: str,
                  decimals: int) -> Grid:
    selected = dev_selected(summary, rows, column, runs.mode)
    best = best_per_column(summary, rows, column)
    significant = marks(stats, float(runs.report.get("alpha", LEVEL))) if not stats.empty else {}
    equivalent = equivalence_marks(stats)
    columns = sorted(summary[column].unique(), key=_sort_key)
    grid_rows = []
    for key, group in row_groups(summary, rows):
        cells = []
        for value in columns:
            match = group[group[column] == value]
            if not len(match):  # two models of different depths (`layer: all`): the shallower one ends earlier
                numeric = all(_sort_key(v)[0] == 0 for v in [value, *group[column]])
                deeper = column == "layer" and numeric and _sort_key(value) > max(map(_sort_key, group[column]))
                cells.append(Cell(note="beyond the model's last layer" if deeper else "not in the study"))
                continue
            row = match.iloc[0]
            rising = RISING if row.get("rising", math.nan) > 0.5 else ""
            cells.append(Cell(mean=row["mean"], std=row["std"], bold=row["cell"] in best,
                              selected=selected.get(key) == value,
                              mark=significant.get(row["cell"], "") + equivalent.get(row["cell"], "") + rising,
                              note=cell_note(row),
                              n=int(row["n"]), planned=runs.planned_seeds))
        grid_rows.append((row_label(runs, group, rows), cells))
    grid_rows, seeds = collapse_n(grid_rows)
    across, down = in_sentence(label_of(runs, column)), in_sentence(axes_label(runs, rows))
    name, where = test_metric_phrase(runs)
    title = caption(f"{name} ×100{where} by {across}, mean ± std {seeds}", constants_phrase(runs, column))
    one_row = len(grid_rows) == 1
    notes = [Note("bold: the best test mean" + (f" (the best {across})" if one_row else
                                                f" of each {across} (the best {down} there)"),
                  f"bold: best {across}" if one_row else f"bold: best per {across}"),
             Note(f"underlined: the dev-selected {across}" + ("" if one_row else f" for each {down}") +
                  " (selection uses dev only)", "underlined: dev-selected")]
    if shows_n(grid_rows):
        notes.append(Note(N_NOTE, "n: seeds completed"))
    notes += _significance_notes(runs, stats, significant, rows, column)
    equivalence = equivalence_note(stats, baseline_phrase(runs, rows, column)) if equivalent else None
    notes += [equivalence] if equivalence else []
    notes += [note for note in (rising_note(runs, summary), _short(seed_rule_note(runs), "n: adaptive seeds per cell"),
                                _short(stage_seed_note(runs), "pretraining/teacher stage shared by the seeds"))
              if note]
    return Grid(title, axes_label(runs, rows), [value_label(c, report_labels(runs)) for c in columns], grid_rows, notes,
                decimals, transposable=True, column_axis=label_of(runs, column))


RISING = "↑"


def cell_note(row: pd.Series) -> str | None:
    """A cell's footnote: why it is empty, else what its number leaves out (degenerate seeds, a
    collapsed encoder)."""
    for reason in (row.get("missing"), row.get("caveat")):
        if isinstance(reason, str):
            return reason
    return None


def _short(full: str | None, short: str) -> Note | None:
    """A footnote of aggregate's with its short line (the stage line only for a shared stage)."""
    if not full:
        return None
    return Note(full, short if "shared" not in short or "stage_seed: shared" in full else None)


def rising_note(runs: StudyRuns, summary: pd.DataFrame) -> Note | None:
    """Counts the cells whose dev score was still rising at their last round (not converged)."""
    rising = summary[summary.get("rising", pd.Series(dtype=float)) > 0.5] if "rising" in summary else summary.iloc[:0]
    if not len(rising):
        return None
    round_ = runs.round_name
    single = "epoch" in runs.runs and runs.replicates().get("epoch", pd.Series(dtype=float)).max() == 1
    return Note(f"{RISING} not converged: in most seeds the best dev {round_} was the last {round_}, so dev was "
                f"still rising when training stopped ({len(rising)} of {len(summary)} cells); more {round_}s may "
                "change these numbers" + (f" (with one {round_} per trial convergence cannot be seen)" if single
                                          else ""),
                f"{RISING} not converged")


def baseline_phrase(runs: StudyRuns, rows: list[str], column: str) -> str:
    """`layer 6`, `the last layer`, `the last layer of the same model`: what a row is tested against."""
    wanted = (runs.report.get("baseline") or {}).get(column)
    across = in_sentence(label_of(runs, column))
    if wanted != "last":
        return f"{across} {value_label(wanted, report_labels(runs))}"
    return f"the last {across}"  # of the row's own model: where rows differ in depth, each its own


SHORT_TESTS = {"t": "t-test", "wilcoxon": "Wilcoxon test", "permutation": "sign-flip test"}


def _significance_notes(runs: StudyRuns, stats: pd.DataFrame, significant: dict[str, str], rows: list[str],
                        column: str) -> list[Note | str]:
    baseline = runs.report.get("baseline")
    if not baseline or stats.empty:
        return []
    what = ", ".join(f"{k}={v}" for k, v in baseline.items())
    alpha = float(runs.report.get("alpha", LEVEL))
    correction = runs.report.get("correction", "holm")
    test = runs.report.get("seed_test", "t")
    paired = int(stats.paired_p.notna().sum())
    resampled = int(stats.bootstrap_p.notna().sum())
    corrected = (f"{CORRECTIONS[correction]}-corrected over the table's m comparisons ({paired} paired, "
                 f"{resampled} bootstrap)" if correction != "none" else "uncorrected")
    shown = [mark for mark in "†‡" if any(mark in m for m in significant.values())]
    tests = {"†": f"seed {SHORT_TESTS[test]}", "‡": "test-pair bootstrap"}
    against = baseline_phrase(runs, rows, column)
    counts = {"†": paired, "‡": resampled}
    family = sorted({counts[m] for m in shown})
    # the family's size m, tersely: a paper's column holds 3 lines of short notes, and the two-model table's fill them
    size = " / ".join(str(counts[m]) for m in shown) if len(family) > 1 else str(family[0]) if family else ""
    method = CORRECTIONS[correction].split("–")[0]
    short = (f"{'/'.join(shown)} p\u00a0<\u00a0{alpha:g} vs. {against.removeprefix('the ')} "
             f"({' / '.join(tests[m] for m in shown)}, "
             + (f"{method}, m\u00a0=\u00a0{size}" if correction != "none" else "uncorrected") + ")" if shown else
             f"no cell differs from {against} at p\u00a0<\u00a0{alpha:g}"
             + (f" ({method}, m\u00a0=\u00a0{paired})" if correction != "none" and paired else ""))
    notes: list[Note | str] = [Note(
        f"† p < {alpha:g} against the baseline ({what}) of the row, {SEED_TESTS[test]} over seeds; ‡ p < "
        f"{alpha:g}, paired bootstrap over test pairs ({BOOTSTRAP_SAMPLES} resamples); p-values {corrected}; "
        "raw and corrected ones (t-test, Wilcoxon, permutation) in stats.csv", short)]
    few = stats[(stats.n_seeds > 0) & (stats.n_seeds < MIN_SEEDS)]
    if len(few):
        counts = ", ".join(str(n) for n in sorted(set(few.n_seeds)))
        notes.append(Note(f"no † for {len(few)} of {len(stats)} cells: fewer than {MIN_SEEDS} seeds pair with the "
                          f"baseline (n = {counts}), too few for a test over seeds",
                          f"no † below {MIN_SEEDS} seeds"))
    family = max(1, paired)
    for n in sorted(set(stats.n_seeds[stats.n_seeds >= MIN_SEEDS])):
        if not reachable(test, int(n), family, correction, alpha):
            smallest = min(1.0, comparisons_factor(correction, family) * smallest_p(test, int(n)))
            notes.append(Note(f"{SEED_TESTS[test]} cannot reach p < {alpha:g} with n = {int(n)}"
                              + (f" and {family} comparisons" if correction != "none" else "")
                              + f" (smallest possible {'corrected ' if correction != 'none' else ''}p "
                                f"{smallest:.3g}): no † is possible at this n; use report.seed_test: t or more seeds",
                              f"no † possible with the {SHORT_TESTS[test]} at n = {int(n)}"))
    refused = stats.dropna(subset=["bootstrap_refused"]) if "bootstrap_refused" in stats else stats.iloc[:0]
    if len(refused):
        notes.append(f"no bootstrap for {', '.join(refused.cell)}: {refused.bootstrap_refused.iloc[0]}")
    return notes


def headline_grid(runs: StudyRuns, summary: pd.DataFrame, rows: list[str], decimals: int) -> Grid | None:
    """The paper's table: per row the dev-selected layer k, the truncated model's parameters,
    test Spearman/Pearson at k, the same at the last layer, and the difference."""
    if "layer" not in runs.axes or runs.test_metric != "test_spearman":
        return None
    selected = dev_selected(summary, rows, "layer", runs.mode)
    out = []
    for key, group in row_groups(summary, rows):
        if key not in selected:
            continue
        at_k = group[group.layer == selected[key]].iloc[0]
        last = group[group.layer == group.layer.max()].iloc[0]
        delta = at_k["mean"] - last["mean"]
        out.append((values_label(runs, group.iloc[0], rows) if rows else "", [Cell(text=str(selected[key])),
                          Cell(text="—" if math.isnan(at_k["params"]) else f"{at_k['params'] / 1e6:.1f}"),
                          Cell(mean=at_k["mean"], std=at_k["std"], n=int(at_k["n"]), planned=runs.planned_seeds,
                               note=cell_note(at_k)),
                          Cell(mean=at_k.get("pearson_mean", math.nan), std=at_k.get("pearson_std", math.nan)),
                          Cell(text=str(last["layer"])),
                          Cell(mean=last["mean"], std=last["std"], n=int(last["n"]), planned=runs.planned_seeds,
                               note=cell_note(last)),
                          Cell(text="—" if math.isnan(delta) else f"{delta:+.{decimals}f}")]))
    if not out:
        return None
    out, seeds = collapse_n(out)
    _, where = test_metric_phrase(runs)
    scores = ("test Spearman and Pearson ×100", "test Spearman") if not where else (
        f"Spearman and Pearson ×100{where}", "Spearman on the same pairs")
    title = caption(f"The dev-selected layer k (its parameters in millions, {scores[0]}) against "
                    f"the last layer ({scores[1]}; Δ: k minus last), mean ± std {seeds}",
                    constants_phrase(runs, "layer"))
    notes = [Note(N_NOTE, "n: seeds completed")] if shows_n(out) else []
    return Grid(title, axes_label(runs, rows), ["k", "Params (M)", "Spearman", "Pearson", "Last", "Spearman (last)",
                                                "Δ"], out, notes, decimals, transposable=not rows)  # one row: 7 down


def suite_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """The SentEval-style table (STS12-16, STS-B, SICK-R, average) of every cell, as miCSE's."""
    suite = suite_summary(runs)
    if suite.empty:
        return None
    sets = [label for label, _ in SUITE_METRICS]
    axes = varying(runs, runs.axes)
    shown = cell_labels(runs, axes)
    rows = []
    for cell, group in suite.groupby("cell", sort=False):
        by_set = {r["set"]: r for _, r in group.iterrows()}
        rows.append((shown.get(cell, cell), [Cell(mean=by_set[s]["mean"], std=by_set[s]["std"],
                                                  bold=bool(by_set[s]["best"]), n=int(by_set[s]["n"]),
                                                  planned=runs.planned_seeds) for s in sets]))
    rows, seeds = collapse_n(rows)
    notes = [Note(BEST_NOTE, "bold: best of each set")]
    notes += [Note(N_NOTE, "n: seeds completed")] if shows_n(rows) else []
    notes.append(Note("STS12-16: all subsets of a year pooled (SentEval's \"all\"); STS-B and SICK-R: test splits",
                      "STS12-16: a year's subsets pooled"))
    cap = runs.record.base.get("max_eval_samples") if runs.record is not None else None
    scored = (f"Spearman ×100 of cosine on at most {int(cap):,} pairs of each set (capped: data.max_eval_samples)"
              if cap else "test Spearman ×100 of cosine")
    return Grid(caption(f"STS suite: {scored}, mean ± std {seeds}", constants_phrase(runs)),
                axes_label(runs, axes), sets, rows, notes, decimals)


def cycle_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """Distillation: bi- and cross-encoder Spearman on dev after every cycle (and on test when the
    runs asked for the per-cycle test diagnostic)."""
    cycles = cycle_summary(runs)
    if cycles.empty:
        return None
    numbers = sorted(cycles["cycle"].unique())
    axes = varying(runs, runs.axes)
    shown = cell_labels(runs, axes)
    rows = []
    for (cell, encoder, split), group in cycles.groupby(["cell", "encoder", "split"], sort=False):
        by_cycle = {r["cycle"]: r for _, r in group.iterrows()}
        rows.append((" · ".join(part for part in (shown.get(cell, cell), encoder, split) if part),
                     [Cell(mean=by_cycle[c]["mean"], std=by_cycle[c]["std"], n=int(by_cycle[c]["n"]),
                           planned=runs.planned_seeds) if c in by_cycle else Cell(text="—")
                      for c in numbers]))
    rows, seeds = collapse_n(rows)
    notes = [Note(N_NOTE, "n: seeds completed")] if shows_n(rows) else []
    notes.append(Note("the run's own test figure is the dev-selected cycle's (best bi-encoder dev), scored once; "
                      "test rows appear only with the diagnostic test_every_round: true and are never used",
                      "test rows: a diagnostic, never used for selection"))
    return Grid(caption(f"Spearman ×100 after each distillation cycle, mean ± std {seeds}", constants_phrase(runs)),
                " · ".join([*([axes_label(runs, axes)] if axes else []), "encoder", "split"]),
                [str(c) for c in numbers], rows, notes, decimals, column_axis="Cycle")


COUNTS = ("Pruned", "Failed", "Degenerate")  # the tuning table's outcome columns (left out where all 0)


def tuning_grid(runs: StudyRuns) -> Grid | None:
    """Per cell: trials, pruned, failed or diverged, degenerate, and the dev-best trial's value of
    every tuned parameter (the plan says which) with its dev score."""
    tuning = runs.runs[runs.runs.phase == "tune"] if "phase" in runs.runs else runs.runs.iloc[:0]
    if tuning.empty:
        return None
    rows = []
    dev = f"best_{runs.metric}"
    sign = -1 if runs.mode == "min" else 1
    tuned = [name for name in runs.tuned if name in tuning]
    axes = varying(runs, runs.axes) or runs.axes[:1]  # rows are cells: named by an axis even when none varies
    shown = cell_labels(runs, axes)
    counts = []
    for cell, group in tuning.groupby("cell", sort=False):
        usable = usable_tuning(group, dev)
        best = usable.loc[(sign * usable[dev].astype(float)).idxmax()] if len(usable) else None
        counts.append((int((group.outcome == "pruned").sum()), int(group.outcome.isin(["failed", "diverged"]).sum()),
                       int((group.outcome == "completed").sum()) - len(usable)))
        cells = [Cell(text=str(len(group))), *[Cell(text=str(count)) for count in counts[-1]]]  # merged below
        cells += [Cell(text="—" if best is None else format_value(best[name])) for name in tuned]
        replicated = bool(len(runs.replicates()[runs.replicates().cell == cell]))
        reason = None if best is not None else ("no tuning trial completed with a dev score" if replicated
                                                else tuning_skip_reason(group, dev))
        cells.append(Cell(mean=math.nan if best is None else float(best[dev]), note=reason))
        rows.append((shown.get(cell, cell), cells))
    happened = [i for i in range(len(COUNTS)) if any(c[i] for c in counts)]
    none = [name.lower() for i, name in enumerate(COUNTS) if i not in happened]
    rows = [(label, [Cell(text=cells[0].text + (" (" + "/".join(cells[1 + i].text for i in happened) + ")"
                                                 if happened else "")), *cells[1 + len(COUNTS):]])
            for label, cells in rows]
    tuning_seeds = sorted({int(s) for s in tuning.seed.dropna()})
    replicate_seeds = sorted({int(s) for s in runs.replicates().seed.dropna()})
    overlap = set(tuning_seeds) & set(replicate_seeds)
    notes: list[Note | str] = [
        f"tuning trials trained with seed {', '.join(map(str, tuning_seeds))}; replicates with "
        f"{', '.join(map(str, replicate_seeds)) or 'none yet'}" +
        ("; disjoint, so no replicate reruns a tuning trial" if not overlap else
         f"; seeds {sorted(overlap)} were used by both (a study launched before tuning seeds were separate)")]
    if sum(c[2] for c in counts):
        notes.append(Note("degenerate: finished without a dev score (constant embeddings make the correlation "
                          "undefined); never selected", "degenerate: no dev score (constant embeddings)"))
    metric = metric_label(runs.metric, report_labels(runs))
    counted = "/".join(COUNTS[i].lower() for i in happened)
    what = (f"Tuning on dev, per cell: trials{f' ({counted})' if happened else ''}, and the dev-best trial's "
            f"{', '.join(label_of(runs, t) for t in tuned)}{' and ' if tuned else ''}{in_sentence(metric)} ×100 "
            "(tuning trials only, not the replicates)")
    if none:
        what += "; no trial " + (" or ".join(none) if len(none) < 3 else f"{none[0]}, {none[1]} or {none[2]}")
    headers = ["Trials", *[label_of(runs, name) for name in tuned], metric]
    return Grid(caption(what, constants_phrase(runs, axes[0] if axes else None)), axes_label(runs, axes), headers,
                rows, notes, 2)


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


@dataclass(frozen=True)
class TableContext:
    """What every table is computed from: the runs (with the study record) and their per-cell summary."""

    runs: StudyRuns
    summary: pd.DataFrame
    stats: pd.DataFrame  # tests against the baseline (empty without one)
    rows: list[str]
    column: str | None
    decimals: int

    @property
    def has_cells(self) -> bool:
        return bool(self.column) and not self.summary.empty

    def declared(self, table: str) -> bool:
        """Whether the study record lists this extra table (a record from before `tables`, or a
        combined report: every table whose metrics the runs carry)."""
        record = self.runs.record
        return record is None or record.kind.tables is None or table in record.kind.tables


# the report's tables, in order: name (its .tex file) -> the table, or None where it does not apply
TABLES: dict[str, Callable[[TableContext], Grid | None]] = {
    "ablation": lambda c: ablation_grid(c.runs, c.summary, c.stats, c.rows, c.column, c.decimals)
    if c.has_cells else None,
    "headline": lambda c: headline_grid(c.runs, c.summary, c.rows, c.decimals) if c.has_cells else None,
    "suite": lambda c: suite_grid(c.runs, c.decimals) if c.declared("suite") else None,
    "cycles": lambda c: cycle_grid(c.runs, c.decimals) if c.declared("rounds") else None,
    "layers": lambda c: every_layer_grid(c.runs, c.decimals) if c.declared("layers") else None,
    "sizes": lambda c: every_size_grid(c.runs, c.decimals) if c.declared("sizes") else None,
    "layer_sizes": lambda c: layer_size_grid(c.runs, c.decimals) if c.declared("layer_sizes") else None,
    "tuning": lambda c: tuning_grid(c.runs),
    "pareto": lambda c: frontier_grid(c.runs),
    "equivalence": lambda c: equivalence_grid(c.runs, c.stats, c.decimals),
    "aso": lambda c: aso_grid(c.runs, c.stats),
    "diagnostics": lambda c: diagnostics_grid(
        c.runs, varying(c.runs, c.runs.axes), cell_labels(c.runs, varying(c.runs, c.runs.axes)),
        axes_label(c.runs, varying(c.runs, c.runs.axes)),
        caption("Label-free layer diagnostics on dev: the layer each picks (its Spearman with dev's ranking)",
                constants_phrase(c.runs))),
    "budget": lambda c: budget_grid(c.runs, c.stats),
    "compute": lambda c: compute_grid(c.runs),
}


@dataclass(frozen=True)
class Report:
    """A written report: its folder, the files written, each table as the report shows it (a DataFrame of
    the cells' text, one row per row label), the per-cell summary (`cells.csv`), the tests against the
    baseline (`stats.csv`) and the runs every number comes from (`runs.csv`)."""

    folder: Path
    files: list[Path]
    tables: dict[str, pd.DataFrame]
    cells: pd.DataFrame
    stats: pd.DataFrame
    runs: pd.DataFrame
    bundle: Path | None = None  # the supplementary archive, when one was asked for (`report --bundle`)


def table_frame(grid: Grid) -> pd.DataFrame:
    """A table as the report shows it, without markup: a cell's text, its mark, and `*` where it is the
    dev-selected one."""
    frame = pd.DataFrame([[text_of(cell, grid.decimals) + cell.mark + ("*" if cell.selected else "")
                           for cell in cells] for _, cells in grid.rows],
                         index=pd.Index([label for label, _ in grid.rows], name=grid.corner or None),
                         columns=pd.Index(grid.columns, name=grid.column_axis or None))
    frame.attrs["title"] = grid.title
    return frame


def build_report(runs: StudyRuns, out: Path, formats: tuple[str, ...] | None = None) -> list[Path]:
    """Write the report folder (`formats`: else the study's `report.formats`); returns the files written."""
    return make_report(runs, out, formats).files


def make_report(runs: StudyRuns, out: Path, formats: tuple[str, ...] | None = None) -> Report:
    """Write the report folder (`formats`: else the study's `report.formats`). The files are written to
    a scratch folder beside it and moved in once all are written: a report interrupted (Ctrl-C) or
    failing half-way leaves the folder's earlier report as it was, never a mix of old and new files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-writing-", dir=out.parent))
    try:
        report = write_report(runs, scratch, formats)
        out.mkdir(exist_ok=True)
        for path in sorted(scratch.iterdir(), key=lambda p: (p.name == "report.md", p.name)):  # the entry last
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return replace(report, folder=out, files=[out / path.name for path in report.files])


def write_report(runs: StudyRuns, out: Path, formats: tuple[str, ...] | None = None) -> Report:
    """Every file of the report, written into `out`."""
    formats = tuple(formats or runs.report.get("formats") or FORMATS)
    labels = runs.report.get("labels") or {}
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    decimals = int(runs.report.get("decimals", 2))
    rows, column = layout(runs)
    summary = summarize(runs)
    baseline_spec = runs.report.get("baseline") or {}
    stats = pd.DataFrame()
    if column and baseline_spec.get(column) is not None and not summary.empty:
        stats = compare_to_baseline(runs, summary, rows, column, baseline_spec[column], runs.test_metric,
                                    correction=runs.report.get("correction", "holm"),
                                    seed_test=runs.report.get("seed_test", "t"))
        stats = add_power(stats, runs, runs.test_metric, float(runs.report.get("alpha", LEVEL)),
                          runs.report.get("detect"))
        stats = add_equivalence(stats, runs, runs.test_metric, runs.report.get("rope"))
        stats = add_aso(stats, runs, runs.test_metric, bool(runs.report.get("aso")),
                        runs.report.get("correction", "holm"))

    context = TableContext(runs, summary, stats, rows, column, decimals)
    grids = [(name, grid) for name, table in TABLES.items() if (grid := table(context)) is not None]
    attach_power_note(grids, stats, runs.report.get("detect"))

    figures = []
    if column and not summary.empty and summary["mean"].notna().any():
        selected = dev_selected(summary, rows, column, runs.mode)
        figures.append(layer_plot(summary, rows, column, selected, runs.test_metric, out / "score_by_layer", labels))
        if summary["params"].notna().any():
            figures.append(pareto_plot(summary, rows, runs.test_metric, out / "score_by_params", labels))
    tuned_curves = budget_plot(runs, out / "expected_dev_by_trials")
    figures += [tuned_curves] if tuned_curves is not None else []
    frontier = frontier_figure(runs, out / "dev_by_params")
    figures += [frontier] if frontier is not None else []
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
    from reports.paper import SECTION, write_supplement

    supplement, sections = write_supplement(context, out, formats)
    written += supplement
    notes = runs.report.get("notes", "short")
    if "latex" in formats:
        width = (runs.report.get("latex") or {}).get("width", "auto")
        for name, grid in grids:
            path = out / f"{name}.tex"
            path.write_text(to_latex(grid, f"{runs.name}-{name}", width, notes))
            written.append(path)
        name, where = test_metric_phrase(runs)
        metric = f"{name} ×100{where}"
        captions = {"score_by_layer": f"{metric} by {in_sentence(label_of(runs, column))}, mean ± std over seeds; "
                                      "circle: the dev-selected cell",
                    "score_by_params": f"{metric} against the truncated model's parameters",
                    "expected_dev_by_trials": "expected best dev score against the tuning trials of each cell "
                                              "(Dodge et al. 2019), ± the sd of that best",
                    "dev_by_params": "every tuning trial's best dev score against its parameters; filled and "
                                     "joined: each cell's Pareto frontier; circled: the trial its replicates rerun"}
        (out / "report.tex").write_text(latex_document([name for name, _ in grids],
                                                       [(stem.name, captions[stem.name]) for stem in figures],
                                                       runs.name, appendix=SECTION))
        written.append(out / "report.tex")
    provenance = producer()
    sources = runs.sources or [{"study": runs.name, "tracking_uri": runs.tracking_uri, "study_uid": runs.study_uid}]
    (out / PROVENANCE).write_text(json.dumps({**provenance, "study": runs.name, "tracking_uri": runs.tracking_uri,
                                              "study_uid": runs.study_uid, "sources": sources,
                                              "formats": list(formats), **record_provenance(runs.record)},
                                             indent=1))
    written.append(out / PROVENANCE)
    markdown = [f"# {runs.name}", "", f"Produced by ablation-orchestrator {provenance['version']} (commit "
                f"{provenance['commit'][:12]}); `orchestrator verify` recomputes every number from MLflow.", "",
                f"{len(runs.replicates())} replicate runs, "
                f"{int((runs.runs.phase == 'tune').sum())} tuning runs. Data: `runs.csv` (one row per run), "
                "`cells.csv` (one row per cell)" + (", `stats.csv` (tests against the baseline)." if not stats.empty
                                                    else "."), "", *provenance_lines(runs.record)]
    for _, grid in grids:
        markdown += [to_markdown(grid, notes), ""]
        if notes == "short" and markdown_notes(grid, "full") != markdown_notes(grid, "short"):
            markdown += ["<details><summary>Notes in full</summary>", "", *markdown_notes(grid, "full"), "",
                         "</details>", ""]
    for stem in figures:
        markdown += [f"![{stem.name}]({stem.name}.png)", ""]
    markdown += sections
    if "markdown" in formats:
        (out / "report.md").write_text("\n".join(markdown))
        written.append(out / "report.md")
    return Report(out, written, {name: table_frame(grid) for name, grid in grids}, summary, stats, runs.runs)
