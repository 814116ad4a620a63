"""What every table's caption and labels say, from the runs: the axes that vary (an axis with one
value is no column, the caption names it), each cell's label, and n once in the caption when every
cell has the same."""

from __future__ import annotations

import math
from dataclasses import replace

from reports.collect import StudyRuns, record_test_cap
from reports.labels import axis_label, in_sentence, metric_label, value_label
from reports.render import Cell


def labels(runs: StudyRuns) -> dict:
    return runs.report.get("labels") or {}


def constant_axes(runs: StudyRuns) -> dict[str, object]:
    """Axes with one value over every run and planned cell (`pooling: mean`): axis -> that value."""
    out = {}
    for axis in runs.axes:
        seen = {str(v): v for v in (runs.runs[axis].dropna() if axis in runs.runs else [])}
        seen.update({str(values[axis]): values[axis] for _, values in runs.planned_cells if axis in values})
        if len(seen) == 1:
            out[axis] = next(iter(seen.values()))
    return out


def varying(runs: StudyRuns, axes: list[str], keep: str | None = None) -> list[str]:
    """`axes` without the constant ones (`keep`, the column axis, stays)."""
    constant = constant_axes(runs)
    return [a for a in axes if a == keep or a not in constant]


def constants_phrase(runs: StudyRuns, keep: str | None = None) -> str:
    """`pooling: mean` for the caption (empty when every axis varies)."""
    return "; ".join(f"{in_sentence(axis_label(axis, labels(runs)))}: {value_label(value, labels(runs))}"
                     for axis, value in constant_axes(runs).items() if axis != keep)


def axes_label(runs: StudyRuns, axes: list[str]) -> str:
    return ", ".join(axis_label(a, labels(runs)) for a in axes)


def values_label(runs: StudyRuns, values: dict, axes: list[str]) -> str:
    return ", ".join(value_label(values[a], labels(runs)) for a in axes)


def cell_labels(runs: StudyRuns, axes: list[str]) -> dict[str, str]:
    """Each cell key (`layer=2 pooling=mean`) as a table row shows it (`2`), by the `axes` given."""
    out = {}
    frame = runs.runs.dropna(subset=["cell"]).drop_duplicates("cell") if "cell" in runs.runs else runs.runs
    for _, row in frame.iterrows():
        if all(a in row for a in axes):
            out[row["cell"]] = values_label(runs, row, axes)
    for key, values in runs.planned_cells:
        if key not in out and all(a in values for a in axes):
            out[key] = values_label(runs, values, axes)
    return out


def collapse_n(rows: list[tuple[str, list[Cell]]]) -> tuple[list[tuple[str, list[Cell]]], str]:
    """Per-cell n moved to the caption when every filled cell has the same: (rows, `over 5
    seeds`); else the rows as they are and `over seeds`. Empty cells never show n (a note says why)."""
    filled = [c for _, cells in rows for c in cells if c.n is not None and not math.isnan(c.mean)]
    counts = {(c.n, c.planned) for c in filled}
    shared = len(counts) == 1
    out = [(label, [replace(c, n=None) if shared or (c.n is not None and math.isnan(c.mean)) else c
                    for c in cells]) for label, cells in rows]
    if not shared:
        return out, "over seeds"
    n, planned = counts.pop()
    seeds = f"{n} seed" + ("s" if n != 1 else "")
    return out, f"over {seeds}" if planned is None or n >= planned else f"over {n} of the {planned} planned seeds"


def shows_n(rows: list[tuple[str, list[Cell]]]) -> bool:
    return any(c.n is not None for _, cells in rows for c in cells)


def caption(what: str, constants: str) -> str:
    """The caption's sentence, the constant axes in brackets at its end."""
    return f"{what} ({constants})." if constants else f"{what}."


def cell_label(runs: StudyRuns, axes: list[str], key: str) -> str:
    """A row's label from its cell key; the key itself where the runs do not say."""
    return cell_labels(runs, axes).get(key, key)


def test_cap(runs: StudyRuns) -> tuple[int, int | None] | None:
    """(pairs scored, pairs in the test split) where `data.max_eval_samples` capped the test split (the split's
    size None where the record does not hold it, or where several test splits differ); None where test was
    scored whole or the runs do not say. A combined report: its studies' caps (`runs.test_caps`), the
    largest where they differ."""
    if runs.record is not None:
        return record_test_cap(runs.record)
    capped = [cap for cap in runs.test_caps if cap]
    if not capped:
        return None
    totals = {total for _, total in capped}
    return max(used for used, _ in capped), (totals.pop() if len(totals) == 1 else None)


def test_metric_phrase(runs: StudyRuns, metric: str | None = None) -> tuple[str, str]:
    """(name, where) of the test metric in a caption: (`Test Spearman`, ``) for a test split scored whole;
    (`Spearman`, ` on 300 of the 1,379 test pairs (capped: data.max_eval_samples)`) where it was capped, so
    that no caption calls a capped score the test score."""
    metric = metric or runs.test_metric
    cap = test_cap(runs) if metric.startswith("test_") else None
    if cap is None or metric in labels(runs):
        return metric_label(metric, labels(runs)), ""
    used, total = cap
    studies = runs.test_caps if runs.record is None else []
    if studies and not all(studies):  # a combined report whose studies were capped and not
        capped = sum(1 for c in studies if c)
        return (metric_label(metric, labels(runs), split=False),
                f" on test splits capped at {used:,} pairs in {capped} of its {len(studies)} studies "
                f"(data.max_eval_samples; the others scored whole)")
    pairs = f"{used:,} of the {total:,} test pairs" if total else f"at most {used:,} pairs of each test split"
    return metric_label(metric, labels(runs), split=False), f" on {pairs} (capped: data.max_eval_samples)"
