"""A journaled trial told to its cell's Optuna study again on resume: the dev scores it reported to the pruner,
the rung records successive halving kept of it, and the frozen trial that carries them with its values and
times, so that the study's sampler and pruner go on as if the launch had never stopped. Pure functions over a
`TrialRecord`; `orchestrator.study.state` calls them while it replays the journal."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from orchestrator.study.journal import Outcome, TrialRecord
from orchestrator.study.objectives import KEY_ATTR

RUNG = "completed_rung_"  # Optuna's successive halving keeps a trial's value at rung N as this system attribute


def reported_steps(record: TrialRecord, metric: str) -> dict[int, float]:
    """The dev scores a trial reported to its cell's pruner, by epoch."""
    return {int(r["epoch"]): float(r[metric]) for r in record.results
            if "epoch" in r and isinstance(r.get(metric), int | float) and math.isfinite(r[metric])}


def rung_records(record: TrialRecord, steps: dict[int, float], pruner: optuna.pruners.BasePruner,
                 reports: int) -> dict[str, float]:
    """The trial's rung records as its results journaled them. A journal from before they were (or a
    trial that reached no rung) under successive halving: recomputed, as Optuna's pruner made them:
    at each report before the last epoch (`reports`), the current rung's record is the report's value once its
    epoch reaches the rung's promotion step (grace x reduction_factor^rung); a trial goes on to the next
    rung unless that report stopped it."""
    if record.rungs or record.phase != "tune":
        return dict(record.rungs)
    if type(pruner) is not optuna.pruners.SuccessiveHalvingPruner or not pruner._min_resource:
        return {}
    checked = [(step, value) for step, value in sorted(steps.items()) if step < reports]
    rungs: dict[str, float] = {}
    for n, (step, value) in enumerate(checked):
        rung = len(rungs)
        while step >= pruner._min_resource * pruner._reduction_factor ** (pruner._min_early_stopping_rate + rung):
            rungs[f"{RUNG}{rung}"] = value
            if record.outcome == Outcome.PRUNED and n == len(checked) - 1:
                break  # stopped at this rung
            rung += 1
    return rungs


def frozen_trial(record: TrialRecord, space: dict[str, BaseDistribution], told: float | list[float] | None,
                 steps: dict[int, float], rungs: dict[str, Any]) -> optuna.trial.FrozenTrial:
    """The finished tuning trial as its cell's study is told it again: complete with what it told (`told`: its
    dev score, or each objective's value; none: a degenerate trial, failed), pruned, or failed; its reports
    (`steps`, none for a multi-objective study), rung records and sampler notes; the journal's times."""
    states: dict[Outcome | None, TrialState] = {Outcome.COMPLETED: TrialState.COMPLETE,
                                                Outcome.PRUNED: TrialState.PRUNED}
    state = states.get(record.outcome, TrialState.FAIL)
    if state != TrialState.COMPLETE:
        told = None
    elif told is None:  # degenerate: finished, but no dev score to tell
        state = TrialState.FAIL
    trial = optuna.trial.create_trial(
        params=record.tuned, distributions=space, state=state, user_attrs={KEY_ATTR: record.key},
        **({"values": told} if isinstance(told, list) else {"value": told}),
        intermediate_values=steps, system_attrs={**rungs, **record.sampler_attrs})
    if record.started is not None:  # the journal's times, not the moment of this replay
        trial.datetime_start = datetime.fromtimestamp(record.started)
        trial.datetime_complete = datetime.fromtimestamp(record.ended) if record.ended is not None else None
    return trial
