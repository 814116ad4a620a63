"""The label-free layer diagnostics of a probe study (RankMe, anisotropy, alignment, uniformity on dev): each
trial scores every layer and logs, per diagnostic, the layer it picks (`dev_rankme_pick`) and its Spearman with
the trial's labelled dev ranking of the layers (`dev_rankme_rho`), beside the layer dev picks (`best_layer`).
The report shows them per cell, over the seeds: the pick most of them made and their mean Spearman (a zero-shot
probe gives every seed the same numbers). Dev only: a diagnostic is judged against what selection may look at,
never against test. Read from the runs alone, as the kinds declare them: no trainables code."""

from __future__ import annotations

import math

import pandas as pd

from reports.render import Cell, Grid, Note

LABELS = {"rankme": "RankMe", "anisotropy": "anisotropy", "alignment": "alignment", "uniformity": "uniformity"}


def _most_frequent(values: pd.Series) -> str:
    """The value most runs gave (the smallest on a tie), as a layer number; "—" when none did."""
    found = values.dropna()
    return "—" if found.empty else str(int(found.value_counts().sort_index().idxmax()))


def diagnostics_grid(runs, axes: list[str], cell_labels: dict[str, str], corner: str, title: str) -> Grid | None:
    """One row per cell: `dev` (the layer dev picked) and per diagnostic `k (ρ)`; None unless the runs logged
    the diagnostics' picks."""
    done = runs.replicates()
    done = done[done.outcome == "completed"] if not done.empty else done
    present = [d for d in LABELS if f"dev_{d}_pick" in done]
    if done.empty or not present or "best_layer" not in done:
        return None
    grid_rows = []
    for cell, group in done.groupby("cell", sort=False):
        cells = [Cell(text=_most_frequent(group["best_layer"]))]
        for name in present:
            rho = group[f"dev_{name}_rho"].mean() if f"dev_{name}_rho" in group else math.nan
            agreement = "" if not math.isfinite(rho) else f" ({rho:+.2f})"
            cells.append(Cell(text=_most_frequent(group[f"dev_{name}_pick"]) + agreement))
        grid_rows.append((cell_labels.get(cell, cell) if axes else runs.study, cells))
    notes = [Note("each diagnostic on the dev split's sentences and pairs (no scores) picks the layer at its preferred "
                  "end (RankMe the largest, anisotropy, alignment and uniformity the smallest); in brackets its "
                  "Spearman with the dev scores over the layers, oriented so that +1 orders the layers as the labels "
                  "do (none under 3 layers or where either side is constant); over seeds, the pick most made and "
                  "the mean Spearman", "k (ρ): the layer picked; Spearman with dev's ranking")]
    return Grid(title, corner, ["dev", *(LABELS[d] for d in present)], grid_rows, notes)
