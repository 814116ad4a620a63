"""The live view of a running study: trials done / running / failed out of the plan, and the
best dev score per cell so far. Read from the plan state, refreshed at most once a second."""

from __future__ import annotations

import time

from ray.tune import Callback
from rich.console import Console
from rich.live import Live
from rich.table import Table

from orchestrator.study_state import StudyState


def status_table(state: StudyState, title: str | None = None) -> Table:
    counts = state.counts()
    done = counts["completed"] + counts["pruned"]
    table = Table(title=title or (f"{state.plan.study.name}: {done} done, {counts['running']} running, "
                                  f"{counts['failed']} failed, {counts['diverged']} diverged, "
                                  f"{counts['pruned']} pruned · {counts['planned']} planned" +
                                  (f", {counts['skipped']} skipped" if counts["skipped"] else "")))
    table.add_column("cell")
    table.add_column("tuning", justify="right")
    table.add_column("replicates", justify="right")
    table.add_column(f"best {state.plan.metric}", justify="right")
    best = state.best_per_cell()
    for cell in state.plan.cells:
        tune = [r for r in state.records.values() if r.cell == cell.index and r.phase == "tune"]
        reps = [r for r in state.records.values() if r.cell == cell.index and r.phase == "replicate"]
        value = best.get(cell.key)
        degenerate = any(r.finished and r.last.get("degenerate") == 1 for r in tune + reps)
        rule = state.seed_rule(cell)[1]
        skipped = state.skip_reason(cell)
        table.add_row(cell.key, f"{sum(r.finished for r in tune)}/{state.plan.trials_per_cell}",
                      skipped or (f"{sum(r.finished for r in reps)}/{len(state.plan.seeds)}" +
                                  (f" ({rule})" if rule else "")),
                      f"{value:.2f}" if value is not None else ("degenerate" if degenerate else "—"))
    return table


class ProgressCallback(Callback):
    def __init__(self, state: StudyState):
        self.state = state
        self.live = Live(status_table(state), console=Console(stderr=True), auto_refresh=False)
        self.last = 0.0

    def __getstate__(self) -> dict:
        return {}  # driver-only: a live terminal view does not travel with Tune's experiment pickle

    def setup(self, **info) -> None:
        self.live.start()

    def on_step_end(self, iteration, trials, **info) -> None:
        if time.monotonic() - self.last >= 1.0:
            self.last = time.monotonic()
            self.live.update(status_table(self.state), refresh=True)

    def on_experiment_end(self, trials, **info) -> None:
        self.live.update(status_table(self.state), refresh=True)
        self.live.stop()
