"""The driver's MLflow writes off its thread (ResilientTracker's writer): made in order, a finished trial's
checkpoint removed only once its writes are made, an outage replayed from the journal, and writes a
driver died with caught up by the next launch. SQLite stores, no Ray."""

from __future__ import annotations

import threading

from mlflow.tracking import MlflowClient

from orchestrator.run.resilient_tracker import ResilientTracker
from orchestrator.run.tracking import StudyTracker
from orchestrator.study.journal import Outcome, TrialRecord
from tests.orchestrator.test_tracking import started


def finished_record(key: str, epochs: int, checkpoint: str | None = None) -> TrialRecord:
    record = TrialRecord(key, 0, "replicate", int(key[-1]), {}, {"layer": 1})
    record.results = [{"epoch": e, "dev_spearman": 50.0 + e, "train_loss": 1.0 / e} for e in range(1, epochs + 1)]
    record.outcome, record.checkpoint = Outcome.COMPLETED, checkpoint
    return record


def steps(uri: str, run_id: str, metric: str = "dev_spearman") -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, metric))


def test_writes_are_made_in_order_off_the_callers_thread_and_a_release_waits_for_them(tmp_path):
    uri, tracker = started(tmp_path)
    threads, order = set(), []
    log_epoch = tracker.log_epoch

    def recording(key, metrics, node_ip=None):
        threads.add(threading.current_thread().name)
        order.append(metrics["epoch"])
        log_epoch(key, metrics, node_ip)

    tracker.log_epoch = recording
    records: dict[str, TrialRecord] = {}
    writer = ResilientTracker(tracker, lambda: records, {0: "layer=1"}, background=True)
    record = finished_record("c0-s0", 0)
    records[record.key] = record
    writer.start_trial(record, "layer=1", "ray1")
    seen_by_release = []
    for epoch in range(1, 21):
        writer.log_epoch("c0-s0", {"epoch": epoch, "dev_spearman": 50.0 + epoch})
    record.outcome = Outcome.COMPLETED
    writer.finish_trial(record)
    writer.when_written(lambda: seen_by_release.append(steps(uri, tracker.children["c0-s0"])))
    assert writer.reconnect(force=True)  # the study ends: the queue is made first
    assert threads == {"mlflow-writer"} and order == list(range(1, 21))
    assert seen_by_release == [list(range(1, 21))]  # the release ran after every write before it
    run = MlflowClient(uri).get_run(tracker.children["c0-s0"])
    assert run.info.status == "FINISHED" and run.data.tags["outcome"] == "completed"
    assert writer.writer is None  # the thread ended


def test_a_failed_write_keeps_the_checkpoint_and_the_replay_fills_the_gap(tmp_path):
    uri, tracker = started(tmp_path)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    record = finished_record("c0-s1", 3, str(checkpoint))
    records = {record.key: record}
    writer = ResilientTracker(tracker, lambda: records, {0: "layer=1"}, retry_s=60.0, background=True)
    writer.caught_up = True  # started with this launch
    writer.start_trial(record, "layer=1", "ray1")
    writer.drain()
    real = tracker.client.log_batch
    failures = []

    def down(*args, **kwargs):  # the server fails the first epoch's write
        if not failures:
            failures.append(1)
            raise ConnectionError("the tracking server is down")
        return real(*args, **kwargs)

    tracker.client.log_batch = down
    writer.log_epoch(record.key, record.results[0])
    removed = []
    writer.when_written(lambda: removed.append(True))  # skipped: that write failed
    writer.drain()
    assert writer.offline_since is not None and removed == [] and checkpoint.exists()
    writer.retry_s = 0.0
    writer.log_epoch(record.key, record.results[1])  # the next write finds the server back: the replay first
    writer.log_epoch(record.key, record.results[2])
    writer.finish_trial(record)
    assert writer.reconnect(force=True)
    run_id = tracker.children[record.key]
    assert steps(uri, run_id) == [1, 2, 3] and writer.synced["epochs"] >= 1
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


