"""What a study's runs are called in the MLflow UI: a run's short name, a cell in a few characters, the
axes that take no part of a name, and the runs table a study's `ui` link opens (its shared view)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

from orchestrator.study.journal import Outcome, TrialRecord


def run_name(record: TrialRecord, cell_key: str, constant: Collection[str] = ()) -> str:
    """What the runs table shows first, short enough for its name column: `L2 · s1` (a replicate),
    `L2 mean · tune 3`, and after a pruned trial ends `L2 · tune 3 · pruned` (the run's tags say
    everything else: its axes, seed, outcome and epochs). Axes in `constant` (one value in every cell
    of the study, like `pooling: mean` beside three layers) are left out, as the tables leave them out."""
    what = f"s{record.seed}" if record.phase == "replicate" else f"tune {record.key.rsplit('-t', 1)[-1]}"
    name = " · ".join(part for part in (short_cell(cell_key, constant), what) if part)
    return name + " · pruned" if record.outcome == Outcome.PRUNED else name


NAMED_BY_VALUE = ("pooling", "language", "task", "loss", "pretrain", "objective", "mode")


def short_cell(cell_key: str, constant: Collection[str] = ()) -> str:
    """A cell in a few characters: `layer=2 pooling=mean` is `L2 mean`, a model its folder's name;
    other axes keep their name (`lr=3e-05`), a value's newlines and runs of spaces one space (a prompt's); the
    one cell of a study without axes is ``."""
    parts = []
    for axis, value in cell_values(cell_key).items():
        if axis in constant:
            continue
        if axis == "layer":
            parts.append(f"L{value}")
        elif axis == "model":
            parts.append(value.rstrip("/").rsplit("/", 1)[-1])
        elif axis in NAMED_BY_VALUE:
            parts.append(value)
        else:
            parts.append(f"{axis}={value}")
    return " ".join(" ".join(parts).split())


def constant_axes(cells: Iterable[Mapping[str, object]]) -> frozenset[str]:
    """The axes with one value in every cell of a study of more than one cell (a one-cell study keeps
    its axes in its run names: they are all that tells its runs from another study's)."""
    cells = list(cells)
    if len(cells) < 2:
        return frozenset()
    return frozenset(axis for axis in cells[0] if all(str(cell.get(axis)) == str(cells[0][axis]) for cell in cells))


def shared_view(summary: dict) -> dict:
    """The runs table a study's `ui` link opens (MLflow's shared view state, stored as an experiment
    tag): the replicate runs grouped by the ablation axes that vary (each group shows its runs' average),
    those axes, seed, outcome, best dev and test score as columns; an axis with one value in every cell
    is in every run's tags but takes no column and no group."""
    constant = constant_axes(summary["cells"])
    axes = [axis for axis in summary["cells"][0] if axis not in constant]
    metric = summary.get("metric", "dev_spearman")
    test = "test_" + metric.removeprefix("dev_")
    replicates = summary.get("replicate_trials", 1) != 0
    return {"searchFilter": "tags.phase = 'replicate'" if replicates else "tags.`orchestrator.role` != 'study'",
            "orderByKey": "attributes.start_time", "orderByAsc": False, "lifecycleFilter": "Active",
            "selectedColumns": [*(f"tags.`ablate.{a}`" for a in axes), "tags.`seed`", "tags.`outcome`",
                                f"metrics.`best_{metric}`", f"metrics.`{test}`"],
            "groupBy": {"aggregateFunction": "average",
                        "groupByKeys": [{"mode": "tag", "groupByData": f"ablate.{a}"} for a in axes]}
            if axes else None,
            "groupsExpanded": {}, "runListHidden": False, "viewMaximized": False}


AXIS_START = re.compile(r" (?=[A-Za-z_]\w*=)")  # the space before a cell key's next `axis=`


def cell_values(cell_key: str) -> dict[str, str]:
    """`layer=2 prompt=query: ` -> {layer: '2', prompt: 'query: '}: a value runs up to the next ` axis=`, so
    the spaces and newlines of a prompt stay in its `ablate.prompt` tag (the report's cells are read from it)."""
    return dict(part.split("=", 1) for part in AXIS_START.split(cell_key) if "=" in part)
