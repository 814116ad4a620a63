"""The public Python API, re-exported by the `orchestrator` package: everything the command line does,
as a `Study` you hold and as functions that return Python objects. The `orchestrator` command is a thin
layer over these.

    import orchestrator as orc

    study = orc.load_study("examples/quickstart.yaml", overrides=["train.epochs=1"])  # validated, planned once
    study.plan().cells                        # one row per ablation cell
    study.launch()                            # blocks; the journal, MLflow runs and report of the CLI
    runs = study.results()                    # one row per trial run; curves=True: one per epoch
    study.report().tables["ablation"]
    study.verify().ok

Each method is also a function that takes the study, its file or its name: `orc.launch(study)`,
`orc.results("quickstart")`, `orc.Study.named("quickstart").status()`.

Input a user can fix raises `UserInputError` whose text is the one line the CLI prints after `error:`.
A launch stopped by Ctrl-C (a notebook's interrupt) or SIGTERM raises `StudyInterrupted`, a
`KeyboardInterrupt`, once every finished trial is safe: `study.resume()` continues it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.checks.arguments import PATHLIKE, checked_arguments
from orchestrator.checks.validate import as_spec, checked_plan, make_plan, read_checked, use_data_dir
from orchestrator.run.probe import probe as probe  # the verb itself: no second signature to keep in step
from orchestrator.study.config import StudySpec
from orchestrator.study.folder import StudyFolder, storage_root, studies_in
from trainables.errors import UserInputError

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.checks.doctor import Check
    from orchestrator.checks.validate import Plan
    from orchestrator.run.launcher import LaunchResult
    from orchestrator.run.progress import Status
    from orchestrator.run.ray_session import Stops
    from orchestrator.run.reproduce import Reproduction, Rerun
    from orchestrator.study.config import StudyConfig
    from orchestrator.study.plan import StudyPlan
    from reports.build import Report

__all__ = ["Study", "StudyInterrupted", "Verification", "doctor", "launch", "list_studies", "load_study", "plan",
           "probe", "report", "reproduce", "rerun", "results", "resume", "schema", "status", "sync", "verify"]

Storage = str | Path | None


class StudyInterrupted(KeyboardInterrupt):
    """A launch or resume stopped (Ctrl-C, a notebook's interrupt, SIGTERM) before every planned trial
    finished. Every finished trial is kept in the journal and MLflow; `resume(name)` continues."""

    def __init__(self, result: LaunchResult) -> None:
        self.result = result
        super().__init__(f"{result.study_dir.name}: interrupted; continue with "
                         f"orchestrator.resume({result.study_dir.name!r}) or `orchestrator resume "
                         f"{result.study_dir.name}`")


# --- the handle -------------------------------------------------------------------------------------


class Study:
    """A study you hold: from its study file (`load_study`, checked and planned once) or from its folder
    (`Study.named(name)`, a study launched before), with every verb as a method. `folder` is its study
    folder (`StudyFolder`: the stored study file, journal, record and tracking store)."""

    def __init__(self, folder: StudyFolder, spec: StudySpec | None = None, checked: StudyPlan | None = None,
                 storage: Storage = None) -> None:
        self.folder = folder
        self.spec = spec  # its study file as loaded (None: opened by name)
        self._checked = checked  # the checked plan, built once for this folder
        self._storage = storage  # as the user gave it (None: the file's storage_path or ./studies)

    @classmethod
    def named(cls, name: str, storage: Storage = None) -> Study:
        """The study launched under `name` in `storage` (default ./studies)."""
        return cls(StudyFolder.named(name, storage), storage=storage)

    def __repr__(self) -> str:
        return f"Study({self.name!r}, folder={str(self.folder.folder)!r})"

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else self.folder.name

    @property
    def config(self) -> StudyConfig:
        """Its study file, validated: as loaded, or as stored in its folder."""
        return self.spec.config if self.spec is not None else self.folder.config()

    def _loaded(self, verb: str) -> StudySpec:
        if self.spec is None:
            raise UserInputError(verb, self.name, "a study opened by name has no study file of yours to run: load "
                                                  "it with orc.load_study(PATH), or call resume(), status(), "
                                                  "results() or report()")
        return self.spec

    def plan(self, *, estimate: bool = False) -> Plan:
        """What it will run, as `orchestrator plan` shows it (the plan `load_study` checked, not a second);
        `estimate`: a pilot on this machine, as `plan --estimate`, kept for the launch's record."""
        spec = self._loaded("plan")
        if self._checked is None:
            self._checked = checked_plan(spec, self.folder.stages)
        return make_plan(spec, self._checked, estimate, self.folder)

    def launch(self, *, address: str | None = None, max_concurrent: int | None = None, resume: bool = False,
               progress: bool = True, stops: Stops | None = None) -> LaunchResult:
        """Run it to the end and write its report, as `orchestrator launch` (see `orchestrator.launch`)."""
        from orchestrator.run import launcher

        spec = self._loaded("launch")
        return finished(launcher.launch(spec, storage=self._storage, address=address, max_concurrent=max_concurrent,
                                        resume=resume, progress=progress, checked=self._checked, stops=stops))

    def resume(self, overrides: Sequence[str] = (), *, address: str | None = None, max_concurrent: int | None = None,
               progress: bool = True, data_dir: str | Path | None = None, stops: Stops | None = None) -> LaunchResult:
        """Continue it from its folder, as `orchestrator resume` (see `orchestrator.resume`)."""
        return resume(self, overrides, address=address, max_concurrent=max_concurrent, progress=progress,
                      data_dir=data_dir, stops=stops)

    def status(self) -> Status:
        """Where it stands, as `orchestrator status`."""
        from orchestrator.run.progress import status_of

        return status_of(self.folder)

    def results(self, *, phase: str | None = None, cell: str | Mapping[str, Any] | None = None,
                curves: bool = False) -> pd.DataFrame:
        """Its trials as one tidy DataFrame (see `orchestrator.results`)."""
        from orchestrator.study.frames import results as read_results

        return read_results(self.folder.name, self.folder.storage, phase=phase, cell=cell, curves=curves)

    def report(self, *, tracking_uri: str | None = None, out: str | Path | None = None,
               formats: Sequence[str] | None = None, bundle: bool = False) -> Report:
        """Write its report, as `orchestrator report` (see `orchestrator.report`)."""
        return report(self, tracking_uri=tracking_uri, out=out, formats=formats, bundle=bundle)

    def verify(self, *, tracking_uri: str | None = None, out: str | Path | None = None) -> Verification:
        """Recompute every number of its written report (`out`, default reports/NAME) from MLflow."""
        return verify(out if out is not None else Path("reports") / self.name, tracking_uri=tracking_uri)

    def sync(self) -> dict[str, int]:
        """Replay its journal into MLflow, as `orchestrator sync`."""
        return sync(self)


def _named(study: Study | str, storage: Storage) -> tuple[str, Storage]:
    """A study's name and storage folder, from a `Study` or from a name and `storage`."""
    if isinstance(study, Study):
        if storage is not None and storage_root(storage) != study.folder.storage:
            raise UserInputError("storage", str(storage), f"the study {study.name} lives in {study.folder.storage}: "
                                                          "leave storage out, or pass the study's name")
        return study.name, study.folder.storage
    return study, storage


# --- study files and plans ------------------------------------------------------------------------


def load_study(path: str | Path, overrides: Sequence[str] = (), *, name: str | None = None,
               data_dir: str | Path | None = None, check: bool = True, storage: Storage = None) -> Study:
    """Read a study file, apply `overrides` (`["train.lr=3e-5", "replicate.seeds=[0,1,2]"]`, values read as
    YAML; `~KEY` removes a key) and a new `name`, and validate the result as `orchestrator validate` does:
    keys, types, names, layers against the model, data and the tracking store, building its plan once
    (`check=False`: the file's structure only; `launch` checks the rest before it writes anything).
    `data_dir`: the data folder of this process and the trials it starts, as `--data-dir`; `storage`: the
    folder of study folders it runs in (default: the file's `storage_path`, else ./studies)."""
    spec = read_checked(path, overrides, name, data_dir)
    folder = StudyFolder.of(spec.config, storage)
    return Study(folder, spec, checked_plan(spec, folder.stages) if check else None, storage)


def plan(study: Study | StudySpec | str | Path, overrides: Sequence[str] = (), *, name: str | None = None,
         estimate: bool = False, data_dir: str | Path | None = None, storage: Storage = None) -> Plan:
    """The study's plan (a loaded study, or a study file with `overrides` and a new `name`), validated as
    `orchestrator validate` does and as `orchestrator plan` shows it; `estimate` runs a short pilot on
    this machine and estimates trial-hours and wall time (as `plan --estimate`), kept in the study's
    folder under `storage` so that a launch of the same study file records it (its report puts it beside
    what the study spent)."""
    if isinstance(study, Study) and not overrides and name is None and storage is None:
        use_data_dir(data_dir, study.spec)
        return study.plan(estimate=estimate)
    spec = read_checked(study._loaded("plan") if isinstance(study, Study) else study, overrides, name, data_dir)
    folder = StudyFolder.of(spec.config, storage)
    return make_plan(spec, checked_plan(spec, folder.stages), estimate, folder)


def schema() -> dict[str, Any]:
    """The JSON Schema of the study file (for editor completion)."""
    from orchestrator.study.config import study_json_schema

    return study_json_schema()


# --- running ----------------------------------------------------------------------------------------


def launch(study: Study | StudySpec | str | Path, overrides: Sequence[str] = (), *, name: str | None = None,
           address: str | None = None, storage: Storage = None, max_concurrent: int | None = None,
           resume: bool = False, progress: bool = True, stops: Stops | None = None) -> LaunchResult:
    """Run a study (a loaded study, or a study file with `overrides` and a new `name`) on Ray Tune — a
    fresh local Ray unless `address` or RAY_ADDRESS — to the end, then write its report to
    `reports/<name>`: the same study folder, journal, MLflow runs and report as `orchestrator launch`.
    `resume`: continue a study of that name that exists already (changes that extend it run only the new
    work). Raises `StudyInterrupted` when stopped first. `stops` (an `orchestrator.Stops`): where the stop
    signal that ended it early is kept, and what to call when the local Ray is stopped under it."""
    from orchestrator.run import launcher

    if isinstance(study, Study) and not overrides and name is None and (
            storage is None or storage_root(storage) == study.folder.storage):
        return study.launch(address=address, max_concurrent=max_concurrent, resume=resume, progress=progress,
                            stops=stops)
    spec = as_spec(study._loaded("launch") if isinstance(study, Study) else study, overrides, name)
    return finished(launcher.launch(spec, storage=storage, address=address, max_concurrent=max_concurrent,
                                    resume=resume, progress=progress, stops=stops))


def resume(name: Study | str, overrides: Sequence[str] = (), *, storage: Storage = None, address: str | None = None,
           max_concurrent: int | None = None, progress: bool = True,
           data_dir: str | Path | None = None, stops: Stops | None = None) -> LaunchResult:
    """Continue an interrupted study from its folder: finished trials are kept, interrupted ones continue
    from their last checkpoint. `overrides` may extend it (more seeds, trials or axis values); one that
    would invalidate finished work is refused, as an edited study file is."""
    from orchestrator.run import launcher

    name, storage = _named(name, storage)
    use_data_dir(data_dir)
    return finished(launcher.resume(name, storage=storage, address=address, max_concurrent=max_concurrent,
                                    progress=progress, overrides=overrides, stops=stops))


def finished(result: LaunchResult) -> LaunchResult:
    """The launch with its report (none while MLflow is unreachable: `sync`, then `report`), or
    `StudyInterrupted` when it stopped before the end."""
    if not result.finished:
        raise StudyInterrupted(result)
    if result.reconciled.get("unsynced"):
        return result
    return replace(result, report=report(result.study_dir.name, storage=result.study_dir.parent))


def sync(name: Study | str, *, storage: Storage = None) -> dict[str, int]:
    """Replay a study's journal into MLflow (runs, epochs and outcomes an outage missed) and close its
    runs; counts of what it created, logged, closed and marked KILLED."""
    from orchestrator.run import launcher

    return launcher.sync(*_named(name, storage))


# --- reading a study --------------------------------------------------------------------------------


def status(name: Study | str, *, storage: Storage = None) -> Status:
    """Trials done, running and failed, and the best dev score per cell, as `orchestrator status`."""
    from orchestrator.run.progress import status_of

    return status_of(StudyFolder.named(*_named(name, storage)))


def storage_folder(storage: Storage = None) -> Path:
    """The folder of study folders: `storage`, else ./studies."""
    return storage_root(storage)


def list_studies(*, storage: Storage = None) -> list[dict[str, Any]]:
    """The studies in a storage folder: each one's name, state (finished, running now, interrupted, not
    started or damaged) and trial counts, as `orchestrator list`."""
    from orchestrator.run.progress import listing

    return listing(studies_in(storage))


def results(name: Study | str, *, storage: Storage = None, phase: str | None = None,
            cell: str | Mapping[str, Any] | None = None, curves: bool = False) -> pd.DataFrame:
    """A study's trials as one tidy DataFrame, from its folder's journal and its MLflow store (no data,
    model or torch needed): one row per trial run with the study, its cell and axes as columns, phase,
    seed, outcome, the best dev score and its epoch, the test scores (replicates), epochs run, the tuned
    parameters, the parameter count, duration and MLflow `run_id`.

    `phase`: "tune" or "replicate"; `cell`: a cell key ("layer=3") or some of its axis values
    ({"layer": 3}). `curves=True`: one row per trial run and epoch, its training loss and dev scores,
    e.g. `seaborn.lineplot(data=curves, x="epoch", y="dev_spearman", hue="layer")`."""
    from orchestrator.study.frames import results as read_results

    name, storage = _named(name, storage)
    return read_results(name, storage, phase=phase, cell=cell, curves=curves)


# --- reports -----------------------------------------------------------------------------------------


def report(names: Study | str | Sequence[str], *, storage: Storage = None, tracking_uri: str | None = None,
           out: str | Path | None = None, formats: Sequence[str] | None = None, bundle: bool = False) -> Report:
    """Write the report of one study (or one report across several, the study an axis of its tables) to
    `out` (default `reports/NAME` or `reports/A+B`) from their MLflow runs, as `orchestrator report`:
    the tables as DataFrames (`.tables`), the per-cell summary, the tests against the baseline and the
    files written. `formats`: some of markdown, latex, csv (default: the study's `report.formats`).
    `bundle`: also one archive for a paper's supplementary material beside the folder (`OUT-bundle.tar.gz`:
    the report, study file, record, locked environment, data hashes, the code, a README per cell)."""
    from reports.build import FORMATS, make_report
    from reports.collect import collect, combine

    if isinstance(names, Study):
        names, storage = _named(names, storage)
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
        folder_of = StudyFolder.named(name, storage)
        collected.append(collect(tracking_uri or folder_of.tracking_uri, name, folder_of.study_uid))
    runs = collected[0] if len(collected) == 1 else combine(collected)
    written = make_report(runs, folder, tuple(formats) if formats else None)
    if not bundle:
        return written
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


def doctor(*, address: str | None = None, study: str | Path | None = None, storage: Storage = None,
           data_dir: str | Path | None = None, tracking_uri: str | None = None) -> list[Check]:
    """Check the cluster (nodes, resources, versions), storage from every node, a tracking server
    (`tracking_uri`, or the study's when it is a server: it answers, its backend takes writes, its artifact
    store is writable from every node, the latency of a request) and, with `study`, its model, data and
    tracker (else the data folder), as `orchestrator doctor`: one `Check` (name, ok, detail) each."""
    from orchestrator.checks.doctor import Check, cluster_checks, study_checks, tracking_checks
    from orchestrator.run.ray_session import connect_ray
    from orchestrator.study.config import load_study as read_config

    use_data_dir(data_dir)
    checks: list[Check] = []
    config = None
    if study:
        checks += study_checks(Path(study))
        try:
            config = read_config(study)
        except UserInputError:
            config = None
    folder = storage_root(storage, config)
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

_OWN_TYPES: dict[str, tuple[str, Any]] = {  # the API's own annotations, beside checks/arguments.py's
    "Study | StudySpec | str | Path": ("a Study from load_study or a study file's path",
                                       lambda v: isinstance(v, (Study, StudySpec, *PATHLIKE))),
    "Study | str": ("a Study or a study's name", lambda v: isinstance(v, Study | str)),
    "Study | str | Sequence[str]": ("a Study, a study's name or a list of names", lambda v: isinstance(
        v, Study | str) or (isinstance(v, list | tuple) and all(isinstance(x, str) for x in v))),
    "Stops | None": ("an orchestrator.Stops or None", lambda v: v is None or isinstance(v, _stops())),
}


def _stops() -> type:
    from orchestrator.run.ray_session import Stops

    return Stops

for _name in ("load_study", "plan", "launch", "resume", "sync", "status", "list_studies", "results", "report",
              "reproduce", "verify", "probe", "doctor"):
    globals()[_name] = checked_arguments(globals()[_name], _OWN_TYPES)
