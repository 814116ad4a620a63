"""A study's trials as tidy DataFrames, read from its folder's journal (every trial, every epoch) and its
MLflow store (each trial's run id): no data, model or torch, so it works wherever the study folder is.

`trials_frame`: one row per trial run — the study, its ablation axes as columns, phase, seed, outcome,
the best dev score and its epoch, the test scores, the epochs run, the tuned parameters, the parameter
count and the MLflow run id. `curves_frame`: one row per trial and epoch, the dev scores and the training
loss, ready for `seaborn.lineplot(data=curves, x="epoch", y="dev_spearman", hue="layer")`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.study.journal import TrialRecord
from reports.record import StudyRecord
from trainables.errors import UserInputError

PHASES = ("tune", "replicate")
RUNNING, INTERRUPTED = "running", "interrupted"  # the outcome of a trial that has not finished
BOOKKEEPING = ("test_epoch", "test_degenerate")  # the epoch tested is best_epoch; a degenerate test has no score


def cell_values(record: StudyRecord) -> dict[str, dict[str, Any]]:
    """Each planned cell's key -> its axis values, as the study file typed them."""
    return {key: values for key, values in record.planned_cells}


def _parsed_key(key: str) -> dict[str, Any]:
    """`layer=3 pooling=mean` -> {layer: 3, pooling: mean}: a cell the plan no longer lists."""
    values: dict[str, Any] = {}
    for part in key.split():
        axis, _, value = part.partition("=")
        values[axis] = _number(value)
    return values


