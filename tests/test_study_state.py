"""The plan's semantics without Ray: order of work, per-cell tuning, truthful outcomes, replay."""

from __future__ import annotations

import pytest

from orchestrator.config import parse_study
from orchestrator.journal import Journal, Outcome
from orchestrator.plan import build_plan
from orchestrator.study_state import FINISHED, StudyState


@pytest.fixture()
def plan(tiny_bert, synthetic_data_dir, tmp_path):
    study = parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1, 2]},
                         "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 2, "startup_trials": 1},
                         "replicate": {"seeds": [5, 6]}, "train": {"epochs": 3},
                         "data_dir": str(synthetic_data_dir), "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    return build_plan(study, tmp_path)


def run(state, record, values, outcome=Outcome.COMPLETED):
    for epoch, value in enumerate(values, start=1):
        state.on_result(record.key, {"epoch": epoch, "dev_spearman": value})
    state.on_finished(record.key, outcome)


def test_tuning_is_round_robin_and_replicates_wait_for_their_cell(plan, tmp_path):
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    first = [state.next_trial() for _ in range(4)]
    assert [r.key for r in first] == ["c0-t0", "c1-t0", "c0-t1", "c1-t1"]
    assert all(r.config["score_test"] is False and r.seed == 5 for r in first)
    assert state.next_trial() is None  # only running trials left: their outcomes decide the replicates
    run(state, first[0], [10, 20, 30])
    run(state, first[2], [15, 40, 35])
    replicate = state.next_trial()  # cell 0's tuning is done while cell 1 still tunes
    assert replicate.key == "c0-s5" and replicate.tuned == first[2].tuned  # best dev (40), not last epoch
    assert replicate.config["seed"] == 5 and replicate.config["score_test"] is True
    assert replicate.config["layer"] == 1 and replicate.config["lr"] == first[2].tuned["lr"]
    assert state.next_trial().key == "c0-s6"
    run(state, first[1], [5])  # stopped after one of three epochs: pruned, whatever Tune says
    assert state.records["c1-t0"].outcome == Outcome.PRUNED
    assert state.studies[1].trials[0].state.name == "PRUNED"
    run(state, first[3], [1, 2, 3])
    assert [state.next_trial().key for _ in range(2)] == ["c1-s5", "c1-s6"]
    for key in ("c0-s5", "c0-s6", "c1-s5", "c1-s6"):
        run(state, state.records[key], [50, 51, 52])
    assert state.next_trial() == FINISHED and state.is_complete()
    assert state.counts() == {"planned": 8, "issued": 8, "running": 0, "completed": 7, "pruned": 1,
                              "diverged": 0, "failed": 0}


def test_a_cell_whose_tuning_all_failed_has_no_replicates(plan, tmp_path):
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    records = [state.next_trial() for _ in range(4)]
    for record in records:
        if record.cell == 0:
            run(state, record, [], Outcome.FAILED)
        else:
            run(state, record, [1, 2, 3])
    assert [state.next_trial().key for _ in range(2)] == ["c1-s5", "c1-s6"]
    assert state.best_tuned(plan.cells[0]) is None
    assert state.next_trial() is None  # the replicates of cell 1 still run
    for key in ("c1-s5", "c1-s6"):
        run(state, state.records[key], [1, 2, 3])
    assert state.next_trial() == FINISHED and state.is_complete()


def test_replay_keeps_finished_trials_and_requeues_interrupted_ones(plan, tmp_path):
    journal = Journal(tmp_path / "j.jsonl")
    state = StudyState(plan, journal)
    a, b = state.next_trial(), state.next_trial()
    run(state, a, [10, 20, 30])
    state.on_result(b.key, {"epoch": 1, "dev_spearman": 7})
    state.on_checkpoint(b.key, "/ckpt/b1")
    with open(journal.path, "a") as f:
        f.write('{"event": "result", "key": "c1-t0", "metr')  # torn last line: killed mid-write

    again = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    assert again.records[a.key].outcome == Outcome.COMPLETED
    assert len(again.studies[0].trials) == 1 and again.studies[0].trials[0].value == 30
    resumed = again.next_trial()
    assert resumed.key == b.key and resumed.tuned == b.tuned and resumed.checkpoint == "/ckpt/b1"
    assert again.asked[b.key].params == b.tuned
    assert again.next_trial().key == "c0-t1"
