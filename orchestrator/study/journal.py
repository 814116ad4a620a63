"""The study journal: an append-only JSON-lines record of every trial the plan issued, each epoch
result and each outcome. It is the study's source of truth: written (and flushed to disk) by the
driver as events happen, replayed on resume, so a SIGKILL loses at most the line being written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from trainables.errors import StorageFullError, UserInputError, storage_full

ATTEMPT, ATTEMPT_S = "attempt", "attempt_s"  # every report's stamp: which attempt, seconds since it started
HARDWARE = "hardware_"  # an attempt's first report: the machine it runs on (cpu_model, gpu_model, ...)


class Outcome(str, Enum):  # noqa: UP042 (StrEnum changes str() and format() of a member: kept as it was)
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
    results: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str | None = None
    outcome: Outcome | None = None
    error: str | None = None
    cell_key: str | None = None  # the cell's values, so a resume after new axis values finds it again
    superseded: bool = False  # a replicate of a config that more tuning has since replaced
    started: float | None = None  # when it was first issued and when it finished (epoch seconds, journal's `t`)
    ended: float | None = None
    rungs: dict[str, float] = field(default_factory=dict)  # its pruner's rung records (Optuna's
    #                                         completed_rung_N of the trial), as the results that set them say
    sampler_attrs: dict[str, Any] = field(default_factory=dict)  # what its sampler noted on it when it was asked
    #                                         (NSGA-II's generation), given back to it on replay

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def last(self) -> dict[str, Any]:
        return self.results[-1] if self.results else {}

    @property
    def wall_s(self) -> float | None:
        """Seconds its trial function ran, summed over its attempts (each attempt's last stamp); None for a
        trial whose reports carry no stamps (run before they existed, or by an executor without them)."""
        last: dict[str, float] = {}
        for result in self.results:
            if ATTEMPT in result and isinstance(result.get(ATTEMPT_S), int | float):
                last[result[ATTEMPT]] = max(last.get(result[ATTEMPT], 0.0), float(result[ATTEMPT_S]))
        return round(sum(last.values()), 4) if last else None

    @property
    def hardware(self) -> dict[str, str]:
        """What its latest attempt's first report said about the machine (`hardware_*`)."""
        found: dict[str, str] = {}
        for result in self.results:
            if any(k.startswith(HARDWARE) for k in result):
                found = {k.removeprefix(HARDWARE): str(v) for k, v in result.items() if k.startswith(HARDWARE)}
        return found

    @property
    def rounds_reached(self) -> int:
        """The last round it reported (a retried trial may report a round twice)."""
        return max((int(r.get("epoch", 0)) for r in self.results), default=0)


def remove_checkpoint(path: str | None) -> bool:
    """Delete a finished trial's checkpoint (its results are in the journal and MLflow)."""
    if not path or not os.path.isdir(path) or not Path(path).name.startswith("checkpoint_"):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


FIELDS = {"cells": ("keys",), "issued": ("key", "cell", "phase", "seed", "tuned", "config"),
          "result": ("key", "metrics"), "checkpoint": ("key", "path"), "finished": ("key", "outcome"),
          "superseded": ("key",), "retry": ("key",), "checkpoint_removed": ("key",),
          "launch": ("study_uid", "base_dir", "tracking_uri")}


def event_problem(event: Any) -> str | None:
    """What is wrong with one journal event, or None for a well-formed one."""
    if not isinstance(event, dict):
        return f"a {type(event).__name__}, not an event"
    kind = event.get("event")
    if kind not in FIELDS:
        return f"unknown event {kind!r}" if kind is not None else "no `event` field"
    missing = [name for name in FIELDS[kind] if name not in event]
    if missing:
        return f"a {kind} event without {', '.join(missing)}"
    if kind == "finished" and event["outcome"] not in {o.value for o in Outcome}:
        return f"unknown outcome {event['outcome']!r}"
    if kind == "result" and not isinstance(event["metrics"], dict):
        return "a result without its metrics"
    if kind == "issued" and not (isinstance(event["cell"], int) and isinstance(event["config"], dict)):
        return "an issued event with a malformed cell or config"
    return None


def full_disk_fix(name: str) -> str:
    return (f"free space on its disk (or in the temp folder), then `orchestrator resume {name}`: the study "
            f"stopped, keeps every finished trial and runs again what the full disk stopped")


class JournalError(UserInputError):
    """A damaged line in the middle of a journal: named by number, never skipped."""

    problem = "is a damaged journal line"

    def __init__(self, path: Path, number: int, raw: bytes, problem: str):
        shown = raw[:80].decode("utf-8", errors="replace")
        newer = ("; a newer orchestrator writes events this one does not know: if a newer version ran this study, "
                 "upgrade to it" if problem.startswith("unknown event") else "")
        super().__init__(f"{path}:{number}", shown, f"line {number} is damaged ({problem}){newer}; the journal is "
                         "the study's record, so nothing is guessed: restore the line from a backup, or delete it "
                         "(a trial whose `finished` line is lost runs again)")


class Journal:
    def __init__(self, path: str | Path, repair: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.appending = threading.Lock()  # the driver's thread and its MLflow writer (checkpoint removals)
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
        """Append one event, stamped with its wall-clock time `t` (trial durations for the dashboards)."""
        line = json.dumps({"event": event, **fields, "t": round(time.time(), 3)}, default=str, allow_nan=True)
        try:
            with self.appending, open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            if not storage_full(str(exc)):
                raise
            with contextlib.suppress(OSError):
                self.repair_tail()  # a line cut short by the full disk: the next write starts clean
            raise StorageFullError("storage", str(self.path.parent), full_disk_fix(self.path.parent.name)) from None

    def events(self) -> list[dict[str, Any]]:
        """Every line, checked: a torn last line (killed mid-write) is ignored; any other line that is
        not a well-formed event stops the replay with its line number (`JournalError`) instead of a
        guess: a lost `finished` line would make a completed trial run again."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        torn = not data.endswith(b"\n")
        events = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw.decode("utf-8"))
                problem = event_problem(event)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                event, problem = None, f"not a JSON line ({type(exc).__name__})"
            if problem is None:
                events.append(event)
            elif not (torn and number == len(lines)):
                raise JournalError(self.path, number, raw, problem)
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
                if isinstance(event.get("sampler_attrs"), dict):
                    record.sampler_attrs = event["sampler_attrs"]
                record.cell_key = event.get("cell_key") or (cells[event["cell"]] if cells and
                                                            event["cell"] < len(cells) else None)
                if previous is not None and (not previous.finished or previous.outcome == Outcome.FAILED
                                             and storage_full(previous.error)):  # re-issued after an interruption
                    record.results, record.checkpoint = previous.results, previous.checkpoint  # or a full disk
                    record.rungs = previous.rungs
                record.started = previous.started if previous is not None and previous.started else event.get("t")
                records[event["key"]] = record
            elif kind == "result" and event["key"] in records:
                records[event["key"]].results.append(event["metrics"])
                if isinstance(event.get("rungs"), dict):
                    records[event["key"]].rungs.update(event["rungs"])
            elif kind == "checkpoint" and event["key"] in records:
                records[event["key"]].checkpoint = event["path"]
            elif kind == "finished" and event["key"] in records:
                records[event["key"]].outcome = Outcome(event["outcome"])
                records[event["key"]].error = event.get("error")
                records[event["key"]].ended = event.get("t")
            elif kind == "superseded" and event["key"] in records:
                records[event["key"]].superseded = True
        return records


class ReadOnlyJournal(Journal):
    """A journal read by `status`, `results` and `report`, which never change the study folder."""

    def __init__(self, path: str | Path):
        self.path = Path(path)  # not created, not repaired

    def write(self, event: str, **fields: Any) -> None:
        pass
