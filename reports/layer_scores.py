"""One training scored at many cuts: a `finetune` trial with `adaptive_layers` scores each layer 0..k of the model it
trained, with its best-dev weights, at the end (`layer<j>_test_<metric>`, `layer<j>_dev_<metric>`); one with
`matryoshka_dims` each size d of its vectors (`dim<d>_...`); with both, every (layer, size) pair
(`layer<j>_dim<d>_...`, 2D Matryoshka). The report shows the test scores per cell, mean ± std over the seeds,
one column a layer (or a size), the best of each row in bold; separately truncated cells at the same depths stand
in the ablation table beside it. Read from the runs alone, as the kind declares them: no trainables code."""

from __future__ import annotations

import re

from reports.captions import axes_label, caption, cell_labels, collapse_n, constants_phrase, shows_n, varying
from reports.collect import StudyRuns
from reports.labels import metric_label
from reports.render import N_NOTE, Cell, Grid, Note


def scored_columns(runs: StudyRuns, pattern: str, split: str = "test") -> dict[tuple[int, ...], str]:
    """The runs' columns `<pattern>_<split>_<metric>` in the study's metric, `pattern` a regular expression of
    numbered parts (`layer(\\d+)`, `dim(\\d+)`, `layer(\\d+)_dim(\\d+)`) -> their numbers, in order."""
    frame = runs.replicates()
    metric = runs.metric.split("_", 1)[1]
    found = {tuple(int(g) for g in m.groups()): column for column in frame.columns
             if (m := re.fullmatch(rf"{pattern}_{split}_{re.escape(metric)}", column))}
    return dict(sorted(found.items()))


def layer_columns(runs: StudyRuns, split: str = "test") -> dict[int, str]:
    """Layer j -> the runs' column of its score on `split` in the study's metric, in layer order."""
    return {key[0]: column for key, column in scored_columns(runs, r"layer(\d+)", split).items()}


def _rows(runs: StudyRuns, columns: list[str], label: str = "") -> list[tuple[str, list[Cell]]]:
    """One row per cell whose completed runs carry `columns`: mean ± std over the seeds, the row's best bold."""
    done = runs.replicates()
    done = done[done.outcome == "completed"]
    axes = varying(runs, runs.axes)
    shown = cell_labels(runs, axes)
    rows = []
    for cell, group in done.groupby("cell", sort=False):
        scored = group[columns].dropna(how="all")
        if scored.empty:  # a cell trained without the method (an ablation of it): nothing to show
            continue
        means = scored.mean()
        best = means.max()
        name = shown.get(cell, cell) if axes else ("" if label else runs.name)
        rows.append((", ".join(filter(None, [name, label])),
                     [Cell(mean=means[c], std=scored[c].std(ddof=1) if len(scored) > 1 else float("nan"),
                           bold=bool(means[c] == best), n=int(scored[c].notna().sum()), planned=runs.planned_seeds)
                      for c in columns]))
    return rows


def _grid(runs: StudyRuns, rows, headers: list[str], note: str, what: str, at: str, decimals: int) -> Grid | None:
    if not rows:
        return None
    rows, seeds = collapse_n(rows)
    notes = [Note(note, note.rsplit("; ", 1)[-1])]
    notes += [Note(N_NOTE, "n: seeds completed")] if shows_n(rows) else []
    title = f"{what}: {metric_label(runs.test_metric, split=True)} ×100 at {at}, mean ± std"
    return Grid(caption(f"{title} {seeds}", constants_phrase(runs)), axes_label(runs, varying(runs, runs.axes)),
                headers, rows, notes, decimals)


def every_layer_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """One row per cell whose runs scored their layers (`adaptive_layers`), a column per layer: test, mean ± std
    over the completed seeds; None when no run did."""
    columns = layer_columns(runs)
    return _grid(runs, _rows(runs, list(columns.values())) if columns else [], [f"layer {j}" for j in columns],
                 "each column is layer j of the one model the cell's trials trained (adaptive_layers), scored with "
                 "the trial's head and best-dev weights as a model cut at j; bold: the row's best layer",
                 "Every layer of one training", "layer j", decimals)


def every_size_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """One row per cell whose runs scored sizes of their vectors (`matryoshka_dims`), a column per size."""
    columns = {key[0]: column for key, column in scored_columns(runs, r"dim(\d+)").items()}
    sizes = sorted(columns, reverse=True)
    return _grid(runs, _rows(runs, [columns[d] for d in sizes]) if columns else [], [f"d = {d}" for d in sizes],
                 "each column is the first d dimensions of the vectors of the one model the cell's trials trained "
                 "(matryoshka_dims), with its best-dev weights; bold: the row's best size",
                 "Every size of one training", "size d", decimals)


def layer_size_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """2D Matryoshka (`adaptive_layers` with `matryoshka_dims`): per cell one row a layer, one column a size."""
    found = scored_columns(runs, r"layer(\d+)_dim(\d+)")
    layers = sorted({j for j, _ in found})
    sizes = sorted({d for _, d in found}, reverse=True)
    rows = [row for j in layers
            for row in _rows(runs, [found.get((j, d), f"layer{j}_dim{d}") for d in sizes], f"layer {j}")
            ] if found and len(found) == len(layers) * len(sizes) else []
    return _grid(runs, rows, [f"d = {d}" for d in sizes],
                 "each score is layer j of the one model the cell's trials trained (adaptive_layers with "
                 "matryoshka_dims), its first d dimensions, with the trial's head and best-dev weights; bold: the "
                 "row's best size", "Every layer and size of one training (2D Matryoshka)", "layer j and size d",
                 decimals)
