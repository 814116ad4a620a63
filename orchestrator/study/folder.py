"""A study folder (`<storage>/<name>/`): its layout, its state files and its one writer, apart
from the Ray launcher, so `status`, `report` and `sync` read a study without importing Ray.

State files are written atomically (a temp file in the same folder, fsync, rename, fsync of the
folder): a crash or a full disk leaves the old file or the new one, never half of one. They are read
defensively: a damaged `launch.json` is rebuilt from the journal's `launch` event; any other damaged
file is one line naming it. One process writes a folder at a time: `launch`, `resume` and `sync` hold
an exclusive `flock` on `.lock` while they run (the kernel drops it when the holder dies, so a stale
lock is simply taken over)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from reports.record import LEGACY_PLAN_FILE, RECORD_FILE, StudyRecord
from trainables.errors import StorageFullError, UserInputError, storage_full

STUDY_FILE = "study.yaml"  # the study as a user may edit it between launches
LAUNCHED_FILE = "study.launched.yaml"  # the study as last accepted: what the journal's trials ran
META = "launch.json"  # study id, base folder, tracking URI
RECORD = RECORD_FILE  # the study record of the latest launch: status and report need no data, model or kind
PLAN = LEGACY_PLAN_FILE  # what folders from before records hold instead
JOURNAL = "journal.jsonl"
OPTUNA_LOG = "optuna.log"  # every cell's Optuna study, for `orchestrator ui NAME --optuna`
MODELS = "models"  # save: the kept models, one folder per cell and seed
STAGES = "stages"  # the shared stages' cache (adapted encoders, teachers), keyed by their configs
ARTIFACTS = "mlartifacts"  # MLflow artifacts of a SQLite-tracked study
RAY = "ray"  # Ray Tune's experiment folders, one per launch (`launch-N`): checkpoints of running trials
LOCK = ".lock"
DEFAULT_STORAGE = "studies"


def study_dir(storage: str | Path | None, name: str) -> Path:
    return Path(storage or DEFAULT_STORAGE).expanduser().resolve() / name


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in `folder`, or None when they can (a missing folder: its nearest
    existing parent is tried); nothing is left behind. The `save:` models folder is checked before a
    launch, not when the first model is copied there."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-test-"):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` all at once (temp file, fsync, rename, fsync of the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_json(path: Path) -> dict:
    """A state file, or one clear error naming it when it is damaged."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(str(path), path.name, f"the file is damaged ({type(exc).__name__}); it is rewritten by "
                                                   "the next `orchestrator resume` from the journal") from None
    if not isinstance(value, dict):
        raise UserInputError(str(path), path.name, "the file is damaged (not a JSON object); it is rewritten by the "
                                                   "next `orchestrator resume` from the journal")
    return value


def read_record(folder: Path, name: str, trainable: str) -> StudyRecord | None:
    """The folder's study record (`study_record.json`; a folder from before records: its
    `plan.json`, read as one), or None when no launch has written either."""
    if (folder / RECORD).exists():
        try:
            text = (folder / RECORD).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            text = "damaged"
        return StudyRecord.from_json(text, str(folder / RECORD))
    if (folder / PLAN).exists():
        return StudyRecord.from_legacy(read_json(folder / PLAN), name, trainable)
    return None


def read_meta(folder: Path) -> dict | None:
    """`launch.json` (study id, base folder, tracking URI), or the journal's last `launch` event when
    that file is missing or damaged; None for a folder no launch has written."""
    from orchestrator.study.journal import Journal

    try:
        if (folder / META).exists():
            return read_json(folder / META)
    except UserInputError:
        pass
    launches = [e for e in Journal(folder / JOURNAL, repair=False).events() if e.get("event") == "launch"]
    if not launches:
        if (folder / META).exists():
            return read_json(folder / META)  # damaged, and nothing to rebuild it from: say so
        return None
    return {k: v for k, v in launches[-1].items() if k not in ("event", "t")}


def started(folder: Path) -> bool:
    """Has a launch issued a trial in this folder? A folder whose first launch failed before that (the
    tracking store refused its parent run, Ray did not start) holds no result: a new launch takes it over."""
    try:
        with open(folder / JOURNAL, "rb") as f:
            return any(b'"event": "issued"' in line for line in f)
    except FileNotFoundError:
        return False


def clear_unstarted(folder: Path) -> None:
    """Remove the state files of a launch that failed before its first trial (called under the lock)."""
    for name in (JOURNAL, META, RECORD, PLAN, LAUNCHED_FILE):
        (folder / name).unlink(missing_ok=True)


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
            from orchestrator.study.journal import full_disk_fix

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
