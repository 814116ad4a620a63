"""A budget before launch: a short pilot, then the plan's trial-hours and wall time.

The pilot builds the trial of the shallowest and of the deepest cell (data, model, tokenization) as
the kind's `pilot` declares it (a short trial whose work costs the same per unit: a few optimizer
steps, a few batches' worth of pairs, or the whole first round), times its one round and one dev
evaluation on the resources the study asks for, and scales them: a round is `units × unit time +
evaluation`, a trial is `build + rounds`, replicates add one
test evaluation. Cells between are interpolated linearly in their layer (truncation makes a step's
cost linear in the layers kept). Tuning trials count the rounds the pruner is expected to leave them:
successive halving lets 1/η of a rung's trials on to the next rung (Hyperband: in each bracket). Wall
time divides trial-hours by the slots the study can use and adds the launch's fixed cost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.study.plan import Cell, StudyPlan
from orchestrator.study.plan_checks import covering_values
from search_spaces.optuna_samplers import hyperband_brackets
from trainables.errors import UserInputError
from trainables.kinds.base import TrainingKind
from trainables.stages import stage_step_seconds

LAUNCH_OVERHEAD_S = 25.0  # Ray's start, validation, MLflow setup, the first worker's imports (measured ~22 s)


@dataclass(frozen=True)
class Pilot:
    build_s: float  # data, model and tokenization of one trial
    unit_s: float  # one unit of a round's work (an optimizer step, a pair, a whole round: the kind says)
    eval_s: float  # one dev evaluation
    units_per_round: float
    test_s: float  # one test evaluation (replicates)
    unit: str = "step"


@dataclass(frozen=True)
class Estimate:
    tuning_hours: float
    replicate_hours: float
    wall_hours: float
    slots: int
    tuning_rounds: float
    replicate_rounds: int
    stage_hours: float = 0.0  # shared pretraining stages, each built once
    stages: int = 0

    @property
    def trial_hours(self) -> float:
        return self.tuning_hours + self.replicate_hours + self.stage_hours


def check_pilot(plan: StudyPlan) -> None:
    """A `budget:` needs a pilot: refused at `validate` (no data or model is loaded here) for a kind
    that declares none."""
    if plan.study.budget is None or not plan.cells:
        return
    if not isinstance(plan.kind, TrainingKind):
        raise UserInputError("budget", {"hours": plan.study.budget.hours},
                             f"{plan.study.trainable} has no pilot to estimate it with (it trains nothing); remove "
                             "budget to launch without an estimate")


def pilot(plan: StudyPlan, cell: Cell) -> Pilot:
    """Time one trial's pieces for `cell` on this machine, as its kind's `pilot` declares (the kind
    runs it: stages and caches in a scratch folder, priced by `stage_cost`, never left behind)."""
    kind = plan.kind
    config = plan.trial_config(cell, {k: covering_values(p)[0] for k, p in plan.tuned.items()}, plan.seeds[0])
    spec = kind.pilot(kind.parse(config))
    if spec is None or not isinstance(kind, TrainingKind):
        raise UserInputError("--estimate", plan.study.trainable, "no pilot for this trainable; estimate from a small "
                                                                 "study's measured time instead")
    times = kind.measure_pilot(config, spec)
    return Pilot(times.build_s, times.unit_s, times.eval_s, spec.per_round, times.test_s, spec.unit)


def _layer(cell: Cell) -> float | None:
    value = cell.values.get("layer")
    return float(value) if isinstance(value, int | float) else None


def pilots_per_cell(plan: StudyPlan) -> dict[int, Pilot]:
    """Pilot the shallowest and the deepest cell; interpolate the others by layer."""
    layered = [c for c in plan.cells if _layer(c) is not None]
    if len(layered) < 2 or len({_layer(c) for c in layered}) < 2:
        measured = pilot(plan, max(plan.cells, key=lambda c: plan.reports_of(c.index)))
        return {c.index: measured for c in plan.cells}
    low, high = min(layered, key=_layer), max(layered, key=_layer)
    a, b = pilot(plan, low), pilot(plan, high)
    out = {}
    for cell in plan.cells:
        share = 1.0 if _layer(cell) is None else (_layer(cell) - _layer(low)) / (_layer(high) - _layer(low))
        out[cell.index] = Pilot(*(x + share * (y - x) for x, y in ((a.build_s, b.build_s), (a.unit_s, b.unit_s),
                                                                     (a.eval_s, b.eval_s))),
                                b.units_per_round, a.test_s + share * (b.test_s - a.test_s), b.unit)
    return out


def expected_tuning_rounds(plan: StudyPlan, cell: Cell) -> float:
    """Rounds a tuning trial is expected to run under the cell's pruner: every trial reaches the
    grace rung, 1/η of those the next rung, and so on up to the full trial; under Hyperband, that
    averaged over its brackets (bracket b's first rung is η^b times later) in Optuna's proportions."""
    full = plan.reports_of(cell.index)
    tune = plan.study.tune
    if tune.scheduler == "asha":
        return halving_rounds(full, tune.grace_epochs, tune.reduction_factor)
    if tune.scheduler == "hyperband":
        weights = hyperband_brackets(full, tune.grace_epochs, tune.reduction_factor)
        if weights:
            return sum(w * halving_rounds(full, tune.grace_epochs, tune.reduction_factor, b)
                       for b, w in enumerate(weights)) / sum(weights)
    return float(full)


def halving_rounds(full: int, grace: int, eta: int, first_rung: int = 0) -> float:
    """Expected rounds of a trial under successive halving whose first rung is `grace * eta**first_rung`."""
    rounds, reach, rung = 0.0, 1.0, first_rung
    previous = 0
    while True:
        boundary = min(full, grace * eta ** rung)
        rounds += reach * (boundary - previous)
        if boundary >= full:
            return rounds
        previous, reach, rung = boundary, reach / eta, rung + 1


def stage_cost(plan: StudyPlan) -> tuple[float, int]:
    """(seconds, count) of the distinct shared stages the plan's trials need, each built once, as the
    kind declares them (`stage_costs`): one short pilot per stage shape, scaled to each stage's steps."""
    configs = [plan.trial_config(cell, {}, seed, phase) for cell in plan.cells
               for seed, phase in ([(plan.study.tune.seed, "tune")] if plan.study.tune else []) +
               [(s, "replicate") for s in plan.seeds]]
    distinct = {}
    for config in configs:
        for stage in plan.kind.stage_costs(plan.kind.parse(config)):
            distinct.setdefault((stage.name, stage.key), stage)
    per_step: dict[str, float] = {}
    total = 0.0
    for stage in distinct.values():
        if stage.shape not in per_step:
            per_step[stage.shape] = stage_step_seconds(stage.name, stage.cfg)
        total += per_step[stage.shape] * stage.steps
    return total, len(distinct)


def estimate(plan: StudyPlan, pilots: dict[int, Pilot] | None = None, cpus: int | None = None,
             stages: tuple[float, int] | None = None) -> Estimate:
    pilots = pilots or pilots_per_cell(plan)
    slots = max(1, int((cpus or os.cpu_count() or 1) // max(plan.study.resources.cpu, 1e-9)))
    if plan.study.max_concurrent:
        slots = min(slots, plan.study.max_concurrent)
    tuning_s = replicate_s = tuning_rounds = 0.0
    replicate_rounds = 0
    for cell in plan.cells:
        p = pilots[cell.index]
        round_s = p.units_per_round * p.unit_s + p.eval_s
        if plan.study.tune:
            rounds = expected_tuning_rounds(plan, cell)
            tuning_s += plan.trials_per_cell * (p.build_s + rounds * round_s)
            tuning_rounds += plan.trials_per_cell * rounds
        full = plan.reports_of(cell.index)
        replicate_s += len(plan.seeds) * (p.build_s + full * round_s + p.test_s)
        replicate_rounds += len(plan.seeds) * full
    stage_s, stage_count = stages if stages is not None else stage_cost(plan)
    # a stage runs inside the first trial that needs it while the other slots go on: it adds its own
    # time once to the trial-hours and, spread over the slots, to the wall time
    wall = (tuning_s + replicate_s + stage_s) / slots + LAUNCH_OVERHEAD_S
    return Estimate(tuning_s / 3600, replicate_s / 3600, wall / 3600, slots, tuning_rounds, replicate_rounds,
                    stage_s / 3600, stage_count)


def check_budget(plan: StudyPlan, found: Estimate) -> None:
    """`budget: {hours: N}`: refuse a plan whose estimated wall time exceeds it, saying by how much."""
    if plan.study.budget is None:
        return
    limit = plan.study.budget.hours
    if found.wall_hours > limit:
        raise UserInputError("budget.hours", limit, f"the plan is estimated at {found.wall_hours:.2f} h of wall time "
                                                    f"({found.trial_hours:.2f} trial-hours on {found.slots} slots), "
                                                    f"{found.wall_hours - limit:.2f} h over: raise the budget or "
                                                    "shrink the study")


def estimate_summary(found: Estimate, how: str) -> dict[str, float]:
    """What the record keeps of an estimate, in hours (trial-hours are seconds of trial time, before
    multiplying by the CPUs or GPUs each trial holds); `how`: plan (`plan --estimate`) or budget."""
    return {"tuning_trial_hours": found.tuning_hours, "replicate_trial_hours": found.replicate_hours,
            "stage_hours": found.stage_hours, "trial_hours": found.trial_hours, "wall_hours": found.wall_hours,
            "slots": float(found.slots), "from_budget": float(how == "budget")}
