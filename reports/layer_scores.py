"""`adaptive_layers`: a `finetune` trial that trains one model for every layer scores each layer 0..k of it, with
its best-dev weights, at the end (`layer<j>_test_<metric>`, `layer<j>_dev_<metric>`). The report shows the test
scores per cell, mean ± std over the seeds, one column a layer, the best of each row in bold; separately
truncated cells at the same depths stand in the ablation table beside it. Read from the runs alone, as the kind
declares them: no trainables code."""

from __future__ import annotations

import re

from reports.captions import axes_label, caption, cell_labels, collapse_n, constants_phrase, shows_n, varying
from reports.collect import StudyRuns
from reports.labels import metric_label
from reports.render import N_NOTE, Cell, Grid, Note


def layer_columns(runs: StudyRuns, split: str = "test") -> dict[int, str]:
    """Layer j -> the runs' column of its score on `split` in the study's metric, in layer order."""
    frame = runs.replicates()
    metric = runs.metric.split("_", 1)[1]
    found = {int(m.group(1)): column for column in frame.columns
             if (m := re.fullmatch(rf"layer(\d+)_{split}_{re.escape(metric)}", column))}
    return dict(sorted(found.items()))


def every_layer_grid(runs: StudyRuns, decimals: int) -> Grid | None:
    """One row per cell whose runs scored their layers (`adaptive_layers`), a column per layer: test, mean ± std
    over the completed seeds; None when no run did."""
    columns = layer_columns(runs)
    done = runs.replicates()
    if not columns or done.empty:
        return None
    done = done[done.outcome == "completed"]
    axes = varying(runs, runs.axes)
    shown = cell_labels(runs, axes)
    rows = []
    for cell, group in done.groupby("cell", sort=False):
        scored = group[list(columns.values())].dropna(how="all")
        if scored.empty:  # a cell trained without adaptive_layers (an ablation of it): nothing to show
            continue
        means = scored.mean()
        best = means.max()
        rows.append((shown.get(cell, cell) if axes else runs.study,
                     [Cell(mean=means[c], std=scored[c].std(ddof=1) if len(scored) > 1 else float("nan"),
                           bold=bool(means[c] == best), n=int(scored[c].notna().sum()), planned=runs.planned_seeds)
                      for c in columns.values()]))
    if not rows:
        return None
    rows, seeds = collapse_n(rows)
    notes = [Note("each column is layer j of the one model the cell's trials trained (adaptive_layers), scored "
                  "with the trial's head and best-dev weights as a model cut at j; bold: the best layer of the row",
                  "bold: the row's best layer")]
    notes += [Note(N_NOTE, "n: seeds completed")] if shows_n(rows) else []
    what = f"Every layer of one training: {metric_label(runs.test_metric, split=True)} ×100 at layer j, mean ± std"
    return Grid(caption(f"{what} {seeds}", constants_phrase(runs)), axes_label(runs, axes),
                [f"layer {j}" for j in columns], rows, notes, decimals)
