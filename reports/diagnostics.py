"""The label-free layer diagnostics of a probe study (RankMe, anisotropy, alignment, uniformity on dev, which
the `probe` kind logs for every layer it scores): for each cell, the layer each diagnostic would pick from its
mean over seeds and its Spearman correlation with the mean dev scores over the layers, beside the layer dev
picks. Dev only: a diagnostic is judged against what selection may look at, never against test."""

from __future__ import annotations

import math
import re

from reports.aggregate import summarize
from reports.render import Cell, Grid, Note
from trainables.evaluation.picks import DIRECTIONS, pick_and_agreement

LABELS = {"rankme": "RankMe", "anisotropy": "anisotropy", "alignment": "alignment", "uniformity": "uniformity"}


LAYER_METRIC = re.compile(r"^layer(\d+)_(.+)$")


def diagnostics_grid(runs, axes: list[str], cell_labels: dict[str, str], corner: str, title: str) -> Grid | None:
    """One row per cell of a probe study (each trial scores every layer, `layer{k}_dev_spearman`, and logs each
    layer's diagnostics, `layer{k}_dev_rankme`, ...): `dev`, the layer with the best mean dev score over seeds,
    and per diagnostic `k (ρ)`: the layer its mean over seeds picks and its Spearman with the mean dev scores
    over the layers. None unless the runs logged the diagnostics."""
    if runs.runs.empty:
        return None
    by_layer: dict[str, dict[int, str]] = {}
    for column in runs.runs.columns:
        found = LAYER_METRIC.match(column)
        if found:
            by_layer.setdefault(found[2], {})[int(found[1])] = column
    present = [d for d in DIRECTIONS if f"dev_{d}" in by_layer]
    if not present or runs.metric not in by_layer:
        return None
    layers = sorted(by_layer[runs.metric])
    means = {name: {k: summarize(runs, by_layer[name][k]).set_index("cell")["mean"]
                    for k in layers if k in by_layer[name]} for name in [runs.metric, *(f"dev_{d}" for d in present)]}
    grid_rows = []
    for cell in summarize(runs, by_layer[runs.metric][layers[0]])["cell"]:
        scores = [float(means[runs.metric][k].get(cell, math.nan)) for k in layers]
        finite = [(k, v) for k, v in zip(layers, scores, strict=True) if math.isfinite(v)]
        cells = [Cell(text=str(max(finite, key=lambda p: p[1])[0]) if finite else "—")]
        for name in present:
            values = [float(means[f"dev_{name}"][k].get(cell, math.nan)) if k in means[f"dev_{name}"] else math.nan
                      for k in layers]
            pick, rho = pick_and_agreement(layers, values, scores, DIRECTIONS[name])
            agreement = "" if math.isnan(rho) else f" ({rho:+.2f})"
            cells.append(Cell(text=("—" if pick is None else str(pick)) + agreement))
        grid_rows.append((cell_labels.get(cell, cell) if axes else runs.study, cells))
    notes = [Note("each diagnostic's mean over seeds on the dev split's sentences and pairs (no scores) picks the "
                  "layer at its preferred end (RankMe the largest, anisotropy, alignment and uniformity the "
                  "smallest); in brackets its Spearman with the mean dev scores over the layers, oriented so that "
                  "+1 orders the layers as the labels do (none under 3 layers or where either side is constant)",
                  "k (ρ): the layer picked; Spearman with dev's ranking")]
    return Grid(title, corner, ["dev", *(LABELS[d] for d in present)], grid_rows, notes)
