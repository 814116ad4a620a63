"""What a running study shows. On a terminal: a live table (trials done / running / failed out of the
plan, the best dev score per cell) with elapsed time and ETA in its title. Elsewhere (a file, CI,
`| tee`): a start banner, one line per trial that ends, and a heartbeat line at most once a minute
while none does. The ETA learns from the work finished so far, weighed by each cell's cost as the
plan measures it (reports x layers), so a deep cell's trial counts for more than a shallow one's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from orchestrator.study.folder import StudyFolder
from orchestrator.study.journal import TrialRecord
from orchestrator.study.state import StudyState

if TYPE_CHECKING:
    import pandas as pd


def status_table(state: StudyState, title: str | None = None) -> Table:
    counts = state.counts()
    done = counts["completed"] + counts["pruned"]
    table = Table(title=title or (f"{state.plan.study.name}: {done} done, {counts['running']} running, "
                                  f"{counts['failed']} failed, {counts['diverged']} diverged, "
                                  f"{counts['pruned']} pruned · {counts['planned']} planned" +
                                  (f", {counts['skipped']} skipped" if counts["skipped"] else "")))
    metric = state.plan.metric
    tunes = state.plan.trials_per_cell > 0
    table.caption = ((f"tuning's best: the best {metric} of the cell's tuning trials (the report's tuning table); "
                      if tunes else "") +
                     f"replicates' mean: the mean over seeds of each replicate's best {metric} (what selects on dev)")
    table.add_column("cell")  # the metric is named once, in the caption, so a skipped cell's reason fits unwrapped
    table.add_column("tuning", justify="right")
    table.add_column("replicates", justify="right")
    if tunes:
        table.add_column("tuning's best", justify="right")
    table.add_column("replicates' mean", justify="right")
    for cell in state.plan.cells:
        tune = state.issued(cell, "tune")
        reps = state.issued(cell, "replicate")
        degenerate = "degenerate" if any(r.finished and r.last.get("degenerate") == 1 for r in tune + reps) else "—"
        rule = state.seed_rule(cell)[1]
        skipped = state.skip_reason(cell)
        scores = [state.tuning_best(cell)] if tunes else []
        table.add_row(cell.key, f"{sum(r.finished for r in tune)}/{state.plan.trials_per_cell}",
                      skipped or (f"{sum(r.finished for r in reps)}/{len(state.plan.seeds)}" +
                                  (f" ({rule})" if rule else "")),
                      *(f"{v:.2f}" if v is not None else degenerate for v in [*scores, state.replicates_mean(cell)]))
    return table


def status_record(state: StudyState) -> dict:
    """`status --json`: the counts and, per cell, its trials, replicates, dev scores (`best_<metric>`: the
    best of any trial; `tuning_best_<metric>`: of its tuning trials; `replicates_mean_<metric>`: the mean of
    its replicates' best) and why it stopped or was skipped."""
    best = state.best_per_cell()
    cells = []
    for cell in state.plan.cells:
        tune = state.issued(cell, "tune")
        value = best.get(cell.key)
        cells.append({"cell": cell.key, **cell.values, "tuning_finished": sum(r.finished for r in tune),
                      "tuning_planned": state.plan.trials_per_cell,
                      "replicates_finished": sum(r.finished for r in state.replicates(cell)),
                      "replicates_planned": len(state.plan.seeds), "skipped": state.skip_reason(cell),
                      "seed_rule": state.seed_rule(cell)[1] or None,
                      f"best_{state.plan.metric}": value if value is None or math.isfinite(value) else None,
                      f"tuning_best_{state.plan.metric}": state.tuning_best(cell),
                      f"replicates_mean_{state.plan.metric}": state.replicates_mean(cell)})
    return {"study": state.plan.study.name, "complete": state.is_complete(), **state.counts(), "cells": cells}


def duration(seconds: float) -> str:
    """`4m12s`, `1h03m`, `45s`."""
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def work_units(state: StudyState) -> tuple[float, float]:
    """(done, total) work in the plan's cost units: a trial of cell c costs `cell_costs[c]` when it
    runs all its reports; a finished trial counts what it ran (a pruned one, its reports so far); a
    trial not issued yet counts in full; skipped replicates count nothing."""
    plan = state.plan
    costs = plan.cell_costs or (1.0,) * len(plan.cells)
    done = total = 0.0
    issued = {(c.index, phase): 0 for c in plan.cells for phase in ("tune", "replicate")}
    for record in state.records.values():
        if record.superseded:
            continue
        full = costs[record.cell]
        ran = full * min(1.0, record.rounds_reached / max(1, plan.reports_of(record.cell)))
        done += ran
        total += ran if record.finished else full
        issued[(record.cell, record.phase)] += 1
    for cell in plan.cells:
        left_tuning = max(0, plan.trials_per_cell - issued[(cell.index, "tune")])
        left_seeds = 0 if state.skip_reason(cell) else max(0, len(plan.seeds) - issued[(cell.index, "replicate")])
        total += costs[cell.index] * (left_tuning + left_seeds)
    return done, total


def eta_seconds(state: StudyState, elapsed: float, done_before: float = 0.0) -> float | None:
    """Time left at the pace of this launch (None until it has done some work): `done_before` is the
    work an earlier launch finished, which `elapsed` did not pay for (a resume)."""
    done, total = work_units(state)
    if done - done_before <= 0 or elapsed <= 0:
        return None
    return max(0.0, elapsed * (total - done) / (done - done_before))


def trial_line(state: StudyState, record: TrialRecord, elapsed: float, eta: float | None = math.nan) -> str:
    """`[12/21] layer=4 seed 1 done dev_spearman 81.30 · 4m12s elapsed · ETA 3m05s`. `eta`: the time
    left when the caller knows it (None: not yet), else computed here."""
    counts = state.counts()
    finished = counts["issued"] - counts["running"]
    planned = counts["planned"] - counts["skipped"]
    who = f"{record.cell_key or state.plan.cells[record.cell].key} " + (
        f"seed {record.seed}" if record.phase == "replicate" else f"tune {record.key.rsplit('-t', 1)[-1]}")
    outcome = record.outcome.value if record.outcome else "ended"
    if outcome == "completed" and record.last.get("degenerate") == 1:
        outcome = "degenerate"
    value = state._value(record)
    if outcome == "pruned":
        what = f"pruned at {state.plan.round_name} {record.rounds_reached}"
    elif outcome in ("failed", "diverged"):
        what = outcome + (f": {record.error.splitlines()[0][:80]}" if record.error else "")
    else:
        what = outcome
    score = f" {state.plan.metric} {value:.2f}" if value is not None and math.isfinite(value) else ""
    if eta is not None and math.isnan(eta):
        eta = eta_seconds(state, elapsed)
    return (f"[{finished}/{max(planned, finished)}] {who} {what}{score} · {duration(elapsed)} elapsed"
            + (f" · ETA {duration(eta)}" if eta is not None and finished < planned else ""))


@dataclass(frozen=True)
class Status:
    """Where a study stands, from its journal (no data, model or Ray needed): trial counts by outcome,
    one row per cell (`cells`), whether a launch holds the folder now, and the folder's size."""

    name: str
    folder: Path
    complete: bool
    counts: dict[str, int]
    cells: pd.DataFrame
    running_now: bool
    folder_bytes: int
    state: StudyState = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        """What `orchestrator status --json` prints."""
        return {**status_record(self.state), "running_now": self.running_now, "folder": str(self.folder),
                "folder_bytes": self.folder_bytes}

    def table(self) -> Table:
        """The table `orchestrator status` prints (rich)."""
        return status_table(self.state)


def status_of(folder: StudyFolder) -> Status:
    """Where the study of `folder` stands, as `orchestrator status` shows it."""
    import pandas as pd

    state = folder.require().state()
    record = status_record(state)
    return Status(folder.name, folder.folder, state.is_complete(), state.counts(), pd.DataFrame(record["cells"]),
                  folder.is_running(), folder.size(), state)


def listing(studies: list[StudyFolder]) -> list[dict[str, Any]]:
    """Each study folder's name, state (finished, running now, interrupted, not started or damaged) and
    trial counts, as `orchestrator list` shows them."""
    from trainables.errors import UserInputError

    rows: list[dict[str, Any]] = []
    for study in studies:
        try:
            state = study.state() if study.journal_file.exists() else None
        except UserInputError as exc:
            rows.append({"study": study.name, "state": "damaged", "problem": str(exc)})
            continue
        counts = state.counts() if state else None
        verdict = ("running now" if study.is_running() else "finished" if state and state.is_complete() else
                   "not started" if not counts or not counts["issued"] else "interrupted")
        rows.append({"study": study.name, "state": verdict, **({k: counts[k] for k in (
            "planned", "completed", "pruned", "failed", "diverged", "skipped")} if counts else {})})
    return rows