def test_writes_a_dead_driver_never_made_are_made_by_the_next_launch_before_its_own(tmp_path):
    uri, tracker = started(tmp_path)
    done = finished_record("c0-s0", 4)
    tracker.start_trial(done, "layer=1", "ray1")
    tracker.log_epoch(done.key, done.results[0])  # the driver died with epochs 2-4 and the finish queued
    lost = finished_record("c0-s1", 2)  # ... and this trial's run not even created
    running = finished_record("c0-s2", 1)  # a trial to resume, its epoch 1 never written either
    running.outcome = None
    records = {r.key: r for r in (done, lost, running)}

    again = StudyTracker(uri, "s", tmp_path / "artifacts")
    again.start_parent(tmp_path / "study.yaml", tracker_record(), "0", "uid-1")
    writer = ResilientTracker(again, lambda: records, {0: "layer=1"}, background=True)
    assert not writer.caught_up
    writer.start_trial(running, "layer=1", "ray2")  # the resumed trial's first write
    writer.log_epoch(running.key, {"epoch": 2, "dev_spearman": 52.0})
    writer.reconnect(force=True)
    client = MlflowClient(uri)
    runs = {key: client.get_run(run_id) for key, run_id in again.children.items()}
    assert set(runs) == {"c0-s0", "c0-s1", "c0-s2"}
    assert steps(uri, again.children["c0-s0"]) == [1, 2, 3, 4] and runs["c0-s0"].info.status == "FINISHED"
    assert steps(uri, again.children["c0-s1"]) == [1, 2] and runs["c0-s1"].info.status == "FINISHED"
    assert steps(uri, again.children["c0-s2"]) == [1, 2] and runs["c0-s2"].info.status == "RUNNING"
    assert writer.synced == {"runs": 2, "epochs": 6, "closed": 2, "filled": 0}  # 3 + 2 + 1 epochs


def tracker_record():
    from reports.record import StudyRecord

    return StudyRecord.from_legacy({}, "s")


def test_inline_writes_are_made_on_the_callers_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_TRACKING_WRITER", "inline")
    uri, tracker = started(tmp_path)
    writer = ResilientTracker(tracker, dict, {0: "layer=1"})
    record = finished_record("c0-s0", 1)
    writer.start_trial(record, "layer=1", "ray1")
    writer.log_epoch(record.key, record.results[0])
    assert writer.writer is None and steps(uri, tracker.children[record.key]) == [1]  # made already


def test_a_resumed_study_with_nothing_left_to_run_is_caught_up_as_it_ends(tmp_path):
    """The driver died with its last trial's writes queued, every trial finished: the next launch runs no trial
    (so makes no write) and still brings MLflow up to the journal as it ends."""
    uri, tracker = started(tmp_path)
    done = finished_record("c0-s0", 3)
    tracker.start_trial(done, "layer=1", "ray1")  # its epochs and its finish were still queued
    again = StudyTracker(uri, "s", tmp_path / "artifacts")
    again.start_parent(tmp_path / "study.yaml", tracker_record(), "0", "uid-1")
    writer = ResilientTracker(again, lambda: {done.key: done}, {0: "layer=1"}, background=True)
    assert writer.reconnect(force=True)
    run_id = again.children[done.key]
    assert steps(uri, run_id) == [1, 2, 3] and MlflowClient(uri).get_run(run_id).info.status == "FINISHED"
    assert writer.caught_up and writer.synced["epochs"] == 3 and writer.outages == 0


def test_a_local_file_gone_before_its_upload_is_skipped_not_an_outage(tmp_path):
    uri, tracker = started(tmp_path)
    record = finished_record("c0-s0", 1)
    writer = ResilientTracker(tracker, lambda: {record.key: record}, {0: "layer=1"}, background=True)
    writer.caught_up = True
    writer.start_trial(record, "layer=1", "ray1")
    writer.log_artifact(record.key, str(tmp_path / "checkpoint" / "metrics.json"))  # removed meanwhile
    writer.log_epoch(record.key, record.results[0])
    assert writer.reconnect(force=True)
    assert writer.offline_since is None and writer.outages == 0
    assert steps(uri, tracker.children[record.key]) == [1]  # the writes after it were made
