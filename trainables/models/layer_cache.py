"""Which models have passed the layer check (trainables.models.layer_check), read without torch: `validate`
and `plan` ask here first and start a process for the check only when these model files have not passed it
for the layers asked."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from trainables.models.architectures import require_architecture

CACHE_FILE = "layer_checks.json"


def already_checked(name: str, layers: list[int]) -> bool:
    """Whether the files of model `name` passed the check at every layer of `layers` (from the cache file)."""
    return bool(layers) and set(layers) <= _cached(_files_key(name), None)


def _files_key(name: str) -> str:
    from trainables.models.files import config_file

    folder = config_file(name).parent
    stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    arch = require_architecture(name)
    return "files:" + hashlib.sha256(f"{metadata.version('transformers')}|{arch!r}|{stats}".encode()).hexdigest()


def _cache_file(cache_dir: str | Path | None) -> Path:
    from trainables.models.packaged import cache_root

    return (Path(cache_dir) if cache_dir is not None else cache_root()) / CACHE_FILE


def _records(path: Path) -> dict:
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _cached(key: str, cache_dir: str | Path | None) -> set[int]:
    record = _records(_cache_file(cache_dir)).get(key)
    return set(record.get("layers", ())) if isinstance(record, dict) else set()


