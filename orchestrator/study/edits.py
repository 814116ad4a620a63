"""A study file edited between launches: which changes extend the study and which would invalidate
finished work.

Extensions resume and run only the new work: more seeds (`replicate.seeds` a superset), more tuning
trials per cell (`tune.trials` larger), new values on an existing axis (`ablate.<axis>` a superset,
old values kept), and settings that change no result (`report`, `resources`, `max_concurrent`,
`max_failures`, `storage_path`). Anything else (a different model, task, lr range, epochs, a new or
removed axis, ...) is refused, naming the key and both values.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from orchestrator.study.config import StudyConfig, flatten
from search_spaces.presets import expand_seeds
from trainables.errors import UserInputError

HARMLESS = ("report", "resources", "max_concurrent", "max_failures", "storage_path", "save", "budget")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _extends(key: str, old: Any, new: Any) -> bool:
    if key == "replicate.seeds":
        return set(expand_seeds(old)) <= set(expand_seeds(new))
    if key == "tune.trials":
        return isinstance(new, int) and new >= old
    if key == "replicate.max_seeds":
        return isinstance(new, int) and (old is None or new >= old)
    if key.startswith("ablate.") and key.count(".") == 1 and old is not None and new is not None:
        old_values, new_values = _as_list(old), _as_list(new)
        return all(v in new_values for v in old_values)
    return key.split(".")[0] in HARMLESS


def _removed(key: str, old: Any, new: Any) -> str | None:
    """The values an edit removed from an axis or the seeds (`3`, `3, 4`), or None for another change."""
    new_values: Collection[Any]
    if key == "replicate.seeds":
        old_values, new_values = list(expand_seeds(old)), set(expand_seeds(new))
    elif key.startswith("ablate.") and old is not None and new is not None:
        old_values, new_values = _as_list(old), _as_list(new)
    else:
        return None
    gone = [v for v in old_values if v not in new_values]
    return ", ".join(map(str, gone)) if gone else None


def check_edit(stored: StudyConfig, edited: StudyConfig) -> list[str]:
    """The keys that changed, when every change extends the study; a UserInputError naming the
    first change that would invalidate finished work."""
    before = flatten("", stored.model_dump(mode="json"), {})
    after = flatten("", edited.model_dump(mode="json"), {})
    changed = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if not _extends(key, old, new):
            removed = _removed(key, old, new)
            if removed:
                raise UserInputError(key, new, f"the study was launched with {old!r}; removing {removed} would drop "
                                               "cells or seeds it has run or started (what ran stays in its journal "
                                               "and MLflow): restore it, or launch under a new name")
            raise UserInputError(key, new, f"the study was launched with {old!r}; that change would invalidate its "
                                           "finished work: restore it, or launch under a new name")
        changed.append(key)
    return changed
