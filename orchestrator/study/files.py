"""A study folder's state files, written and read safely: atomically (a temp file in the same folder, fsync,
rename, fsync of the folder: a crash or a full disk leaves the old file or the new one, never half of one),
read defensively (a damaged file is one line naming it), and a folder checked for writes before anything is
written there."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trainables.errors import UserInputError


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


def read_json(path: Path) -> dict[str, Any]:
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
