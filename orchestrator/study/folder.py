"""A study folder (`<storage>/<name>/`) as one object, `StudyFolder`: its layout (every file name is here),
the storage rule, its one writer's lock, and every read and write of its state. Every verb asks it (`launch`
and `resume` write through it; `status`, `results`, `report`, `sync` and `ui` read it) instead of deriving
the folder's paths from a name; reading imports neither Ray nor torch, and never changes the folder.

State files are written atomically and read defensively (`orchestrator.study.files`): a damaged
`launch.json` is rebuilt from the journal's `launch` event; any other damaged file is one line naming it.
One process writes a folder at a time: `launch`, `resume` and `sync` hold an exclusive `flock` on `.lock`
while they run (the kernel drops it when the holder dies, so a stale lock is simply taken over)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.study.config import StudyConfig, load_study
from orchestrator.study.files import read_json, unwritable, write_atomic
from orchestrator.study.journal import Journal, ReadOnlyJournal, TrialRecord, full_disk_fix
from reports.environment import LOCK_FILE, environment_lock
from reports.record import LEGACY_PLAN_FILE, RECORD_FILE, StudyRecord
from trainables.errors import StorageFullError, UserInputError, storage_full

if TYPE_CHECKING:
    from orchestrator.study.plan import StudyPlan
    from orchestrator.study.state import StudyState

STUDY_FILE = "study.yaml"  # the study as a user may edit it between launches
LAUNCHED_FILE = "study.launched.yaml"  # the study as last accepted: what the journal's trials ran
META = "launch.json"  # study id, base folder, tracking URI
RECORD = RECORD_FILE  # the study record of the latest launch: status and report need no data, model or kind
PLAN = LEGACY_PLAN_FILE  # what folders from before records hold instead
JOURNAL = "journal.jsonl"
OPTUNA_LOG = "optuna.log"  # every cell's Optuna study, for `orchestrator ui NAME --optuna`
ESTIMATE = "estimate.json"  # `plan --estimate`'s figures, tied to the study file's text, for the launch's record
MODELS = "models"  # save: the kept models, one folder per cell and seed
STAGES = "stages"  # the shared stages' cache (adapted encoders, teachers), keyed by their configs
ARTIFACTS = "mlartifacts"  # MLflow artifacts of a SQLite-tracked study
RAY = "ray"  # Ray Tune's experiment folders, one per launch (`launch-N`): checkpoints of running trials
LOCK = ".lock"
DEFAULT_STORAGE = "studies"


def storage_root(storage: str | Path | None = None, config: StudyConfig | None = None) -> Path:
    """The folder of study folders, by the one rule every verb follows: `storage` (`--storage`), else the
    study file's `storage_path`, else ./studies."""
    chosen = storage or (config.storage_path if config is not None else None) or DEFAULT_STORAGE
    return Path(chosen).expanduser().resolve()


def study_dir(storage: str | Path | None, name: str) -> Path:
    return storage_root(storage) / name


@dataclass(frozen=True)
class BeforeLaunch:
    """What a launch or resume reads of the folder before it writes anything, read once (`StudyFolder.before`):
    whether a trial ran here, the last launch's metadata and accepted study file and record (a resume's), the
    study id a first launch that failed before its first trial left, and `plan --estimate` of this very file."""

    started: bool
    meta: dict[str, Any] | None
    accepted: StudyConfig | None
    record: StudyRecord | None
    unstarted_uid: str | None
    estimate: dict[str, float] | None


