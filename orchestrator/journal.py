"""The study journal: an append-only JSON-lines record of every trial the plan issued, each epoch
result and each outcome. It is the study's source of truth: written (and flushed to disk) by the
driver as events happen, replayed on resume, so a SIGKILL loses at most the line being written."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class Outcome(str, Enum):
    """How a trial ended; all outcome handling goes through this small enum."""

    COMPLETED = "completed"
    PRUNED = "pruned"
    DIVERGED = "diverged"
    FAILED = "failed"


@dataclass
class TrialRecord:
    key: str  # stable across launches: c{cell}-t{n} (tuning) or c{cell}-s{seed} (replicate)
    cell: int
    phase: str  # "tune" | "replicate"
    seed: int
    tuned: dict[str, Any]
    config: dict[str, Any]
    number: int | None = None  # Optuna trial number within the cell's study (tuning only)
    results: list[dict] = field(default_factory=list)
    checkpoint: str | None = None
    outcome: Outcome | None = None
    error: str | None = None
    cell_key: str | None = None  # the cell's values, so a resume after new axis values finds it again
    superseded: bool = False  # a replicate of a config that more tuning has since replaced

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def last(self) -> dict:
        return self.results[-1] if self.results else {}


def remove_checkpoint(path: str | None) -> bool:
    """Delete a finished trial's checkpoint (its results are in the journal and MLflow)."""
    if not path or not os.path.isdir(path) or not Path(path).name.startswith("checkpoint_"):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


class Journal:
    def __init__(self, path: str | Path, repair: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if repair:
            self.repair_tail()

    def repair_tail(self) -> int:
        """Cut a torn last line (a power cut mid-write) back to the last complete line, so the next
        event starts on a line of its own instead of being glued to the torn one. Bytes removed."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return 0
        with open(self.path, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return 0
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        return len(data) - keep

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}, default=str, allow_nan=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def events(self) -> list[dict]:
        """Every complete line; a torn last line (killed mid-write) is ignored."""
        if not self.path.exists():
            return []
        events = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events

    def records(self) -> dict[str, TrialRecord]:
        """Replay: the latest state of every trial ever issued."""
        records: dict[str, TrialRecord] = {}
        cells: list[str] | None = None  # the cell keys, by index, of the launch that wrote what follows
        for event in self.events():
            kind = event.pop("event")
            if kind == "cells":
                cells = event["keys"]
            elif kind == "issued":
                previous = records.get(event["key"])
                record = TrialRecord(**{k: event[k] for k in ("key", "cell", "phase", "seed", "tuned", "config")},
                                     number=event.get("number"))
                record.cell_key = event.get("cell_key") or (cells[event["cell"]] if cells and
                                                            event["cell"] < len(cells) else None)
                if previous is not None and not previous.finished:  # re-issued after an interruption
                    record.results, record.checkpoint = previous.results, previous.checkpoint
                records[event["key"]] = record
            elif kind == "result" and event["key"] in records:
                records[event["key"]].results.append(event["metrics"])
            elif kind == "checkpoint" and event["key"] in records:
                records[event["key"]].checkpoint = event["path"]
            elif kind == "finished" and event["key"] in records:
                records[event["key"]].outcome = Outcome(event["outcome"])
                records[event["key"]].error = event.get("error")
            elif kind == "superseded" and event["key"] in records:
                records[event["key"]].superseded = True
        return records
