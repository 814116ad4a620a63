"""Stages: work shared by many trials (an adapted checkpoint, pseudo-labels), computed once per
distinct configuration, under the study's storage, behind a file lock so concurrent trials wait
for it instead of repeating it. The stages themselves are modules of this package (`pretrain`:
the `dapt` stage; `teacher`); `PILOTS` names, per stage, the function that times one of its steps
for the estimate (imported only when an estimate runs)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

DONE = "stage.json"
PILOTS = {"dapt": "trainables.stages.pretrain:pilot_stage_step"}  # stage -> seconds per step of a config
DEFAULT_ROOT_ENV = "ORCHESTRATOR_STAGE_DIR"


def stage_key(kind: str, params: dict) -> str:
    """A short, stable hash of everything that determines the stage's output."""
    text = json.dumps({"kind": kind, **params}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_root() -> Path:
    return Path(os.environ.get(DEFAULT_ROOT_ENV) or Path(tempfile.gettempdir()) / "orchestrator-stages")


def get_or_build(root: str | Path | None, kind: str, params: dict,
                 build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """(folder, stage record, built now?). `build(folder)` fills an empty folder and returns what
    to record (metrics, curves); the folder appears under its final name only when complete."""
    root = Path(root) if root else default_root()
    root.mkdir(parents=True, exist_ok=True)
    key = stage_key(kind, params)
    folder = root / f"{kind}-{key}"
    with FileLock(str(folder) + ".lock"):
        if (folder / DONE).exists():
            return folder, json.loads((folder / DONE).read_text()), False
        partial = root / f".{kind}-{key}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        record = {"kind": kind, "key": key, "params": params, **build(partial)}
        (partial / DONE).write_text(json.dumps(record, indent=1, default=str))
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        return folder, record, True


def stage_step_seconds(name: str, cfg) -> float:
    """Seconds per step of stage `name` for this trial config, from a short pilot in a scratch folder."""
    module, function = PILOTS[name].split(":")
    return getattr(importlib.import_module(module), function)(cfg)
