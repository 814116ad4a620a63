"""Figures: test score by layer with a ±std band and the dev-selected layer marked, and score
against the truncated model's parameters (a Pareto view). PNG and PDF."""

from __future__ import annotations

import numbers
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # not pyplot: a report must not change the backend of a notebook it runs in

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
