"""The `Study` handle: one study folder (`<storage>/<name>/`) and what it holds — its stored study file,
lock, journal, record, launch metadata and tracking store. Every verb asks it (`launch` and `resume`
write through it; `status`, `results`, `report`, `sync` and `ui` read it) instead of re-deriving the
folder's paths from a name. Reading a study imports neither Ray nor torch, and never changes the folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.study.config import StudyConfig, load_study
from orchestrator.study.folder import (
    ARTIFACTS,
    JOURNAL,
    LAUNCHED_FILE,
    META,
    MODELS,
    OPTUNA_LOG,
    PLAN,
    RAY,
    RECORD,
    STAGES,
    STUDY_FILE,
    exclusive,
    holder,
    is_running,
    read_meta,
    read_record,
    started,
    study_dir,
    write_atomic,
)
from orchestrator.study.journal import Journal, ReadOnlyJournal, TrialRecord
from reports.environment import LOCK_FILE, environment_lock
from reports.record import StudyRecord
from trainables.errors import UserInputError

if TYPE_CHECKING:
    from orchestrator.study.plan import StudyPlan
    from orchestrator.study.state import StudyState


@dataclass(frozen=True)
class Study:
    """A study folder. `Study.named("quickstart")` is `./studies/quickstart`; give `storage` for
    another folder of study folders."""

    folder: Path

    @classmethod
    def named(cls, name: str, storage: str | Path | None = None) -> Study:
        return cls(study_dir(storage, name))

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

    def require(self) -> Study:
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
        """Has a launch issued a trial here?"""
        return started(self.folder)

    def config(self) -> StudyConfig:
        """The stored study file, validated (its kind's plugin need not be installed to read it)."""
        return load_study(self.require().study_file, launched=True)

    def accepted(self) -> StudyConfig | None:
        """What the journal's trials ran (None before any launch): edits are checked against it."""
        path = self.launched_file if self.launched_file.exists() else self.study_file
        return load_study(path) if path.exists() else None

    def meta(self) -> dict[str, Any] | None:
        """The launch's study id, base folder and tracking URI (None before any launch)."""
        return read_meta(self.folder) if self.folder.is_dir() else None

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
        """The study record of its latest launch (None before any launch)."""
        config = config or self.config()
        return read_record(self.folder, config.name, config.trainable)

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

    # --- what a launch writes ---------------------------------------------------------------------

    @contextmanager
    def lock(self, what: str) -> Iterator[None]:
        """Hold the folder as its one writer while `what` (launch, resume, sync) runs."""
        with exclusive(self.folder, self.name, what):
            yield

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


def studies_in(storage: str | Path | None = None) -> list[Study]:
    """The study folders in a storage folder (those holding a stored study file), by name."""
    root = study_dir(storage, "x").parent
    return [Study(p) for p in sorted(root.iterdir()) if (p / STUDY_FILE).exists()] if root.is_dir() else []
