"""Several objectives in a cell's search (`tune.objectives: [dev, params]`): each trial's values in the
objectives' order, the cell's Pareto set as Optuna keeps it (`Study.best_trials`), and the one rule that picks
the configuration its replicates rerun, so that replicate, report, verify and reproduce work as with one.

The rule: the Pareto trial with the best dev score; on a tie, the better value of the next objective in
`tune.objectives` order (fewer parameters), then the trial asked first. The best-dev trial is always on the
frontier, so a study of several objectives replicates what one tuned on dev alone would have, among the
configurations its search tried; the frontier is what the report adds.
Pure Python over Optuna's studies: no Ray import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.study.journal import TrialRecord

if TYPE_CHECKING:
    import optuna

KEY_ATTR = "trial_key"  # the user attribute that names a cell study's trial by its journal key (c0-t3)


def objective_values(record: TrialRecord, objectives: Sequence[str], dev: float | None) -> list[float] | None:
    """The trial's value of each objective in order (`dev`: its best dev score; `params`: the parameter count
    its reports gave); None where one is missing: no dev score (degenerate), or a kind whose trials do not
    count their parameters. Such a trial is never told to Optuna as complete, so it is never on a frontier."""
    values = []
    for name in objectives:
        value = dev if name == "dev" else last_reported(record, name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return None
        values.append(float(value))
    return values


def last_reported(record: TrialRecord, metric: str) -> float | None:
    """The last finite value of `metric` the trial reported (its parameter count is the same in every report)."""
    for result in reversed(record.results):
        value = result.get(metric)
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return None


def pareto_keys(study: optuna.Study) -> list[str]:
    """The journal keys of the cell study's Pareto set (Optuna's `best_trials`: its complete trials no other
    complete trial dominates), in the order they were asked."""
    keys = [str(t.user_attrs[KEY_ATTR]) for t in study.best_trials if KEY_ATTR in t.user_attrs]
    return sorted(keys, key=asked)


def asked(key: str) -> int:
    """When a tuning trial was asked within its cell: the `n` of its key `c<cell>-t<n>` (a resume renumbers
    Optuna's trials, never the keys)."""
    return int(key.rsplit("-t", 1)[-1])


def replicate_choice(front: list[TrialRecord], values: dict[str, list[float]], objectives: Sequence[str],
                     directions: Sequence[str]) -> TrialRecord | None:
    """The frontier trial the replicates rerun: the best dev score; a tie, the better value of the next
    objective in order; then the trial asked first (the `n` of its key `c<cell>-t<n>`)."""
    order = [objectives.index("dev")] + [i for i, name in enumerate(objectives) if name != "dev"]
    signs = [1.0 if direction == "minimize" else -1.0 for direction in directions]

    def rank(record: TrialRecord) -> tuple[float, ...]:
        told = values[record.key]
        return (*(signs[i] * told[i] for i in order), float(asked(record.key)))

    scored = [r for r in front if r.key in values]
    return min(scored, key=rank) if scored else None


def generation_attrs(study: optuna.Study, trial_id: int) -> dict[str, Any]:
    """What a genetic sampler (NSGA-II) noted on a trial when it was asked: its generation. The journal keeps
    it so that a resumed search breeds on from the generations it had, instead of drawing a random first
    generation again (the parents of each generation are selected again from them, as Optuna does)."""
    key_of = getattr(study.sampler, "_get_generation_key", None)
    if key_of is None:
        return {}
    key = key_of()
    attrs = study._storage.get_trial_system_attrs(trial_id)
    return {key: attrs[key]} if key in attrs else {}
