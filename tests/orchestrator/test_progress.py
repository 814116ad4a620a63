"""What a running study prints when nobody watches a terminal: a line per finished trial with counts,
elapsed time and an ETA learned from the cells' costs, and a heartbeat while nothing ends."""

from __future__ import annotations

import io

import pytest

from orchestrator.run import tune_adapters
from orchestrator.run.progress import duration, eta_seconds, trial_line, work_units
from orchestrator.run.tune_adapters import ProgressCallback
from orchestrator.study.config import parse_study
from orchestrator.study.journal import Journal, Outcome
from orchestrator.study.plan import build_plan
from orchestrator.study.state import StudyState


@pytest.fixture()
def state(tiny_bert, synthetic_data_dir, tmp_path):
    study = parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1, 2]},
                         "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2},
                         "data_dir": str(synthetic_data_dir), "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    return StudyState(build_plan(study, tmp_path), Journal(tmp_path / "j.jsonl"))


def finish(state, record, values, outcome=Outcome.COMPLETED):
    for epoch, value in enumerate(values, start=1):
        state.on_result(record.key, {"epoch": epoch, "dev_spearman": value})
    state.on_finished(record.key, outcome)


def test_durations_read_like_a_person_writes_them():
    assert [duration(s) for s in (7, 252, 3780)] == ["7s", "4m12s", "1h03m"]


def test_the_eta_weighs_each_cell_by_its_cost(state):
    costs = state.plan.cell_costs  # 2 epochs x (layers + 1): layer 1 -> 4, layer 2 -> 6
    assert costs == (4.0, 6.0)
    assert work_units(state) == (0.0, 2 * 4.0 + 2 * 6.0)
    first = state.next_trial()  # the costlier cell starts first
    assert first.cell == 1
    finish(state, first, [50, 60])
    assert work_units(state) == (6.0, 20.0)
    # 6 units took 60 s: the 14 left take 140 s at that pace
    assert eta_seconds(state, 60.0) == pytest.approx(140.0)
    # a resume that found 2 of those 6 units done did 4 in 20 s: the 14 left take 70 s (not 14 x 20 / 6)
    assert eta_seconds(state, 20.0, done_before=2.0) == pytest.approx(20.0 * 14.0 / 4.0)
    line = trial_line(state, first, 60.0)
    assert line == "[1/4] layer=2 seed 0 completed dev_spearman 60.00 · 1m00s elapsed · ETA 2m20s"


def test_pruned_failed_and_degenerate_trials_are_said_as_such(state):
    records = [state.next_trial() for _ in range(3)]
    finish(state, records[0], [40])  # one of two epochs: pruned, whatever Tune says
    finish(state, records[1], [], Outcome.FAILED)
    state.records[records[1].key].error = "OSError: disk full\ntraceback..."
    state.on_result(records[2].key, {"epoch": 1, "dev_spearman": float("nan"), "degenerate": 1})
    state.on_result(records[2].key, {"epoch": 2, "dev_spearman": float("nan"), "degenerate": 1})
    state.on_finished(records[2].key, Outcome.COMPLETED)
    lines = [trial_line(state, r, 30.0) for r in records]
    assert "pruned at epoch 1 dev_spearman 40.00" in lines[0]
    assert "failed: OSError: disk full ·" in lines[1]
    assert " degenerate · " in lines[2] and "dev_spearman" not in lines[2]


def test_without_a_terminal_each_finished_trial_prints_one_line_and_a_heartbeat_fills_silence(state, monkeypatch):
    stream = io.StringIO()
    callback = ProgressCallback(state, ["banner line"], stream=stream, live=False)
    clock = [1000.0]
    monkeypatch.setattr(tune_adapters.time, "monotonic", lambda: clock[0])
    callback.started = callback.last_line = clock[0]
    callback.setup()
    record = state.next_trial()
    callback.poll()
    assert stream.getvalue() == "banner line\n"  # nothing ended yet, and no minute has passed
    state.on_result(record.key, {"epoch": 1, "dev_spearman": 50})
    clock[0] += 61
    callback.poll()  # a heartbeat while the first trial runs: its pace would mostly measure the start
    assert stream.getvalue().splitlines()[-1] == "… s: 0 done, 1 running, 0 failed · 4 planned · 1m01s elapsed"
    finish(state, record, [50, 55])
    clock[0] += 30
    callback.poll()
    callback.poll()  # a trial is reported once
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[2].startswith("[1/4] layer=2 seed 0 completed dev_spearman 55.00 · 1m31s "
                                                   "elapsed · ETA ")
    clock[0] += 61
    callback.poll()
    assert stream.getvalue().splitlines()[-1].startswith("… s: 1 done, 0 running, 0 failed · 4 planned · 2m32s "
                                                         "elapsed · ETA ")
