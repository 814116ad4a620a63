"""A study file checked as `orchestrator validate` checks it, and its `Plan` as `orchestrator plan` shows it:
every mistake of a file at once, each one line in the file's order; the deep checks (model, data, tracking
store, pilot) build the plan once."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.study.config import StudySpec, models_of, read_study
from orchestrator.study.folder import StudyFolder
from orchestrator.study.fusing import summary
from trainables.errors import UserInputError

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.checks.estimate import Estimate, Pilot
    from orchestrator.study.plan import StudyPlan
    from reports.record import DataRecord, PluginRecord


def as_spec(study: StudySpec | str | Path, overrides: Sequence[str], name: str | None) -> StudySpec:
    """A loaded study as it is, or a study file read with its overrides."""
    if isinstance(study, StudySpec):
        if overrides or name is not None:
            raise UserInputError("overrides", list(overrides) or name, "give them to load_study, which read "
                                                                       "this study, or pass the study file's path")
        return study
    return read_study(study, overrides, name)


def read_checked(study: StudySpec | str | Path, overrides: Sequence[str], name: str | None,
                 data_dir: str | Path | None) -> StudySpec:
    """The study read (`as_spec`) with `data_dir` in use. A file with structural problems is refused with
    every mistake it has at once: the checks that need the model and the data run on the rest of the file
    (the keys at fault taken out), and every problem is one line, in the file's order."""
    from orchestrator.study.config import StructureErrors, in_file_order
    from trainables.errors import Problems, UserInputErrors

    try:
        spec = as_spec(study, overrides, name)
    except StructureErrors as exc:
        found = Problems()
        found.add(*exc.errors)
        if exc.salvaged is not None:
            rest = StudySpec(exc.salvaged, Path(study) if not isinstance(study, StudySpec) else study.path, "")
            if found.check(use_data_dir, data_dir, rest) is None and not found.errors[len(exc.errors):]:
                found.check(checked_plan, rest)
        raise UserInputErrors(in_file_order(found.errors, exc.raw)) from None
    use_data_dir(data_dir, spec)
    return spec


def use_data_dir(folder: str | Path | None, spec: StudySpec | None = None) -> None:
    """`--data-dir`: the data folder of this process and of the trials it starts ($ORCHESTRATOR_DATA_DIR for
    them). A study file that names a folder of its own must name the same one, so the option is never
    silently ignored."""
    if folder is None:
        return
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise UserInputError("--data-dir", str(folder), "give an existing folder in the layout of shared/data")
    own_folder = spec.config.data_dir if spec is not None else None
    if spec is not None and own_folder:
        own = (spec.base_dir / Path(own_folder).expanduser()).resolve()
        if own != path:
            raise UserInputError("--data-dir", str(folder), f"the study file sets data_dir: {own_folder} ({own}); "
                                                            "remove one of the two")
    os.environ["ORCHESTRATOR_DATA_DIR"] = str(path)


def checked_plan(spec: StudySpec, stage_root: Path | None = None) -> StudyPlan:
    """Every trial of the study resolved and checked, before anything runs (the deep checks); `stage_root`:
    the shared stages' cache of the study folder it will run in (a launch can then use this very plan)."""
    from orchestrator.checks.estimate import check_pilot
    from orchestrator.study.config import in_file_order
    from orchestrator.study.plan import build_plan
    from trainables.errors import UserInputErrors

    try:
        resolved = build_plan(spec.config, spec.base_dir, stage_root=stage_root)
    except UserInputErrors as exc:  # said in the order of the keys in the file
        raise UserInputErrors(in_file_order(exc.errors, spec.raw())) from None
    check_pilot(resolved)  # a budget needs a pilot that can time the kind
    return resolved


@dataclass(frozen=True)
class Plan:
    """What a study will run: its cells (one row each: the cell, its axis values, tuning trials and
    replicates), what is tuned and over which seeds, the trial counts, the data set a study declares
    (its splits' rows and sha256) and the plugins it uses. `estimate` and `pilot` (the deepest cell's
    timings) are there when asked for."""

    name: str
    trainable: str
    task: str
    models: list[str]
    cells: pd.DataFrame
    tuned: dict[str, str]
    seeds: list[int]
    metric: str
    mode: str
    tuning_trials: int
    replicate_trials: int
    round_name: str  # what one report of a trial covers: epoch, cycle or round
    rounds_per_trial: int
    max_trial_rounds: int
    cpu_per_trial: float
    budget_hours: float | None = None
    declared_data: list[DataRecord] = field(default_factory=list)
    plugins: list[PluginRecord] = field(default_factory=list)
    estimate: Estimate | None = None
    pilot: Pilot | None = None
    estimate_kept: Path | None = None  # the study folder that keeps the estimate for the launch's record
    fusion: str = ""  # how the trials train: fused arrays (`resources.fuse`) or each alone, and why

    @property
    def trials(self) -> int:
        return self.tuning_trials + self.replicate_trials


def make_plan(spec: StudySpec, resolved: StudyPlan, estimate: bool = False,
              folder: StudyFolder | None = None) -> Plan:
    """The `Plan` of a checked study; `estimate` runs the pilot and keeps its figures in `folder` (the study's,
    when it can be written) for a launch of the same study file to record."""
    import pandas as pd

    from trainables.data.declaration import DataDeclaration
    from trainables.data.tasks import task_name

    cells = pd.DataFrame([{"index": c.index, "cell": c.key, **c.values, "tuning_trials": resolved.trials_per_cell,
                           "replicates": len(resolved.seeds)} for c in resolved.cells])
    found = pilot = None
    if estimate:
        from orchestrator.checks.estimate import estimate as estimate_plan
        from orchestrator.checks.estimate import estimate_summary, pilots_per_cell

        pilots = pilots_per_cell(resolved)
        found = estimate_plan(resolved, pilots)
        pilot = max(pilots.values(), key=lambda p: p.unit_s * p.units_per_round)
    config = spec.config
    kept = None
    if found is not None:
        folder = folder or StudyFolder.of(config)
        if folder.unwritable() is None:
            folder.save_estimate(spec.text, estimate_summary(found, "plan"))
            kept = folder.folder
    return Plan(config.name, config.trainable, task_name(config.task), models_of(config), cells,
                {k: str(v) for k, v in resolved.tuned.items()}, list(resolved.seeds), resolved.metric, resolved.mode,
                resolved.tuning_trials, resolved.replicate_trials, resolved.round_name, resolved.epochs,
                resolved.max_trial_epochs, config.resources.cpu,
                config.budget.hours if config.budget is not None else None,
                list(resolved.data) if isinstance(config.task, DataDeclaration) else [], list(resolved.plugins),
                found, pilot, kept,
                summary(resolved.fusion, [c.key for c in resolved.cells]) if resolved.fusion else "")
