"""The driver's writes to MLflow off its thread, surviving a tracking server's outage: the journal stays
the source of truth, and what an outage (or a driver that died with writes queued) missed is replayed."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from orchestrator.run.tracking import StudyTracker
from orchestrator.study.journal import TrialRecord

log = logging.getLogger("orchestrator.tracking")  # one logger for MLflow's side, as before the split


class ResilientTracker:
    """The driver's writes to MLflow, off its thread and surviving a tracking-server outage.

    Writes are queued and made in order by one writer thread, so a server's round trips (tens of ms each
    against a busy server) do not hold up Tune's loop; the journal, written first, stays the source of
    truth. A failed write puts the tracker offline (training goes on), writes are skipped until a probe
    every `retry_s` seconds finds the server again, and then `sync` replays what the outage missed from the
    journal before the next write. The first write of a resumed study (or its end, if nothing was left to
    run) first brings MLflow up to the journal: a driver that died with writes queued (a SIGKILL, a job's
    time limit) left them unmade. `reconnect(force=True)`, as the study ends, makes the queued writes first.
    `ORCHESTRATOR_TRACKING_WRITER=inline` makes them on the driver's thread instead."""

    WRITES = ("start_trial", "log_epoch", "set_tag", "link_stage", "log_artifact", "log_artifacts",
              "finish_trial")

    def __init__(self, tracker: StudyTracker, records: Callable[[], dict[str, TrialRecord]],
                 cell_keys: dict[int, str], retry_s: float = 5.0, background: bool | None = None):
        self.tracker, self.records, self.cell_keys, self.retry_s = tracker, records, cell_keys, retry_s
        self.offline_since: float | None = None
        self.outages = 0
        self.synced: dict[str, int] = {"runs": 0, "epochs": 0, "closed": 0, "filled": 0}
        self.caught_up = not records()  # a fresh study has nothing to catch up
        if background is None:
            background = os.environ.get("ORCHESTRATOR_TRACKING_WRITER", "background") != "inline"
        self.queue: queue.SimpleQueue | None = queue.SimpleQueue() if background else None
        self.writer: threading.Thread | None = None
        self.busy_s = 0.0  # the writer's time making writes (benchmarks/scale.py reports it per trial)

    def __getattr__(self, name: str):
        if name not in self.WRITES:
            return getattr(self.tracker, name)
        method = getattr(self.tracker, name)
        if self.queue is None:
            return lambda *args, **kwargs: self._write(name, method, *args, **kwargs)
        return lambda *args, **kwargs: self._enqueue((name, method, args, kwargs))

    def when_written(self, action: Callable[[], object]) -> None:
        """Run `action` (removing a finished trial's checkpoint) once the writes queued before it are made,
        and only while MLflow takes writes: what it removes may be what a failed write still needs."""
        if self.queue is None:
            self._after_writes(action)
        else:
            self._enqueue(("when_written", action, (), {}))

    def _after_writes(self, action: Callable[[], object]) -> None:
        if self.offline_since is None:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 (a checkpoint left behind is only disk; sync removes it later)
                log.warning("after MLflow's writes: %s", exc)

    def _enqueue(self, item: tuple) -> None:
        assert self.queue is not None
        if self.writer is None:
            self.writer = threading.Thread(target=self._make_queued, name="mlflow-writer", daemon=True)
            self.writer.start()
        self.queue.put(item)

    def _make_queued(self) -> None:
        assert self.queue is not None
        while (item := self.queue.get()) is not None:
            name, method, args, kwargs = item
            if name == "when_written":
                self._after_writes(method)
            else:
                self._write(name, method, *args, **kwargs)

    def drain(self) -> None:
        """Make every queued write; the writer thread ends (a later write starts another)."""
        if self.writer is not None and self.queue is not None:
            self.queue.put(None)
            self.writer.join()
            self.writer = None

    def _write(self, name: str, method: Callable, *args, **kwargs):
        if self.offline_since is not None and not self.reconnect():
            return None
        started = time.perf_counter()
        try:
            if not self.caught_up:
                self._catch_up()
            return method(*args, **kwargs)
        except FileNotFoundError as exc:  # a local file gone (a model folder replaced by a better seed's)
            log.warning("MLflow's %s skipped: %s", name, exc)
            return None
        except Exception as exc:  # the server is down or refused the write: the journal has it
            self._went_offline(name, exc)
            return None
        finally:
            self.busy_s += time.perf_counter() - started

    def _replay(self) -> dict[str, int]:
        """Make in MLflow what the journal holds and MLflow lacks; the counts add to `synced`."""
        counts = self.tracker.sync(dict(self.records()), self.cell_keys)
        self.synced = {k: self.synced.get(k, 0) + v for k, v in counts.items()}
        return counts

    def _catch_up(self) -> None:
        counts = self._replay()
        self.caught_up = True
        if any(counts.values()):
            log.warning("MLflow at %s was behind the study's journal (a launch that ended before making all its "
                        "writes): replayed %s", self.tracker.uri, counts)

    def _went_offline(self, name: str, exc: Exception) -> None:
        if self.offline_since is None:
            self.outages += 1
            log.warning("MLflow at %s failed on %s (%s); training goes on, the journal keeps every result and "
                        "they are replayed when the server is back", self.tracker.uri, name, exc)
        self.offline_since = time.monotonic()

    def reconnect(self, force: bool = False) -> bool:
        """Online again? Probes at most every `retry_s`; on success replays the journal. `force` (the
        study is ending): the queued writes are made first, then the probe is not held back, and a
        resumed study that wrote nothing is brought up to its journal."""
        if force:
            self.drain()
            if self.offline_since is None and not self.caught_up:
                try:
                    self._catch_up()
                except Exception as exc:  # noqa: BLE001 (the caller's loop probes again)
                    self._went_offline("sync", exc)
        if self.offline_since is None:
            return True
        if not force and time.monotonic() - self.offline_since < self.retry_s:
            return False
        try:
            self.tracker.client.get_run(self.tracker.parent_id)
            counts = self._replay()
        except Exception as exc:
            self.offline_since = time.monotonic()
            log.debug("MLflow still unreachable: %s", exc)
            return False
        self.offline_since = None
        self.caught_up = True
        log.warning("MLflow at %s is back: replayed %s", self.tracker.uri, counts)
        return True