class StudyFolder:
    """A study folder. `StudyFolder.named("quickstart")` is `./studies/quickstart`; give `storage` for another
    folder of study folders, or `StudyFolder.of(config)` for the one a study file's `storage_path` names."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def __repr__(self) -> str:
        return f"StudyFolder({str(self.folder)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StudyFolder) and other.folder == self.folder

    def __hash__(self) -> int:
        return hash(self.folder)

    @classmethod
    def named(cls, name: str, storage: str | Path | None = None) -> StudyFolder:
        return cls(storage_root(storage) / name)

    @classmethod
    def of(cls, config: StudyConfig, storage: str | Path | None = None) -> StudyFolder:
        """The folder of a study file's study: under `storage`, else its `storage_path`, else ./studies."""
        return cls(storage_root(storage, config) / config.name)

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def storage(self) -> Path:
        return self.folder.parent

    # --- where its files are ----------------------------------------------------------------------

    @property
    def study_file(self) -> Path:
        """The study as run (command-line overrides merged in); a user may edit it before `resume`."""
        return self.folder / STUDY_FILE

    @property
    def launched_file(self) -> Path:
        """The study as last accepted: what the journal's trials ran; edits are checked against it."""
        return self.folder / LAUNCHED_FILE

    @property
    def journal_file(self) -> Path:
        return self.folder / JOURNAL

    @property
    def optuna_log(self) -> Path:
        return self.folder / OPTUNA_LOG

    @property
    def models(self) -> Path:
        return self.folder / MODELS

    @property
    def stages(self) -> Path:
        return self.folder / STAGES

    @property
    def artifacts(self) -> Path:
        return self.folder / ARTIFACTS

    @property
    def environment(self) -> Path:
        """The launch's locked environment (`environment.txt`: every distribution, `name==version`)."""
        return self.folder / LOCK_FILE

    @property
    def ray(self) -> Path:
        return self.folder / RAY

    # --- what it holds --------------------------------------------------------------------------

    def exists(self) -> bool:
        """Has a launch stored its study file here?"""
        return self.study_file.exists()

    def require(self) -> StudyFolder:
        """Itself, or the one line that says no study of that name lives in this storage folder."""
        if self.folder.is_dir() and not self.exists() and is_running(self.folder):  # being made this moment
            raise UserInputError("NAME", self.name, f"{holder(self.folder)} is making the study folder "
                                                    f"{self.folder} now; try again in a moment")
        if self.folder.is_dir() and not self.exists():  # its launch stopped while it made the folder
            raise UserInputError("NAME", self.name, f"the launch that made {self.folder} stopped before the study "
                                                    "began: nothing ran and there is nothing to resume; launch the "
                                                    "study file again")
        if not self.exists():
            raise UserInputError("NAME", self.name, f"no study folder {self.folder}; give --storage where it "
                                                    "was launched")
        return self

    def started(self) -> bool:
        """Has a launch issued a trial here? A folder whose first launch failed before that (the tracking
        store refused its parent run, Ray did not start) holds no result: a new launch takes it over."""
        try:
            with open(self.journal_file, "rb") as f:
                return any(b'"event": "issued"' in line for line in f)
        except FileNotFoundError:
            return False

    def config(self) -> StudyConfig:
        """The stored study file, validated (its kind's plugin need not be installed to read it)."""
        return load_study(self.require().study_file, launched=True)

    def accepted(self) -> StudyConfig | None:
        """What the journal's trials ran (None before any launch): edits are checked against it."""
        path = self.launched_file if self.launched_file.exists() else self.study_file
        return load_study(path) if path.exists() else None

    def meta(self) -> dict[str, Any] | None:
        """The launch's study id, base folder and tracking URI (None before any launch): `launch.json`, or
        the journal's last `launch` event when that file is missing or damaged."""
        if not self.folder.is_dir():
            return None
        with contextlib.suppress(UserInputError):
            if (self.folder / META).exists():
                return read_json(self.folder / META)
        launches = [e for e in Journal(self.journal_file, repair=False).events() if e.get("event") == "launch"]
        if not launches:
            if (self.folder / META).exists():
                return read_json(self.folder / META)  # damaged, and nothing to rebuild it from: say so
            return None
        return {k: v for k, v in launches[-1].items() if k not in ("event", "t")}

    @property
    def tracking_uri(self) -> str:
        """The MLflow store its launches log to."""
        meta = self.meta()
        if not meta or "tracking_uri" not in meta:
            raise UserInputError("NAME", self.name, f"no study folder {self.folder}; give --storage where it "
                                                    "was launched")
        return str(meta["tracking_uri"])

    @property
    def study_uid(self) -> str | None:
        """The id that ties the folder to its own MLflow parent run (None for folders from before)."""
        meta = self.meta()
        return meta.get("study_uid") if meta else None

    def record(self, config: StudyConfig | None = None) -> StudyRecord | None:
        """The study record of its latest launch (`study_record.json`; a folder from before records: its
        `plan.json`, read as one with `config`'s name and kind), or None when no launch has written either."""
        if (self.folder / RECORD).exists():
            try:
                text = (self.folder / RECORD).read_text(encoding="utf-8")
            except UnicodeDecodeError:
                text = "damaged"
            return StudyRecord.from_json(text, str(self.folder / RECORD))
        if (self.folder / PLAN).exists():
            config = config or self.config()
            return StudyRecord.from_legacy(read_json(self.folder / PLAN), config.name, config.trainable)
        return None

    def saved_estimate(self, study_text: str) -> dict[str, float] | None:
        """The saved `plan --estimate` of exactly this study text (None when none ran, or for another text)."""
        try:
            saved = json.loads((self.folder / ESTIMATE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.pop("study_sha256", None) != _sha256(study_text):
            return None
        return {k: float(v) for k, v in saved.items() if isinstance(v, int | float)}

    def refuse_taken(self) -> None:
        """A new launch of a name whose folder holds trials is refused, in one line."""
        if self.started():
            raise UserInputError("name", self.name, f"a study of that name exists in {self.folder}; run "
                                                    f"`orchestrator resume {self.name}` or choose another name")

    def before(self, config: StudyConfig, study_text: str, resume: bool, storage_key: str = "storage_path"
               ) -> BeforeLaunch:
        """What a launch (or, `resume`, a resume) of `config` needs to know of the folder, read once. Refused
        here, in one line, before Ray starts: a folder that cannot be made or written (`storage_key` names the
        setting that chose it), a `save:` models folder that cannot be written, a new launch of a taken name."""
        problem = unwritable(self.folder)  # a storage path that is a file, a read-only folder
        if problem is not None:
            raise UserInputError(storage_key, str(self.storage), f"study folders cannot be made there ({problem}); "
                                                                 "give a folder you can write")
        problem = unwritable(self.models) if config.save != "none" else None
        if problem:
            raise UserInputError("save", config.save, f"its models go to {self.models}, where nothing can be "
                                                      f"written ({problem}): make it a writable folder, or save: none")
        started = self.started()  # the journal read once
        if started and not resume:
            self.refuse_taken()
        record = self.record(config) if resume else None  # a folder a newer orchestrator wrote is refused here
        unstarted = None
        if not resume and self.folder.is_dir():  # a first launch that failed before its first trial: its
            with contextlib.suppress(UserInputError):  # parent run, if the store took one, is the retaken study's
                unstarted = self.study_uid
        return BeforeLaunch(started, self.meta() if resume else None, self.accepted() if resume else None,
                            record, unstarted, self.saved_estimate(study_text))

    def journal(self) -> Journal:
        """The journal to write to (a launch, under the lock): a torn last line is cut first."""
        return Journal(self.journal_file)

    def trials(self) -> dict[str, TrialRecord]:
        """Every trial the journal knows, replayed (read only)."""
        return ReadOnlyJournal(self.journal_file).records()

    def plan(self) -> StudyPlan:
        """The launched plan, from the record (a folder from before records: rebuilt, which needs the
        data and the model)."""
        from orchestrator.study.plan import build_plan, plan_from_record

        config = self.config()
        record = self.record(config)
        if record is not None:
            return plan_from_record(config, record)
        meta = self.meta()
        if meta is None:
            raise UserInputError("NAME", self.name, f"{self.folder} holds no launch yet (no plan, no journal): "
                                                    "launch the study file again")
        return build_plan(config, Path(meta["base_dir"]), stage_root=self.stages)

    def state(self) -> StudyState:
        """The plan's state replayed from the journal (read only): what `status` shows."""
        from orchestrator.study.state import StudyState

        return StudyState(self.plan(), ReadOnlyJournal(self.journal_file))

    def is_running(self) -> bool:
        """Does a live launch, resume or sync hold the folder now?"""
        return is_running(self.folder)

    def size(self) -> int:
        """Bytes in the folder (links not followed)."""
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file() and not p.is_symlink())

    def launches(self) -> int:
        """How many launches ran Ray Tune here (each has its `ray/launch-N` folder)."""
        return len(list(self.ray.glob("launch-*"))) if self.ray.exists() else 0

    def unwritable(self) -> str | None:
        """Why nothing can be written in the folder, or None."""
        return unwritable(self.folder)

    # --- what a launch writes ---------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, what: str) -> Iterator[None]:
        """Hold the folder as its one writer while `what` (launch, resume, sync) runs."""
        with exclusive(self.folder, self.name, what):
            yield

    def clear_unstarted(self) -> None:
        """Remove the state files of a launch that failed before its first trial (called under the lock)."""
        for name in (JOURNAL, META, RECORD, PLAN, LAUNCHED_FILE):
            (self.folder / name).unlink(missing_ok=True)

    def record_launch(self, journal: Journal, text: str, meta: dict[str, Any], record: StudyRecord,
                      cells: list[str]) -> None:
        """What a launch writes before its first trial (under the lock): the study file as run, the
        launch (in the journal too), the record, and the cells by index."""
        write_atomic(self.study_file, text)
        write_atomic(self.launched_file, text)  # what the trials run: later edits are checked against it
        journal.write("launch", **meta)  # the study id lives in the journal too
        write_atomic(self.folder / META, json.dumps(meta, indent=1))
        write_atomic(self.folder / RECORD, record.to_json())
        write_atomic(self.environment, environment_lock())  # every distribution this launch runs with
        (self.folder / PLAN).unlink(missing_ok=True)  # a folder from before records: the record replaces it
        journal.write("cells", keys=cells)

    def save_estimate(self, study_text: str, summary: dict[str, float]) -> None:
        """Keep `plan --estimate`'s figures, tied to the study file's text: a launch of the same file records
        them, and its report puts them beside what the study spent."""
        write_atomic(self.folder / ESTIMATE, json.dumps({"study_sha256": _sha256(study_text), **summary}, indent=1))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def studies_in(storage: str | Path | None = None) -> list[StudyFolder]:
    """The study folders in a storage folder (those holding a stored study file), by name."""
    root = storage_root(storage)
    return [StudyFolder(p) for p in sorted(root.iterdir()) if (p / STUDY_FILE).exists()] if root.is_dir() else []


def read_meta(folder: Path) -> dict[str, Any] | None:
    """`launch.json` of `folder`, or the journal's last `launch` event (`StudyFolder.meta`)."""
    return StudyFolder(folder).meta()


def holder(folder: Path) -> str:
    """Who holds the folder's lock, as its lock file says (`pid 123, launch`)."""
    try:
        return (folder / LOCK).read_text().strip() or "another process"
    except OSError:
        return "another process"


@contextlib.contextmanager
def exclusive(folder: Path, name: str, what: str) -> Iterator[None]:
    """Hold the study folder's lock while `what` (launch, resume, sync) runs; refuse in one line
    while another process holds it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only folder, a lock file another user left, a full disk
        if storage_full(str(exc)):
            raise StorageFullError("storage", str(folder), full_disk_fix(name)) from None
        raise UserInputError("storage", str(folder), f"the study folder's lock {folder / LOCK} cannot be opened for "
                                                     f"writing ({exc.strerror or exc}); make the folder and that file "
                                                     "writable, or give --storage another folder") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserInputError("NAME", name, f"{holder(folder)} is running this study now; wait for it to end or "
                                               f"stop it (Ctrl-C); `orchestrator status {name}` works meanwhile") \
                from None
        os.ftruncate(handle, 0)
        os.write(handle, f"pid {os.getpid()}, {what}".encode())
        yield
    finally:
        os.close(handle)  # closing drops the lock


def is_running(folder: Path) -> bool:
    """Does a live process hold the folder's lock?"""
    try:
        handle = os.open(folder / LOCK, os.O_RDONLY)
    except OSError:  # no lock file (never launched), or one this user cannot read: no running launch known
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
