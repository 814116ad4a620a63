"""Figures: test score by layer with a ±std band and the dev-selected layer marked, score against the
truncated model's parameters (a Pareto view), and a multi-objective search's tuning trials with each cell's
frontier. PNG and PDF."""

from __future__ import annotations

import numbers
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # not pyplot: a report must not change the backend of a notebook it runs in
from matplotlib.ticker import MaxNLocator

from reports.aggregate import row_groups
from reports.labels import axis_label, metric_label, value_label


def _save(figure, stem: Path) -> Path:
    figure.tight_layout()
    figure.savefig(stem.with_suffix(".png"), dpi=150)
    figure.savefig(stem.with_suffix(".pdf"))
    return stem


def _shown(labels: dict | None, group: pd.DataFrame, rows: list[str], key: str) -> str:
    """A row's legend entry: its axis values as the tables show them (`report.labels`, else readable)."""
    if not rows:
        return key
    return ", ".join(value_label(group.iloc[0][a], labels) for a in rows)


def _legend_title(labels: dict | None, rows: list[str]) -> str | None:
    """The entries are bare values: the title names their axes."""
    return ", ".join(axis_label(a, labels) for a in rows) if rows else None


def layer_plot(summary: pd.DataFrame, rows: list[str], column: str, selected: dict, metric: str, stem: Path,
               labels: dict | None = None) -> Path:
    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    for label, group in row_groups(summary, rows):
        group = group.dropna(subset=["mean"]).sort_values(column)
        if not len(group):
            continue
        x, mean, std = group[column].to_numpy(), group["mean"].to_numpy(), group["std"].fillna(0).to_numpy()
        line, = axis.plot(x, mean, marker="o", label=_shown(labels, group, rows, label))
        axis.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        if label in selected:
            pick = group[group[column] == selected[label]]
            axis.scatter(pick[column], pick["mean"], s=160, facecolors="none", edgecolors=line.get_color(),
                         linewidths=2, zorder=3)
    axis.set_xlabel(axis_label(column, labels))
    values = sorted(float(v) for v in summary[column].unique()
                    if isinstance(v, numbers.Real) and not isinstance(v, bool))
    if values and all(float(v).is_integer() for v in values):
        axis.set_xticks(values)
    axis.set_ylabel(f"{metric_label(metric, labels)} ×100")
    axis.set_title("mean ± std over seeds; circle: dev-selected")
    axis.grid(alpha=0.3)
    if rows and axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small", title=_legend_title(labels, rows), title_fontsize="small")
    return _save(figure, stem)


def pareto_plot(summary: pd.DataFrame, rows: list[str], metric: str, stem: Path, labels: dict | None = None) -> Path:
    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    valid = summary.dropna(subset=["mean", "params"])
    for label, group in row_groups(valid, rows):
        group = group.sort_values("params")
        axis.errorbar(group["params"] / 1e6, group["mean"], yerr=group["std"].fillna(0), marker="o", capsize=3,
                      label=_shown(labels, group, rows, label))
    frontier, best = [], float("-inf")
    for _, row in valid.sort_values("params").iterrows():
        if row["mean"] > best:
            frontier.append(row)
            best = row["mean"]
    if frontier:
        points = pd.DataFrame(frontier)
        axis.step(points["params"] / 1e6, points["mean"], where="post", color="black", alpha=0.5, linestyle="--",
                  label="Pareto frontier")
    axis.set_xlabel("parameters of the truncated model (M)")
    axis.set_ylabel(f"{metric_label(metric, labels)} ×100")
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small", title=_legend_title(labels, rows), title_fontsize="small")
    return _save(figure, stem)


def frontier_plot(groups: list[tuple[str, pd.DataFrame]], metric: str, legend_title: str, stem: Path) -> Path:
    """Every tuning trial of a multi-objective study, best dev score against parameters: one colour per cell
    (`groups`: its label and its trials, with `dev`, `params`, `pareto` and `chosen`), its frontier trials
    filled and joined by a step line (the best dev score within each parameter budget), the others hollow,
    the trial its replicates rerun circled."""
    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    for label, group in groups:
        front = group[group["pareto"] == 1].sort_values("params")
        others = group[group["pareto"] != 1]
        line, = axis.plot(front["params"] / 1e6, front["dev"], marker="o", linestyle="none",
                          label=label or "frontier")
        colour = line.get_color()
        if len(front) > 1:
            axis.step(front["params"] / 1e6, front["dev"], where="post", color=colour, alpha=0.6)
        axis.scatter(others["params"] / 1e6, others["dev"], facecolors="none", edgecolors=colour, alpha=0.7)
        picked = group[group["chosen"]]
        axis.scatter(picked["params"] / 1e6, picked["dev"], s=160, facecolors="none", edgecolors=colour,
                     linewidths=2, zorder=3)
    axis.set_xlabel("parameters (M)")
    axis.xaxis.set_major_locator(MaxNLocator(5))
    axis.set_ylabel(f"{metric} ×100, best round")
    axis.set_title("tuning trials; filled, joined: Pareto frontier; circle: replicated", fontsize="medium")
    axis.grid(alpha=0.3)
    if any(label for label, _ in groups):
        axis.legend(fontsize="small", title=legend_title or None, title_fontsize="small")
    return _save(figure, stem)
