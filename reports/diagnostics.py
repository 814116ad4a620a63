"""The label-free layer diagnostics of a probe study (RankMe, anisotropy, alignment, uniformity on dev, as
the `probe` kind logs them): for each row of the ablation table, the layer each diagnostic would pick and its
Spearman correlation with the labelled dev ranking of the layers, beside the layer dev picks. Dev only:
a diagnostic is judged against what selection may look at, never against test."""

from __future__ import annotations

import math

from reports.aggregate import row_groups, summarize
from reports.render import Cell, Grid, Note
from trainables.evaluation.picks import DIRECTIONS, pick_and_agreement

LABELS = {"rankme": "RankMe", "anisotropy": "anisotropy", "alignment": "alignment", "uniformity": "uniformity"}


def diagnostics_grid(runs, rows: list[str], column: str | None, row_label, corner: str, title: str) -> Grid | None:
    """One row per row of the ablation table whose cells are layers: `dev` (the layer with the best mean dev
    score) and, per diagnostic, `k (ρ)`: the layer its mean over seeds picks and its Spearman with the mean
    dev scores over the row's layers. None unless the runs logged the diagnostics and the columns are layers."""
    present = [d for d in DIRECTIONS if f"dev_{d}" in runs.runs] if not runs.runs.empty else []
    if not present or column != "layer":
        return None
    dev = summarize(runs, runs.metric)
    values = {d: summarize(runs, f"dev_{d}").set_index("cell")["mean"] for d in present}
    grid_rows = []
    for _, group in row_groups(dev, rows):
        group = group[group["layer"].map(lambda v: isinstance(v, int | float) and not isinstance(v, bool))]
        if len(group) < 2:
            continue
        group = group.sort_values("layer")
        layers = [int(v) for v in group["layer"]]
        scores = list(group["mean"])
        finite = [(k, s) for k, s in zip(layers, scores, strict=True) if math.isfinite(s)]
        cells = [Cell(text=str(max(finite, key=lambda p: p[1])[0]) if finite else "—")]
        for name in present:
            pick, rho = pick_and_agreement(layers, [values[name].get(c, math.nan) for c in group["cell"]], scores,
                                           DIRECTIONS[name])
            cells.append(Cell(text=("—" if pick is None else str(pick))
                              + ("" if math.isnan(rho) else f" ({rho:+.2f})")))
        grid_rows.append((row_label(runs, group, rows), cells))
    if not grid_rows:
        return None
    notes = [Note("each diagnostic's mean over seeds on the dev split's sentences and pairs (no scores) picks the "
                  "layer at its preferred end (RankMe the largest, anisotropy, alignment and uniformity the "
                  "smallest); in brackets its Spearman with the mean dev scores over the row's layers, oriented so "
                  "that +1 orders the layers as the labels do (none under 3 layers)",
                  "k (ρ): the layer picked; Spearman with dev's ranking")]
    return Grid(title, corner, ["dev", *(LABELS[d] for d in present)], grid_rows, notes)
