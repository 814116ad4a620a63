"""The public Python API, re-exported by the `orchestrator` package: everything the command line does,
as functions that return Python objects. The `orchestrator` command is a thin layer over these.

    import orchestrator as orc

    study = orc.load_study("examples/quickstart.yaml", overrides=["train.epochs=1"])  # validated
    orc.plan(study).cells                     # one row per ablation cell
    orc.launch(study)                         # blocks; the journal, MLflow runs and report of the CLI
    runs = orc.results("quickstart")          # one row per trial run; curves=True: one per epoch
    orc.report("quickstart").tables["ablation"]
    orc.verify("reports/quickstart").ok

Input a user can fix raises `UserInputError` whose text is the one line the CLI prints after `error:`.
A launch stopped by Ctrl-C (a notebook's interrupt) or SIGTERM raises `StudyInterrupted`, a
`KeyboardInterrupt`, once every finished trial is safe: `orc.resume(name)` continues it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.study.config import StudySpec, models_of, read_study
from orchestrator.study.handle import Study, studies_in
from trainables.errors import UserInputError

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

    from orchestrator.checks.doctor import Check
    from orchestrator.checks.estimate import Estimate, Pilot
    from orchestrator.run.launcher import LaunchResult
    from orchestrator.run.reproduce import Reproduction, Rerun
    from orchestrator.study.plan import StudyPlan
    from orchestrator.study.state import StudyState
    from reports.build import Report
    from reports.record import DataRecord, PluginRecord

__all__ = ["Plan", "Status", "StudyInterrupted", "Verification", "doctor", "launch", "list_studies", "load_study",
           "plan", "probe", "report", "reproduce", "rerun", "results", "resume", "schema", "status", "sync", "verify"]

Storage = str | Path | None


class StudyInterrupted(KeyboardInterrupt):
    """A launch or resume stopped (Ctrl-C, a notebook's interrupt, SIGTERM) before every planned trial
    finished. Every finished trial is kept in the journal and MLflow; `resume(name)` continues."""

    def __init__(self, result: LaunchResult) -> None:
        self.result = result
        super().__init__(f"{result.study_dir.name}: interrupted; continue with "
                         f"orchestrator.resume({result.study_dir.name!r}) or `orchestrator resume "
                         f"{result.study_dir.name}`")


# --- study files and plans ------------------------------------------------------------------------


def load_study(path: str | Path, overrides: Sequence[str] = (), *, name: str | None = None,
               data_dir: str | Path | None = None, check: bool = True) -> StudySpec:
    """Read a study file, apply `overrides` (`["train.lr=3e-5", "replicate.seeds=[0,1,2]"]`, values read as
    YAML; `~KEY` removes a key) and a new `name`, and validate the result as `orchestrator validate` does:
    keys, types, names, layers against the model, data and the tracking store (`check=False`: the
    file's structure only; `launch` checks the rest before it writes anything). `data_dir`: the data
    folder of this process and the trials it starts, as `--data-dir`."""
    spec = read_checked(path, overrides, name, data_dir)
    if check:
        checked_plan(spec)
    return spec


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


def checked_plan(spec: StudySpec) -> StudyPlan:
    """Every trial of the study resolved and checked, before anything runs (the deep checks)."""
    from orchestrator.checks.estimate import check_pilot
    from orchestrator.study.config import in_file_order
    from orchestrator.study.plan import build_plan
    from trainables.errors import UserInputErrors

    try:
        resolved = build_plan(spec.config, spec.base_dir)
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

    @property
    def trials(self) -> int:
        return self.tuning_trials + self.replicate_trials


def plan(study: StudySpec | str | Path, overrides: Sequence[str] = (), *, name: str | None = None,
         estimate: bool = False, data_dir: str | Path | None = None, storage: Storage = None) -> Plan:
    """The study's plan (a loaded study, or a study file with `overrides` and a new `name`), validated as
    `orchestrator validate` does and as `orchestrator plan` shows it; `estimate` runs a short pilot on
    this machine and estimates trial-hours and wall time (as `plan --estimate`), kept in the study's
    folder under `storage` so that a launch of the same study file records it (its report puts it beside
    what the study spent)."""
    import pandas as pd

    from trainables.data.declaration import DataDeclaration
    from trainables.data.tasks import task_name

    spec = read_checked(study, overrides, name, data_dir)
    resolved = checked_plan(spec)
    cells = pd.DataFrame([{"index": c.index, "cell": c.key, **c.values, "tuning_trials": resolved.trials_per_cell,
                           "replicates": len(resolved.seeds)} for c in resolved.cells])
    found = pilot = None
    if estimate:
        from orchestrator.checks.estimate import estimate as estimate_plan
        from orchestrator.checks.estimate import pilots_per_cell

        pilots = pilots_per_cell(resolved)
        found = estimate_plan(resolved, pilots)
        pilot = max(pilots.values(), key=lambda p: p.unit_s * p.units_per_round)
    config = spec.config
    kept = None
    if found is not None:
        from orchestrator.checks.estimate import save_estimate
        from orchestrator.study.folder import study_dir, unwritable

        folder = study_dir(storage or config.storage_path, config.name)
        if unwritable(folder) is None:
            save_estimate(folder, spec.text, found)
            kept = folder
    return Plan(config.name, config.trainable, task_name(config.task), models_of(config), cells,
                {k: str(v) for k, v in resolved.tuned.items()}, list(resolved.seeds), resolved.metric, resolved.mode,
                resolved.tuning_trials, resolved.replicate_trials, resolved.round_name, resolved.epochs,
                resolved.max_trial_epochs, config.resources.cpu,
                config.budget.hours if config.budget is not None else None,
                list(resolved.data) if isinstance(config.task, DataDeclaration) else [], list(resolved.plugins),
                found, pilot, kept)


def as_spec(study: StudySpec | str | Path, overrides: Sequence[str], name: str | None) -> StudySpec:
    """A loaded study as it is, or a study file read with its overrides."""
    if isinstance(study, StudySpec):
        if overrides or name is not None:
            raise UserInputError("overrides", list(overrides) or name, "give them to load_study, which read "
                                                                       "this study, or pass the study file's path")
        return study
    return read_study(study, overrides, name)


def schema() -> dict[str, Any]:
    """The JSON Schema of the study file (for editor completion)."""
    from orchestrator.study.config import study_json_schema

    return study_json_schema()


# --- running ----------------------------------------------------------------------------------------


def launch(study: StudySpec | str | Path, overrides: Sequence[str] = (), *, name: str | None = None,
           address: str | None = None, storage: Storage = None, max_concurrent: int | None = None,
           resume: bool = False, progress: bool = True) -> LaunchResult:
    """Run a study (a loaded study, or a study file with `overrides` and a new `name`) on Ray Tune — a
    fresh local Ray unless `address` or RAY_ADDRESS — to the end, then write its report to
    `reports/<name>`: the same study folder, journal, MLflow runs and report as `orchestrator launch`.
    `resume`: continue a study of that name that exists already (changes that extend it run only the new
    work). Raises `StudyInterrupted` when stopped first."""
    from orchestrator.run import launcher

    spec = as_spec(study, overrides, name)
    return finished(launcher.launch(spec, storage=storage, address=address, max_concurrent=max_concurrent,
                                    resume=resume, progress=progress))


def resume(name: str, overrides: Sequence[str] = (), *, storage: Storage = None, address: str | None = None,
           max_concurrent: int | None = None, progress: bool = True,
           data_dir: str | Path | None = None) -> LaunchResult:
    """Continue an interrupted study from its folder: finished trials are kept, interrupted ones continue
    from their last checkpoint. `overrides` may extend it (more seeds, trials or axis values); one that
    would invalidate finished work is refused, as an edited study file is."""
    from orchestrator.run import launcher

    use_data_dir(data_dir)
    return finished(launcher.resume(name, storage=storage, address=address, max_concurrent=max_concurrent,
                                    progress=progress, overrides=overrides))


def finished(result: LaunchResult) -> LaunchResult:
    """The launch with its report (none while MLflow is unreachable: `sync`, then `report`), or
    `StudyInterrupted` when it stopped before the end."""
    if not result.finished:
        raise StudyInterrupted(result)
    if result.reconciled.get("unsynced"):
        return result
    return replace(result, report=report(result.study_dir.name, storage=result.study_dir.parent))


def sync(name: str, *, storage: Storage = None) -> dict[str, int]:
    """Replay a study's journal into MLflow (runs, epochs and outcomes an outage missed) and close its
    runs; counts of what it created, logged, closed and marked KILLED."""
    from orchestrator.run import launcher

    return launcher.sync(name, storage)


# --- reading a study --------------------------------------------------------------------------------


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
        from orchestrator.run.progress import status_record

        return {**status_record(self.state), "running_now": self.running_now, "folder": str(self.folder),
                "folder_bytes": self.folder_bytes}

    def table(self) -> Table:
        """The table `orchestrator status` prints (rich)."""
        from orchestrator.run.progress import status_table

        return status_table(self.state)


def status(name: str, *, storage: Storage = None) -> Status:
    """Trials done, running and failed, and the best dev score per cell, as `orchestrator status`."""
    import pandas as pd

    from orchestrator.run.progress import status_record

    study = Study.named(name, storage).require()
    state = study.state()
    record = status_record(state)
    return Status(study.name, study.folder, state.is_complete(), state.counts(), pd.DataFrame(record["cells"]),
                  study.is_running(), study.size(), state)


def storage_folder(storage: Storage = None) -> Path:
    """The folder of study folders: `storage`, else ./studies."""
    return Study.named("x", storage).storage


def list_studies(*, storage: Storage = None) -> list[dict[str, Any]]:
    """The studies in a storage folder: each one's name, state (finished, running now, interrupted, not
    started or damaged) and trial counts, as `orchestrator list`."""
    rows: list[dict[str, Any]] = []
    for study in studies_in(storage):
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


def results(name: str, *, storage: Storage = None, phase: str | None = None,
            cell: str | Mapping[str, Any] | None = None, curves: bool = False) -> pd.DataFrame:
    """A study's trials as one tidy DataFrame, from its folder's journal and its MLflow store (no data,
    model or torch needed): one row per trial run with the study, its cell and axes as columns, phase,
    seed, outcome, the best dev score and its epoch, the test scores (replicates), epochs run, the tuned
    parameters, the parameter count, duration and MLflow `run_id`.

    `phase`: "tune" or "replicate"; `cell`: a cell key ("layer=3") or some of its axis values
    ({"layer": 3}). `curves=True`: one row per trial run and epoch, its training loss and dev scores,
    e.g. `seaborn.lineplot(data=curves, x="epoch", y="dev_spearman", hue="layer")`."""
    from orchestrator.study.frames import results as read_results

    return read_results(name, storage, phase=phase, cell=cell, curves=curves)


# --- reports -----------------------------------------------------------------------------------------


def report(names: str | Sequence[str], *, storage: Storage = None, tracking_uri: str | None = None,
           out: str | Path | None = None, formats: Sequence[str] | None = None, bundle: bool = False) -> Report:
    """Write the report of one study (or one report across several, the study an axis of its tables) to
    `out` (default `reports/NAME` or `reports/A+B`) from their MLflow runs, as `orchestrator report`:
    the tables as DataFrames (`.tables`), the per-cell summary, the tests against the baseline and the
    files written. `formats`: some of markdown, latex, csv (default: the study's `report.formats`).
    `bundle`: also one archive for a paper's supplementary material beside the folder (`OUT-bundle.tar.gz`:
    the report, study file, record, locked environment, data hashes, the code, a README per cell)."""
    from reports.build import FORMATS, make_report
    from reports.collect import collect, combine

    names = [names] if isinstance(names, str) else list(names)
    bad = [f for f in formats or () if f not in FORMATS]
    if bad:
        raise UserInputError("formats", bad[0], f"use some of {', '.join(FORMATS)}")
    if bundle and len(names) > 1:
        raise UserInputError("--bundle", " ".join(names), "a bundle holds one study: bundle each study's report")
    folder = Path(out) if out else Path("reports") / "+".join(names)
    if folder.exists() and not folder.is_dir():  # before any store is read
        raise UserInputError("--out", str(folder), "it is a file: give a folder (the report writes its files into "
                                                   "it, next to any of yours)")
    collected = []
    for name in names:
        study = Study.named(name, storage)
        collected.append(collect(tracking_uri or study.tracking_uri, name, study.study_uid))
    runs = collected[0] if len(collected) == 1 else combine(collected)
    written = make_report(runs, folder, tuple(formats) if formats else None)
    if not bundle:
        return written
    from dataclasses import replace

    from reports.bundle import write_bundle

    if runs.record is None or not runs.record.data:
        raise UserInputError("--bundle", runs.name, "the study ran before the orchestrator recorded its data hashes "
                                                    "and environment; launch it again to bundle it")
    return replace(written, bundle=write_bundle(runs, folder, folder.parent / f"{folder.name}-bundle.tar.gz"))


def reproduce(folder: str | Path, *, cell: str, seed: int, data_dir: str | Path | None = None,
              tolerance: float = 1e-6) -> Reproduction:
    """Rerun one replicate of a report (its folder, or an unpacked bundle) from its stored config and seed,
    after checking that the data's rows and the model's weights are the study's, as `orchestrator
    reproduce`: the reported and recomputed scores (`.reported`, `.recomputed`), whether they match within
    `tolerance` (`.matches`) and, when they do not, how this environment differs from the launch's."""
    from orchestrator.run.reproduce import reproduce as rerun

    return rerun(folder, cell, seed, str(data_dir) if data_dir is not None else None, tolerance)


@dataclass(frozen=True)
class Verification:
    """A report checked against MLflow: `problems` names each number that differs (none: `ok`)."""

    folder: Path
    cells: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def rerun(folder: str | Path, count: int, *, draw_seed: int = 0, data_dir: str | Path | None = None,
          tolerance: float = 1e-6) -> list[Rerun]:
    """Rerun `count` replicates of a report drawn at random (`draw_seed`), each as `reproduce` reruns
    one, as `orchestrator verify --rerun`: each one's difference from what it reported, set against its
    cell's seed-to-seed sd (`.share(name)`); on a CPU the differences are 0, on a GPU they measure the
    nondeterminism a reader should know about."""
    from orchestrator.run.reproduce import rerun_sample

    return rerun_sample(folder, count, draw_seed, str(data_dir) if data_dir is not None else None, tolerance)


def verify(folder: str | Path, *, tracking_uri: str | None = None) -> Verification:
    """Recompute every number of a written report from MLflow, as `orchestrator verify`."""
    import pandas as pd

    from reports.build import PROVENANCE
    from reports.verify import verify as verify_report

    path = Path(folder)
    if not (path / PROVENANCE).exists():
        raise UserInputError("FOLDER", str(folder), f"no {PROVENANCE} there: give a folder written by "
                                                    "`orchestrator report`")
    problems = verify_report(path, tracking_uri)
    cells = len(pd.read_csv(path / "cells.csv")) if (path / "cells.csv").exists() else 0
    return Verification(path, cells, problems)


# --- models and machines ----------------------------------------------------------------------------


def probe(model: str, *, task: str = "stsb", language: str | None = None, split: str = "test",
          pooling: str = "mean", layers: Sequence[int] | None = None, data_dir: str | None = None,
          max_seq_length: int = 128, precision: str = "auto", device: str = "auto", suite: str | None = None,
          max_eval_samples: int | None = None) -> pd.DataFrame:
    """Zero-shot layer profile of an encoder, as `orchestrator probe`: every layer (or `layers`) pooled
    and scored in one forward pass per batch; one row per layer with its scores (Spearman x100) and
    parameter count. `suite="sts"` scores STS12-16, STS-B and SICK-R (test) and their average instead."""
    import pandas as pd

    from trainables.contract import parse_config
    from trainables.evaluation.probe import probe_layers, probe_suite
    from trainables.evaluation.sts_suite import suite_tasks
    from trainables.kinds.probe import ProbeConfig

    if split not in ("dev", "test"):
        raise UserInputError("--split", split, "use dev or test")
    if suite is not None:
        suite_tasks(suite)
    cfg = parse_config(ProbeConfig, dict(
        model=model, task=task, language=language, layers=list(layers) if layers is not None else None,
        pooling=pooling, splits=[split], max_seq_length=max_seq_length, precision=precision, device=device,
        data_dir=data_dir, max_eval_samples=max_eval_samples))
    check_probed_model(model, pooling, layers)
    if suite is not None:
        return pd.DataFrame(probe_suite(cfg, suite))
    return pd.DataFrame([{k.removeprefix(f"{split}_"): v for k, v in row.items()} for row in probe_layers(cfg)])


def check_probed_model(model: str, pooling: str, layers: Sequence[int] | None) -> None:
    """The probe's model checked as a study's is, before any data is read: its architecture in the layer
    table, the pooling one it can take, its layers its entry's (cached once per model files)."""
    from trainables.models.architectures import refuse_pooling, require_architecture
    from trainables.models.files import model_config, model_depth
    from trainables.models.layer_check import check_model_layers

    require_architecture(model, "--model")
    refuse_pooling(model_config(model), pooling, "--pooling")
    depth = model_depth(model)  # a layer the model lacks is the probe's own one line, after this
    check_model_layers(model, [k for k in layers if 0 <= k <= depth] if layers is not None else None)


def doctor(*, address: str | None = None, study: str | Path | None = None, storage: Storage = None,
           data_dir: str | Path | None = None, tracking_uri: str | None = None) -> list[Check]:
    """Check the cluster (nodes, resources, versions), storage from every node, a tracking server
    (`tracking_uri`, or the study's when it is a server: it answers, its backend takes writes, its artifact
    store is writable from every node, the latency of a request) and, with `study`, its model, data and
    tracker (else the data folder), as `orchestrator doctor`: one `Check` (name, ok, detail) each."""
    from orchestrator.checks.doctor import Check, cluster_checks, study_checks, tracking_checks
    from orchestrator.run.launcher import connect_ray
    from orchestrator.study.config import load_study as read_config
    from orchestrator.study.folder import DEFAULT_STORAGE

    use_data_dir(data_dir)
    checks: list[Check] = []
    config = None
    if study:
        checks += study_checks(Path(study))
        try:
            config = read_config(study)
        except UserInputError:
            config = None
    folder = Path(storage or (config.storage_path if config and config.storage_path else DEFAULT_STORAGE))
    ray = None
    try:
        ray = connect_ray(address)
        checks += cluster_checks(ray, folder.expanduser().resolve(),
                                 config.resources.gpu if config else 0.0, config.resources.cpu if config else 1.0)
    except UserInputError as exc:
        checks.append(Check("ray cluster", False, str(exc)))
    server = tracking_uri or (config.tracking.mlflow_uri if config else None)
    if server and (tracking_uri or server.startswith(("http://", "https://"))):  # a study's SQLite: checked above
        checks += tracking_checks(server, ray, Path.cwd() if tracking_uri or not study else Path(study).parent)
    if not study:
        from trainables.data.tasks import data_dir as data_folder

        data = data_folder()
        if data is None:
            checks.append(Check("data folder", True, "none here: tasks load from the Hugging Face hub"))
        else:
            checks.append(Check("data folder", data.is_dir(), str(data) if data.is_dir() else
                                f"{data} does not exist; give --data-dir or set ORCHESTRATOR_DATA_DIR to the "
                                "data folder"))
    return checks


# --- arguments -------------------------------------------------------------------------------------

_PATHLIKE = (str, os.PathLike)
# What each annotation of the public functions admits, checked before a function runs: a notebook's wrong
# type is one UserInputError naming the argument, not a TypeError from deep inside
_ADMITS: dict[str, tuple[str, Any]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "str | None": ("a string or None", lambda v: v is None or isinstance(v, str)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "bool": ("True or False", lambda v: isinstance(v, bool)),
    "str | Path": ("a path (str or Path)", lambda v: isinstance(v, _PATHLIKE)),
    "str | Path | None": ("a path (str or Path) or None", lambda v: v is None or isinstance(v, _PATHLIKE)),
    "Storage": ("a folder (str or Path) or None", lambda v: v is None or isinstance(v, _PATHLIKE)),
    "StudySpec | str | Path": ("a study from load_study or a study file's path",
                               lambda v: isinstance(v, StudySpec | str | os.PathLike)),
    "Sequence[str]": ("a list of strings such as ['train.lr=3e-5']",
                      lambda v: isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)),
    "str | Sequence[str]": ("a study name or a list of names", lambda v: isinstance(v, str) or (
        isinstance(v, list | tuple) and all(isinstance(x, str) for x in v))),
    "Sequence[str] | None": ("a list of strings or None", lambda v: v is None or (
        isinstance(v, list | tuple) and all(isinstance(x, str) for x in v))),
    "Sequence[int] | None": ("a list of integers or None", lambda v: v is None or (
        isinstance(v, list | tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v))),
}


def _checked_arguments(function: Any) -> Any:
    """`function` with its arguments checked against the annotations above before it runs."""
    import functools
    import inspect

    signature = inspect.signature(function)
    checks = {name: _ADMITS[str(p.annotation)] for name, p in signature.parameters.items()
              if str(p.annotation) in _ADMITS}

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise UserInputError(function.__name__, "arguments", f"{exc}: see help(orchestrator.{function.__name__})"
                                 ) from None
        for name, value in bound.arguments.items():
            if name in checks and not checks[name][1](value):
                raise UserInputError(name, value if isinstance(value, str | int | float | None) else
                                     type(value).__name__, f"give {checks[name][0]}")
        return function(*args, **kwargs)

    return wrapper


for _name in ("load_study", "plan", "launch", "resume", "sync", "status", "list_studies", "results", "report",
              "reproduce", "verify", "probe", "doctor"):
    globals()[_name] = _checked_arguments(globals()[_name])
