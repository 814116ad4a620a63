"""A study tuned on several objectives (`tune.objectives: [dev, params]`): each cell's Pareto frontier as a
table, and every tuning trial, dev against parameters, with the frontier drawn through them.

The frontier is the one the launch's Optuna studies kept (`Study.best_trials`), read from the tuning runs'
`orchestrator.pareto` tags (`pareto` in runs.csv); nothing is recomputed here, so the table shows what the
search decided. A single-objective study has no such column and gets neither table nor figure.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from reports.captions import axes_label, caption, cell_labels, constants_phrase, varying
from reports.captions import labels as report_labels
from reports.collect import StudyRuns
from reports.labels import axis_label, format_value, in_sentence, metric_label
from reports.render import Cell, Grid, Note

PARETO = "pareto"  # runs.csv's column: 1 for a tuning run on its cell's frontier, 0 for one off it


def frontier_runs(runs: StudyRuns) -> pd.DataFrame | None:
    """The tuning runs of a multi-objective study with their dev score and parameter count (None: the study
    has no frontier to show)."""
    if PARETO not in runs.runs or "phase" not in runs.runs:
        return None
    tuning = runs.runs[runs.runs.phase == "tune"]
    if not (tuning[PARETO] == 1).any():
        return None
    return tuning


def _trial(key: object) -> str:
    return f"t{_asked(key)}"


def _millions(value: object) -> str:
    number = pd.to_numeric(value, errors="coerce")
    return "—" if pd.isna(number) else f"{float(number) / 1e6:.3g}"


def ranked(front: pd.DataFrame, runs: StudyRuns) -> pd.DataFrame:
    """A cell's frontier trials in the order the replicate rule ranks them: best dev score first, then fewer
    parameters, then the trial asked first."""
    dev, sign = f"best_{runs.metric}", -1 if runs.mode == "min" else 1
    return (front.assign(_dev=-sign * front[dev].astype(float), _asked=front.trial_key.map(_asked))
            .sort_values(["_dev", "params", "_asked"], kind="stable").drop(columns=["_dev", "_asked"]))


def _asked(key: object) -> int:
    return int(str(key).rsplit("-t", 1)[-1])


def chosen_keys(runs: StudyRuns, tuning: pd.DataFrame) -> set[str]:
    """Per cell, the frontier trial whose configuration the replicates rerun: the first in the rule's order
    whose tuned values are the replicates' (several trials of one configuration: the one the rule picked)."""
    replicates = runs.replicates()
    chosen = set()
    for cell, front in tuning[tuning[PARETO] == 1].groupby("cell", sort=False):
        reran = replicates[replicates.cell == cell]
        if not len(reran):
            continue
        first = reran.iloc[0]
        for _, trial in ranked(front, runs).iterrows():
            if all(trial.get(name) == first.get(name) for name in runs.tuned):
                chosen.add(str(trial.trial_key))
                break
    return chosen


def frontier_grid(runs: StudyRuns) -> Grid | None:
    """Per cell, its Pareto-frontier trials (fewest parameters first): the tuned values, the parameter count
    and the dev score; underlined, the one the replicates rerun."""
    tuning = frontier_runs(runs)
    if tuning is None:
        return None
    dev = f"best_{runs.metric}"
    tuned = [name for name in runs.tuned if name in tuning]
    axes = varying(runs, runs.axes)
    shown = cell_labels(runs, axes)
    chosen = chosen_keys(runs, tuning)
    rows, counts, flat = [], [], []
    for cell, group in tuning.groupby("cell", sort=False):
        front = ranked(group[group[PARETO] == 1], runs).sort_values("params", kind="stable")
        if not len(front):
            continue
        counts.append(f"{shown.get(cell, cell)}: {len(front)} of {len(group)}" if axes else
                      f"{len(front)} of {len(group)}")
        scored = group[pd.to_numeric(group[dev], errors="coerce").notna()]
        if len(scored) > 1 and scored["params"].nunique() == 1:
            flat.append(shown.get(cell, cell) if axes else "the cell")
        for _, trial in front.iterrows():
            label = f"{shown.get(cell, cell)} · {_trial(trial.trial_key)}" if axes else _trial(trial.trial_key)
            cells = [Cell(text=format_value(trial[name])) for name in tuned]
            cells += [Cell(text=_millions(trial["params"])),
                      Cell(mean=float(trial[dev]), selected=str(trial.trial_key) in chosen)]
            rows.append((label, cells))
    labels = report_labels(runs)
    metric = metric_label(runs.metric, labels)
    objectives = (runs.record.search.get("objectives") if runs.record is not None else None) or ["dev", "params"]
    notes: list[Note | str] = [
        Note(f"frontier: the cell's tuning trials that no other trial of the cell beats on every objective "
             f"({', '.join(objectives)}): Optuna's Pareto set of the cell's multi-objective study; trials on it: "
             f"{'; '.join(counts)}",
             f"trials on the frontier: {'; '.join(counts)}"),
        Note("underlined: the configuration the replicates rerun, the frontier's best dev score (a tie: fewer "
             "parameters, then the trial asked first)", "underlined: what the replicates rerun (best dev)")]
    if flat:
        notes.append(Note(f"every tuning trial of {', '.join(flat)} has the same parameter count, so its frontier "
                          "is its best dev score alone: tune a key that changes the model's size (layer) for a "
                          "trade-off", "one parameter count in " + ", ".join(flat)))
    what = (f"Pareto frontier of the tuning on dev, per cell: each trial's {', '.join(tuned) + ', ' if tuned else ''}"
            f"parameters (millions) and {in_sentence(metric)} ×100 (tuning trials only)")
    corner = f"{axes_label(runs, axes)} · trial" if axes else "Trial"
    headers = [axis_label(name, labels) for name in tuned] + ["Parameters (M)", metric]
    return Grid(caption(what, constants_phrase(runs)), corner, headers, rows, notes, 2)


def frontier_figure(runs: StudyRuns, stem: Path) -> Path | None:
    """Every tuning trial with a dev score, dev against parameters, each cell's frontier drawn through its
    points and the replicated trial circled (None: no frontier to draw)."""
    tuning = frontier_runs(runs)
    if tuning is None:
        return None
    from reports.plots import frontier_plot

    dev = f"best_{runs.metric}"
    axes = varying(runs, runs.axes)
    shown = cell_labels(runs, axes)
    scored = tuning.assign(dev=pd.to_numeric(tuning[dev], errors="coerce"),
                           params=pd.to_numeric(tuning["params"], errors="coerce")).dropna(subset=["dev", "params"])
    chosen = chosen_keys(runs, tuning)
    groups = [(shown.get(cell, str(cell)) if axes else "",
               group.assign(chosen=group.trial_key.astype(str).isin(chosen)))
              for cell, group in scored.groupby("cell", sort=False)]
    if not groups or all(math.isnan(g["dev"].max()) for _, g in groups):
        return None
    return frontier_plot(groups, metric_label(runs.metric, report_labels(runs)), axes_label(runs, axes), stem)