def _number(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            continue
    return value


def select_cells(record: StudyRecord, cell: str | Mapping[str, Any] | None) -> set[str] | None:
    """The cell keys `cell` names: a key as the study shows it (`layer=3 pooling=mean`) or some of its
    axis values ({"layer": 3}); None selects every cell."""
    if cell is None:
        return None
    planned = cell_values(record)
    if isinstance(cell, str):
        if cell in planned:
            return {cell}
        wanted = _parsed_key(cell)
    else:
        wanted = dict(cell)
    unknown = [axis for axis in wanted if axis not in record.axes]
    if unknown:
        raise UserInputError("cell", cell, f"the study's axes are {', '.join(record.axes) or 'none'}; "
                                           f"{unknown[0]} is not one of them")
    chosen = {key for key, values in planned.items()
              if all(str(values.get(axis)) == str(value) for axis, value in wanted.items())}
    if not chosen:
        raise UserInputError("cell", cell, f"no cell of the study has those values; its cells: "
                                           f"{', '.join(planned)}")
    return chosen


def check_phase(phase: str | None) -> None:
    if phase is not None and phase not in PHASES:
        raise UserInputError("phase", phase, "use tune or replicate (or None for both)")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _best(trial: TrialRecord, metric: str, mode: str) -> tuple[float | None, int | None]:
    """The best dev score a trial reported, and its epoch (selection looks at dev only)."""
    scored = [(r[metric], int(r.get("epoch", i + 1))) for i, r in enumerate(trial.results) if _finite(r.get(metric))]
    if not scored:
        return None, None
    pick = max if mode == "max" else min
    return pick(scored, key=lambda pair: pair[0])


def _identity(trial: TrialRecord, record: StudyRecord, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    key = trial.cell_key or (record.planned_cells[trial.cell][0] if trial.cell < len(record.cells) else "")
    values = cells.get(key) or _parsed_key(key)
    return {"cell": key, **{axis: values.get(axis) for axis in record.axes}, "phase": trial.phase,
            "seed": trial.seed, "trial_key": trial.key}


def trials_frame(study: str, trials: Mapping[str, TrialRecord], record: StudyRecord, run_ids: Mapping[str, str],
                 running: bool = False) -> pd.DataFrame:
    """One row per trial run (replicates a later tuning replaced are left out, as in the report)."""
    cells = cell_values(record)
    metric, unfinished = record.metric, RUNNING if running else INTERRUPTED
    rows = []
    for trial in trials.values():
        if trial.superseded:
            continue
        best, best_epoch = _best(trial, metric, record.mode)
        last = trial.last
        row = {"study": study, **_identity(trial, record, cells),
               "outcome": trial.outcome.value if trial.outcome is not None else unfinished,
               f"best_{metric}": best, "best_epoch": best_epoch,
               **{k: v for k, v in last.items() if k.startswith("test_") and k not in BOOKKEEPING and _finite(v)},
               "epochs": trial.rounds_reached, **{name: trial.tuned.get(name) for name in record.tuned},
               "params": last.get("params"), "duration_s": (trial.ended - trial.started
                                                            if trial.ended and trial.started else None),
               "error": trial.error, "run_id": run_ids.get(trial.key)}
        rows.append(row)
    columns = ["study", "cell", *record.axes, "phase", "seed", "trial_key", "outcome", f"best_{metric}",
               "best_epoch", "epochs", *record.tuned, "params", "duration_s", "error", "run_id"]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    primary = metric.replace("dev_", "test_", 1)
    tests = sorted((c for c in frame.columns if c.startswith("test_")), key=lambda c: (c != primary, c))
    ordered = [c for c in columns if c in frame.columns or not rows]
    frame = frame.reindex(columns=ordered[:ordered.index("best_epoch") + 1] + tests
                          + ordered[ordered.index("best_epoch") + 1:])
    return sort_trials(frame, list(cells))


def curves_frame(study: str, trials: Mapping[str, TrialRecord], record: StudyRecord,
                 run_ids: Mapping[str, str]) -> pd.DataFrame:
    """One row per trial run and epoch: the dev scores and the training loss it reported (an epoch a
    retried trial reported twice: its last report)."""
    cells = cell_values(record)
    rows = []
    for trial in trials.values():
        if trial.superseded:
            continue
        identity = {"study": study, **_identity(trial, record, cells), "run_id": run_ids.get(trial.key)}
        by_epoch: dict[int, dict[str, Any]] = {}
        for report in trial.results:
            if "epoch" in report:
                by_epoch[int(report["epoch"])] = report
        for epoch, report in sorted(by_epoch.items()):
            rows.append({**identity, "epoch": epoch, "train_loss": report.get("train_loss"),
                         **{k: v for k, v in report.items() if k.startswith("dev_") and _finite(v)}})
    columns = ["study", "cell", *record.axes, "phase", "seed", "trial_key", "run_id", "epoch", "train_loss",
               record.metric]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    return sort_trials(frame, list(cells), ["epoch"])


def sort_trials(frame: pd.DataFrame, planned: list[str], then: list[str] | None = None) -> pd.DataFrame:
    """Cells in the plan's order, tuning before replicates, then by trial (and epoch)."""
    if frame.empty:
        return frame.reset_index(drop=True)
    order = {key: i for i, key in enumerate(planned)}
    rank = frame["cell"].map(lambda key: order.get(key, len(order)))
    phase = frame["phase"].map({"tune": 0, "replicate": 1})
    number = frame["trial_key"].str.extract(r"-[ts](\d+)$")[0].astype(float)
    return (frame.assign(_cell=rank, _phase=phase, _number=number)
            .sort_values(["_cell", "cell", "_phase", "_number", *(then or [])], kind="stable")
            .drop(columns=["_cell", "_phase", "_number"]).reset_index(drop=True))


def filtered(trials: Mapping[str, TrialRecord], keys: set[str] | None, phase: str | None,
             record: StudyRecord) -> dict[str, TrialRecord]:
    planned = [key for key, _ in record.planned_cells]

    def key_of(trial: TrialRecord) -> str:
        return trial.cell_key or (planned[trial.cell] if trial.cell < len(planned) else "")

    return {k: t for k, t in trials.items() if (phase is None or t.phase == phase)
            and (keys is None or key_of(t) in keys)}


def trial_run_ids(tracking_uri: str, name: str, study_uid: str | None) -> dict[str, str]:
    """Each trial's MLflow run id (trial key -> run id); empty, with a warning, when the store cannot
    be read (the journal still has every result)."""
    from reports.store import child_run_ids

    try:
        return child_run_ids(tracking_uri, name, study_uid)
    except Exception as exc:  # an unreachable server, a moved store: the results stand without run ids
        logging.getLogger("orchestrator").warning("no run ids from MLflow at %s (%s); the results come from the "
                                                  "study's journal", tracking_uri, exc)
        return {}


def results(name: str, storage: str | Path | None = None, *, phase: str | None = None,
            cell: str | Mapping[str, Any] | None = None, curves: bool = False) -> pd.DataFrame:
    """The study's trials (or, with `curves`, their per-epoch curves) from its folder's journal and its
    MLflow store; `phase` (tune or replicate) and `cell` (a key or some axis values) filter them."""
    from orchestrator.study.folder import StudyFolder

    check_phase(phase)
    folder = StudyFolder.named(name, storage)
    study = folder.config()
    record = folder.record(study)
    if record is None:
        raise UserInputError("NAME", name, f"{folder.folder} holds no launch yet (no plan, no journal): launch the "
                                           "study file again")
    trials = filtered(folder.trials(), select_cells(record, cell), phase, record)
    run_ids = trial_run_ids(folder.tracking_uri, study.name, folder.study_uid) if trials else {}
    if curves:
        return curves_frame(study.name, trials, record, run_ids)
    return trials_frame(study.name, trials, record, run_ids, running=folder.is_running())
