"""The plan's semantics without Ray: order of work, per-cell tuning, truthful outcomes, replay."""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.study.config import parse_study
from orchestrator.study.journal import Journal, Outcome
from orchestrator.study.plan import build_plan, plan_from_record, plan_record
from orchestrator.study.state import FINISHED, StudyState
from reports.record import StudyRecord


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
    assert [r.key for r in first] == ["c1-t0", "c0-t0", "c1-t1", "c0-t1"]  # layer 2 costs more: it starts first
    first = sorted(first, key=lambda r: (r.key.split("-")[1], r.key))  # c0-t0, c1-t0, c0-t1, c1-t1
    assert all(r.config["score_test"] is False and r.seed == r.config["seed"] == 10_000 for r in first)
    assert state.next_trial() is None  # only running trials left: their outcomes decide the replicates
    run(state, first[0], [10, 20, 30])
    run(state, first[2], [15, 40, 35])
    replicate = state.next_trial()  # cell 0's tuning is done while cell 1 still tunes
    assert replicate.key == "c0-s5" and replicate.tuned == first[2].tuned  # best dev (40), not last epoch
    assert replicate.config["seed"] == 5 and replicate.config["score_test"] is True
    assert replicate.config != first[2].config  # a fresh run, not a rerun of the winning tuning trial
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
    assert state.counts() == {"planned": 8, "skipped": 0, "issued": 8, "running": 0, "completed": 7, "pruned": 1,
                              "diverged": 0, "failed": 0}


def test_a_cell_whose_tuning_is_all_degenerate_is_skipped_and_the_study_still_completes(plan, tmp_path):
    """Constant embeddings (layer 0 with cls pooling) finish every round without a dev score: the cell
    has nothing to replicate. It is a result (skipped, with the reason), not a hang or a hole."""
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    tuning = [state.next_trial() for _ in range(4)]
    for record in tuning:
        run(state, record, [float("nan")] * 3 if record.cell == 0 else [10, 20, 30])
    replicates = [state.next_trial() for _ in range(2)]
    assert {r.cell for r in replicates} == {1} and state.next_trial() is None
    assert state.skip_reason(plan.cells[0]) == "skipped: every tuning trial degenerate"
    assert state.skip_reason(plan.cells[1]) is None
    for record in replicates:
        run(state, record, [50, 51, 52])
    assert state.next_trial() == FINISHED and state.is_complete()
    assert state.counts()["skipped"] == 2 and state.counts()["completed"] == 6
    from rich.console import Console

    from orchestrator.run.progress import status_table

    console = Console(width=200, record=True)
    console.print(status_table(state))
    shown = console.export_text()
    assert "skipped: every tuning trial degenerate" in shown and "8 planned, 2 skipped" in shown


def test_the_costliest_cells_start_first_and_the_order_survives_the_stored_plan(tiny_bert, synthetic_data_dir,
                                                                              tmp_path):
    """Longest trials first: on 2 slots, a study of deep and shallow cells ends with short trials
    instead of one deep trial running alone. Epochs weigh in as well as layers."""
    study = parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1, 2], "epochs": [1, 3]},
                         "replicate": {"seeds": [5]}, "data_dir": str(synthetic_data_dir),
                         "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    plan = build_plan(study, tmp_path)
    assert [c.values for c in plan.cells] == [{"layer": 1, "epochs": 1}, {"layer": 2, "epochs": 1},
                                              {"layer": 1, "epochs": 3}, {"layer": 2, "epochs": 3}]
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    assert [state.next_trial().key for _ in range(4)] == ["c3-s5", "c2-s5", "c1-s5", "c0-s5"]  # costs 9, 6, 3, 2
    stored = plan_from_record(study, StudyRecord.from_json(plan_record(plan).to_json()))
    assert [c.index for c in stored.start_order()] == [3, 2, 1, 0]


def test_the_sampler_seed_draws_other_configurations_and_the_same_seed_the_same(tiny_bert, synthetic_data_dir,
                                                                                tmp_path):
    def drawn(sampler_seed: int | None, name: str) -> list[float]:
        tune = {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 3, "startup_trials": 3}
        if sampler_seed is not None:
            tune["sampler_seed"] = sampler_seed
        study = parse_study({"name": "s", "model": tiny_bert, "tune": tune, "data_dir": str(synthetic_data_dir),
                             "tracking": {"mlflow_uri": "sqlite:///x.db"}})
        state = StudyState(build_plan(study, tmp_path), Journal(tmp_path / f"{name}.jsonl"))
        return [state.next_trial().tuned["lr"] for _ in range(3)]

    assert drawn(None, "a") == drawn(1000, "b") != drawn(1007, "c")


def test_random_search_ignores_what_earlier_trials_scored_and_tpe_does_not(tiny_bert, synthetic_data_dir, tmp_path):
    """`tune.sampler: random` draws every trial at random (a baseline for the searcher comparison);
    TPE, past its startup trials, draws from what the cell's finished trials scored."""
    def fifth(sampler: str, scores: list[float], name: str) -> float:
        tune = {"params": {"lr": {"loguniform": [1e-5, 1e-1]}}, "trials": 5, "startup_trials": 2,
                "scheduler": "none", "sampler": sampler}
        study = parse_study({"name": "s", "model": tiny_bert, "tune": tune, "data_dir": str(synthetic_data_dir),
                             "train": {"epochs": 1}, "tracking": {"mlflow_uri": "sqlite:///x.db"}})
        state = StudyState(build_plan(study, tmp_path), Journal(tmp_path / f"{name}.jsonl"))
        for score in scores:
            run(state, state.next_trial(), [score])
        return state.next_trial().tuned["lr"]

    assert fifth("random", [1, 2, 3, 4], "r1") == fifth("random", [4, 3, 2, 1], "r2")
    assert fifth("tpe", [1, 2, 3, 4], "t1") != fifth("tpe", [4, 3, 2, 1], "t2")


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
    assert len(again.studies[a.cell].trials) == 1 and again.studies[a.cell].trials[0].value == 30
    resumed = again.next_trial()
    assert resumed.key == b.key and resumed.tuned == b.tuned and resumed.checkpoint == "/ckpt/b1"
    assert again.asked[b.key].params == b.tuned
    assert again.next_trial().key == "c1-t1"  # round-robin, the costlier cell (layer 2) first


def test_tuning_seed_must_lie_outside_the_replicate_seeds(tiny_bert, synthetic_data_dir, tmp_path):
    from trainables.errors import UserInputError

    study = parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1]},
                         "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 2, "seed": 1},
                         "replicate": {"seeds": [0, 1]}, "data_dir": str(synthetic_data_dir),
                         "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    with pytest.raises(UserInputError, match=r"tune.seed: 1 is not valid; tuning trials need a seed outside "
                                             r"replicate.seeds \[0, 1\]"):
        build_plan(study, tmp_path)


def test_a_finished_tuning_trial_without_a_dev_score_replays_as_failed(plan, tmp_path):
    """A degenerate trial (constant embeddings) completes without a finite dev value; Optuna refuses
    such a COMPLETE trial, so the replay tells it FAIL instead of crashing resume, status and sync."""
    journal = Journal(tmp_path / "j.jsonl")
    state = StudyState(plan, journal)
    record = state.next_trial()
    state.on_result(record.key, {"epoch": 1, "dev_spearman": None, "degenerate": 1})
    state.on_result(record.key, {"epoch": 3, "dev_spearman": float("nan"), "degenerate": 1})
    state.on_finished(record.key, Outcome.COMPLETED)
    replayed = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    assert replayed.studies[record.cell].trials[0].state.name == "FAIL"
    assert replayed.next_trial().key == "c0-t0"


def test_a_torn_last_journal_line_does_not_swallow_the_next_event(plan, tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal(path)
    state = StudyState(plan, journal)
    record = state.next_trial()
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"event": "result", "key": "' + record.key + '", "metr')  # power cut mid-write
    reopened = Journal(path)  # the next launch opens it
    reopened.write("finished", key=record.key, outcome="failed", error="boom")
    assert path.read_text().endswith("}\n") and path.read_text().count("\n") == 2
    replayed = reopened.records()
    assert replayed[record.key].outcome == Outcome.FAILED and replayed[record.key].results == []


class FakeRay:
    """What check_cluster reads of a cluster: its nodes and their resources."""

    def __init__(self, *nodes: dict, dead: tuple[dict, ...] = ()):
        self._nodes = [{"Alive": True, "Resources": r} for r in nodes] + [{"Alive": False, "Resources": r}
                                                                           for r in dead]

    def nodes(self):
        return self._nodes


@pytest.mark.parametrize(("resources", "message"), [
    ({"cpu": 3}, "resources.cpu: 3.0 is not valid; no node has 3 CPUs (the largest of 2 has 2)"),
    ({"cpu": 1, "gpu": 2}, "resources.gpu: 2.0 is not valid; no node has 2 GPUs (the largest has 1)"),
])
def test_a_trial_request_must_fit_the_largest_node_not_the_cluster_total(resources, message):
    from orchestrator.run.ray_session import check_cluster
    from orchestrator.study.config import parse_study
    from trainables.errors import UserInputError

    study = parse_study({"name": "s", "model": "m", "resources": resources})
    cluster = FakeRay({"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}, dead=({"CPU": 64, "GPU": 8},))
    with pytest.raises(UserInputError, match=re.escape(message)):
        check_cluster(cluster, study)
    check_cluster(cluster, parse_study({"name": "s", "model": "m", "resources": {"cpu": 2, "gpu": 0.5}}))


@pytest.mark.parametrize(("resources", "max_concurrent", "expected"), [
    ({"cpu": 1}, None, 2), ({"cpu": 2}, None, 1), ({"cpu": 1, "gpu": 0.25}, None, 2),
    ({"cpu": 0.5, "gpu": 0.25}, None, 4), ({"cpu": 0.5, "gpu": 0.25}, 3, 3), ({"cpu": 4}, None, 1),
    ({"cpu": 1}, 6, 6),  # a cluster that will grow (autoscaling): the user says how far
])
def test_tune_may_start_a_worker_for_every_slot(resources, max_concurrent, expected):
    """Tune keeps one trial pending for a custom searcher unless told otherwise, and then a short
    trial hands its worker to the pending trial and kills the one starting for it: on 2 slots,
    benchmarks/orchestration.py saw one trial at a time (52 % busy) until Tune was told the slots."""
    from orchestrator.run.ray_session import slots
    from orchestrator.study.config import parse_study

    study = parse_study({"name": "s", "model": "m", "resources": resources})
    assert slots(study, {"CPU": 2.0, "GPU": 1.0}, max_concurrent) == expected


def test_the_searcher_hands_out_one_trial_per_slot_so_tpe_asks_with_what_is_known(plan, tmp_path):
    from orchestrator.run.tune_adapters import PlanSearcher

    searcher = PlanSearcher(StudyState(plan, Journal(tmp_path / "j.jsonl")), max_concurrent=2)
    first, second = searcher.suggest("ray-a"), searcher.suggest("ray-b")
    assert [first["trial_key"], second["trial_key"]] == ["c1-t0", "c0-t0"]
    assert searcher.suggest("ray-c") is None  # both slots busy: the third waits, unsampled
    searcher.state.on_result("c1-t0", {"epoch": 3, "dev_spearman": 50.0})
    searcher.on_trial_complete("ray-a", {"dev_spearman": 50.0})
    assert searcher.suggest("ray-c")["trial_key"] == "c1-t1"
    assert searcher.state.records["c1-t0"].outcome == Outcome.COMPLETED


def test_status_needs_neither_the_data_folder_nor_the_model(tiny_bert, synthetic_data_dir, tmp_path, monkeypatch):
    import shutil

    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.study.folder import JOURNAL, META, RECORD, STUDY_FILE
    from orchestrator.study.plan import plan_record

    model, data = tmp_path / "model", tmp_path / "data"
    shutil.copytree(tiny_bert, model)
    shutil.copytree(synthetic_data_dir, data)
    raw = {"name": "s", "model": str(model), "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0]},
           "data_dir": str(data), "train": {"epochs": 2}, "tracking": {"mlflow_uri": "sqlite:///x.db"}}
    folder = tmp_path / "studies" / "s"
    folder.mkdir(parents=True)
    (folder / STUDY_FILE).write_text(yaml.safe_dump(raw))
    (folder / META).write_text(json.dumps({"base_dir": str(tmp_path), "tracking_uri": "sqlite:///x.db"}))
    plan = build_plan(parse_study(raw), tmp_path)
    (folder / RECORD).write_text(plan_record(plan).to_json())
    state = StudyState(plan, Journal(folder / JOURNAL))
    run(state, state.next_trial(), [40.0, 41.5])
    shutil.rmtree(model)
    shutil.rmtree(data)
    monkeypatch.delenv("ORCHESTRATOR_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["status", "s", "--storage", str(tmp_path / "studies")])
    assert result.exit_code == 0, result.output
    assert "layer=1" in result.stdout and "41.5" in result.stdout and "layer=2" in result.stdout


def test_more_tuning_trials_that_find_a_better_config_rerun_its_replicates(tiny_bert, synthetic_data_dir, tmp_path):
    raw = {"name": "s", "model": tiny_bert, "ablate": {"layer": [1]},
           "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 2, "startup_trials": 1},
           "replicate": {"seeds": [5]}, "train": {"epochs": 2}, "data_dir": str(synthetic_data_dir),
           "tracking": {"mlflow_uri": "sqlite:///x.db"}}
    path = tmp_path / "j.jsonl"
    state = StudyState(build_plan(parse_study(raw), tmp_path), Journal(path))
    for value in (10, 20):
        run(state, state.next_trial(), [value, value])
    first = state.next_trial()
    run(state, first, [30, 31])
    assert state.next_trial() == FINISHED
    extended = StudyState(build_plan(parse_study({**raw, "tune": {**raw["tune"], "trials": 3}}), tmp_path),
                          Journal(path))
    tuning = extended.next_trial()
    assert tuning.key == "c0-t2" and extended.next_trial() is None
    run(extended, tuning, [50, 60])  # a better config than the one the replicate ran with
    again = extended.next_trial()
    assert again.key == "c0-s5-r1" and again.tuned == tuning.tuned
    assert extended.records["c0-s5"].superseded and not extended.is_complete()
    run(extended, again, [40, 41])
    assert extended.is_complete() and [r.key for r in extended.replicates(extended.plan.cells[0])] == ["c0-s5-r1"]
    assert Journal(path).records()["c0-s5"].superseded  # the journal remembers it


def test_each_cells_optuna_study_is_kept_for_optuna_dashboard(plan, tmp_path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    log = tmp_path / "optuna.log"
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"), log)
    first, second = state.next_trial(), state.next_trial()
    run(state, first, [10, 20, 30])
    run(state, second, [5], Outcome.COMPLETED)  # stopped early: pruned
    storage = JournalStorage(JournalFileBackend(str(log)))
    names = sorted(s.study_name for s in storage.get_all_studies())
    assert names == ["s layer=1", "s layer=2"]
    trial = optuna.load_study(study_name="s layer=2", storage=storage).trials[0]  # the costlier cell went first
    assert trial.state.name == "COMPLETE" and trial.value == 30 and trial.intermediate_values == {1: 10, 2: 20, 3: 30}
    assert optuna.load_study(study_name="s layer=1", storage=storage).trials[0].state.name == "PRUNED"
    StudyState(plan, Journal(tmp_path / "j.jsonl"), log)  # the next launch rewrites it from the journal
    again = optuna.load_study(study_name="s layer=2", storage=JournalStorage(JournalFileBackend(str(log))))
    assert [t.value for t in again.trials] == [30]


def drive(state: StudyState) -> None:
    """The launch loop without Ray: run each trial the plan hands out with its kind, one at a time."""
    from trainables.contract import collect

    while True:
        record = state.next_trial()
        if record == FINISHED:
            return
        assert record is not None, "nothing runs, yet the plan waits"
        reports = []
        state.plan.kind.run(record.config, collect(reports))
        for metrics in reports:
            state.on_result(record.key, metrics)
        state.on_finished(record.key, Outcome.COMPLETED)


@pytest.mark.parametrize(("rule", "quiet_why", "noisy_why"), [
    ("two_stage", "stopped: 3 seeds as the first 3 fixed; dev 95% CI ±", "(capped at max_seeds)"),
    ("sequential", "stopped: dev 95% CI ±", "stopped at max_seeds 8: dev 95% CI ±")])
def test_noisy_cells_get_more_seeds_than_quiet_ones_until_the_dev_mean_is_precise(rule, quiet_why, noisy_why,
                                                                                  synthetic_data_dir, tmp_path,
                                                                                  monkeypatch):
    from trainables.kinds import KINDS

    monkeypatch.setitem(KINDS, "toy", "tests.toy_kind:ToyKind")  # its dev noise grows with lr
    study = parse_study({"name": "adaptive", "trainable": "toy", "model": "toy", "data_dir": str(synthetic_data_dir),
                         "ablate": {"lr": [0.001, 0.3]}, "train": {"epochs": 3},
                         "replicate": {"seeds": 3, "max_seeds": 8, "until": {"dev_ci95": 1.0, "rule": rule}},
                         "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    state = StudyState(build_plan(study, tmp_path), Journal(tmp_path / "j.jsonl"))
    drive(state)
    quiet, noisy = (state.replicates(cell) for cell in state.plan.cells)
    assert len(quiet) == 3 and len(noisy) == 8 and len(quiet) + len(noisy) < 8 * 2
    assert sorted(r.seed for r in noisy) == list(range(8))
    assert state.seed_rule(state.plan.cells[0])[1].startswith(quiet_why)
    assert noisy_why in state.seed_rule(state.plan.cells[1])[1]
    assert state.is_complete() and all(r.config["score_test"] for r in quiet + noisy)


@pytest.mark.parametrize(("replicate", "message"), [
    ({"seeds": 3, "max_seeds": 8}, "replicate.until: None is not valid; adaptive seeds need both"),
    ({"seeds": 3, "until": {"dev_ci95": 0.5}}, "replicate.max_seeds: None is not valid; adaptive seeds need both"),
    ({"seeds": 3, "max_seeds": 2, "until": {"dev_ci95": 0.5}}, "replicate.max_seeds: 2 is not valid; give at least"),
])
def test_an_adaptive_seed_rule_needs_both_bounds(tiny_bert, synthetic_data_dir, tmp_path, replicate, message):
    from trainables.errors import UserInputError

    study = parse_study({"name": "s", "model": tiny_bert, "data_dir": str(synthetic_data_dir), "replicate": replicate,
                         "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    with pytest.raises(UserInputError, match=re.escape(message)):
        build_plan(study, tmp_path)


def test_the_estimate_counts_asha_rungs_and_slots_from_the_pilot(plan, tmp_path):
    from orchestrator.checks.estimate import Pilot, estimate, expected_tuning_rounds

    # 3 epochs, grace 1, eta 3: every trial runs epoch 1, a third of them epochs 2..3
    assert expected_tuning_rounds(plan, plan.cells[0]) == pytest.approx(1 + 2 / 3)
    pilot = Pilot(build_s=10.0, unit_s=0.5, eval_s=4.0, units_per_round=20, test_s=6.0)
    found = estimate(plan, {0: pilot, 1: pilot}, cpus=2, stages=(0.0, 0))
    round_s = 20 * 0.5 + 4.0
    tuning = 2 * 2 * (10.0 + (1 + 2 / 3) * round_s)  # 2 cells x 2 trials
    replicates = 2 * 2 * (10.0 + 3 * round_s + 6.0)  # 2 cells x 2 seeds
    assert found.tuning_hours * 3600 == pytest.approx(tuning)
    assert found.replicate_hours * 3600 == pytest.approx(replicates)
    assert found.slots == 2 and found.wall_hours * 3600 == pytest.approx((tuning + replicates) / 2 + 25.0)


def test_plan_estimate_runs_a_pilot_and_a_budget_refuses_an_expensive_launch(tiny_bert, synthetic_data_dir,
                                                                               tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app

    monkeypatch.chdir(tmp_path)
    raw = {"name": "priced", "model": tiny_bert, "ablate": {"layer": [1, 3]}, "replicate": {"seeds": [0, 1]},
           "train": {"epochs": 2, "batch_size": 16}, "data_dir": str(synthetic_data_dir),
           "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}, "budget": {"hours": 1e-6}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "study.yaml"), "--estimate"])
    assert result.exit_code == 0, result.output
    assert "step " in result.stdout and "15 per round" in result.stdout  # 240 train pairs / 16
    assert "trial-h on" in result.stdout and "budget: 1e-06 h: OVER" in result.stdout
    kept = json.loads((tmp_path / "studies" / "priced" / "estimate.json").read_text())  # for the report, later
    assert kept["trial_hours"] > 0 and kept["from_budget"] == 0
    refused = CliRunner().invoke(app, ["launch", str(tmp_path / "study.yaml"), "--storage", str(tmp_path / "s")])
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: budget.hours: 1e-06 is not valid; the plan is estimated at ")
    assert "h over: raise the budget or shrink the study" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["studies", "study.yaml"]  # the refused launch: nothing
    assert [p.name for p in (tmp_path / "studies" / "priced").iterdir()] == ["estimate.json"]


def test_the_estimate_counts_each_distinct_pretraining_stage_once(tiny_bert, synthetic_data_dir, tmp_path):
    from orchestrator.checks.estimate import stage_cost

    raw = {"name": "dapt", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
           "ablate": {"pretrain_steps": [0, 30], "layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
           "train": {"epochs": 1, "pretrain": "mlm", "pretrain_corpus": "task", "pretrain_batch_size": 8,
                     "pretrain_max_seq_length": 16}, "tracking": {"mlflow_uri": "sqlite:///x.db"}}
    seconds, count = stage_cost(build_plan(parse_study(raw), tmp_path))
    assert count == 2 and seconds > 0  # 30 steps: one stage per replicate seed, shared by both layers
    shared = {**raw, "train": {**raw["train"], "stage_seed": "shared"}}
    assert stage_cost(build_plan(parse_study(shared), tmp_path))[1] == 1


def test_the_two_stage_rule_fixes_the_total_from_the_first_seeds_alone():
    from orchestrator.study.seed_rules import seeds_needed, wants_another

    # s = 1 over [1, 2, 3], t(0.975, 2 df) = 4.3027: n = ceil((4.3027 / 2)^2) = ceil(4.628) = 5
    assert seeds_needed([1.0, 2.0, 3.0], 2.0, 10) == 5
    assert seeds_needed([1.0, 2.0, 3.0], 0.5, 10) == 10 and seeds_needed([2.0, 2.0, 2.0], 0.5, 10) == 3
    # later seeds never change the decision, however they fall: the std is not selected for being small
    assert wants_another("two_stage", [1.0, 2.0, 3.0, 2.0], 3, 2.0, 10)[0]
    assert not wants_another("two_stage", [1.0, 2.0, 3.0, 9.0, -5.0], 3, 2.0, 10)[0]


def test_the_two_stage_rule_reports_steins_interval_not_the_t_interval_over_all_seeds():
    """Stein's interval: t with k-1 degrees of freedom times the first stage's std, over sqrt(n). Its
    coverage is exact; the t-interval over all n seeds (what status said before) is narrower here."""
    from orchestrator.study.seed_rules import ci95_half, stein_half, wants_another

    values = [1.0, 2.0, 3.0, 2.0, 2.1]  # s = 1 over the first 3; n = 5 (as the rule fixed it for ±2)
    assert stein_half(values[:3], 5) == pytest.approx(4.302653 * 1.0 / 5 ** 0.5, rel=1e-6)
    more, why = wants_another("two_stage", values, 3, 2.0, 10)
    assert not more and why.endswith(f"dev 95% CI ±{stein_half(values[:3], 5):.2f} (Stein)")
    assert f"±{ci95_half(values):.2f}" not in why  # 0.88 over all n against Stein's 1.92


def test_the_dashboard_mirror_has_real_durations_and_pruned_curves(plan, tmp_path, monkeypatch):
    """optuna-dashboard read every trial as lasting 0 ms (the mirror is rebuilt from the journal at
    each launch, and the journal had no times); pruned trials must keep their intermediate values."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from orchestrator.study import journal as journal_module

    clock = [1_700_000_000.0]
    monkeypatch.setattr(journal_module.time, "time", lambda: clock[0])
    journal = Journal(tmp_path / "j.jsonl")
    state = StudyState(plan, journal)
    records = [state.next_trial() for _ in range(2)]
    clock[0] += 90
    run(state, records[0], [10, 20, 30])
    clock[0] += 30
    run(state, records[1], [5])  # one of three epochs: pruned
    log = tmp_path / "optuna.log"
    StudyState(plan, Journal(tmp_path / "j.jsonl"), log)  # the next launch rebuilds the mirror
    storage = JournalStorage(JournalFileBackend(str(log)))
    trials = [t for s in storage.get_all_studies() for t in storage.get_all_trials(s._study_id)]  # one study a cell
    by_state = {t.state.name: t for t in trials}
    assert len(trials) == 2
    complete, pruned = by_state["COMPLETE"], by_state["PRUNED"]
    assert (complete.datetime_complete - complete.datetime_start).total_seconds() == 90
    assert (pruned.datetime_complete - pruned.datetime_start).total_seconds() == 120
    assert pruned.intermediate_values == {1: 5.0} and complete.intermediate_values == {1: 10, 2: 20, 3: 30}


@settings(max_examples=int(os.environ.get("REPORT_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["issue", "result", "finish", "replay"]), st.integers(0, 99),
                                st.sampled_from(list(Outcome)), st.floats(0, 100)), max_size=60))
def test_what_the_state_keeps_as_it_goes_equals_a_recount_of_its_trials(plan, tmp_path_factory, steps):
    """Counts, tuning_done and best_tuned are kept as trials come and go (no question scans the whole
    study); whatever happens, and after a replay of the journal, they equal a recount from scratch."""
    path = tmp_path_factory.mktemp("j") / "j.jsonl"
    state = StudyState(plan, Journal(path))
    for action, pick, outcome, value in steps:
        running = [r for r in state.records.values() if not r.finished]
        if action == "issue":
            state.next_trial()
        elif action == "result" and running:
            record = running[pick % len(running)]
            state.on_result(record.key, {"epoch": len(record.results) + 1, "dev_spearman": value})
        elif action == "finish" and running:
            state.on_finished(running[pick % len(running)].key, outcome)
        elif action == "replay":
            state = StudyState(plan, Journal(path))
        records = list(state.records.values())
        counts = state.counts()
        assert counts["issued"] == len(records) and counts["running"] == sum(not r.finished for r in records)
        assert all(counts[o.value] == sum(r.outcome == o for r in records) for o in Outcome)
        for cell in plan.cells:
            tuning = [r for r in records if r.cell == cell.index and r.phase == "tune"]
            assert state.tuning_done(cell) == (len(tuning) >= plan.trials_per_cell and all(r.finished for r in tuning))
            assert {r.key for r in state.issued(cell, "tune")} == {r.key for r in tuning}
            scored = [r for r in tuning if r.outcome == Outcome.COMPLETED and state._value(r) is not None]
            best = state.best_tuned(cell)
            assert (best is None) == (not scored)
            assert best is None or state._value(best) == max(state._value(r) for r in scored)


def test_every_training_kind_has_a_pilot_and_a_budget_without_one_is_refused(tiny_bert, synthetic_data_dir,
                                                                            tmp_path):
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from trainables.kinds import get_kind

    def study(kind: str, **extra) -> str:
        example = get_kind(kind).example
        raw = {"name": kind, "trainable": kind, "model": tiny_bert, "data_dir": str(synthetic_data_dir),
               "train": {k: v for k, v in example.items() if k not in ("max_train_samples", "max_eval_samples")},
               "tracking": {"mlflow_uri": "sqlite:///x.db"}, **extra}
        (tmp_path / f"{kind}.yaml").write_text(yaml.safe_dump(raw))
        return str(tmp_path / f"{kind}.yaml")

    assert CliRunner().invoke(app, ["validate", study("distill", budget={"hours": 1.0})]).exit_code == 0
    refused = CliRunner().invoke(app, ["validate", study("probe", budget={"hours": 1.0})])
    assert refused.exit_code == 2 and refused.stderr == ("error: budget: {'hours': 1.0} is not valid; probe has no "
                                                         "pilot to estimate it with (it trains nothing); remove budget "
                                                         "to launch without an estimate\n")


def test_a_distill_study_is_estimated_from_a_cycle_on_a_few_pairs(tiny_bert, synthetic_data_dir, tmp_path):
    """distill declares its pilot: one cycle on 2 x 16 of its 240 pairs, scaled by pairs; a teacher round
    is timed whole, its stage in a scratch folder that the pilot leaves nowhere."""
    from orchestrator.checks.estimate import estimate, pilot

    raw = {"name": "d", "trainable": "distill", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
           "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
           "train": {"cycles": 3, "bi_epochs": 1, "bi_batch_size": 16, "cross_batch_size": 8},
           "tracking": {"mlflow_uri": "sqlite:///x.db"}}
    plan = build_plan(parse_study(raw), tmp_path)
    found = pilot(plan, plan.cells[0])
    assert found.unit == "pair" and found.units_per_round == 240 and found.unit_s > 0 and found.eval_s > 0
    total = estimate(plan, {0: found, 1: found}, cpus=1, stages=(0.0, 0))
    per_trial = found.build_s + 3 * (240 * found.unit_s + found.eval_s) + found.test_s
    assert total.replicate_hours * 3600 == pytest.approx(4 * per_trial) and total.replicate_rounds == 12
    teacher = build_plan(parse_study({**raw, "train": {**raw["train"], "mode": "teacher"}}), tmp_path)
    whole = pilot(teacher, teacher.cells[0])
    assert whole.unit == "round" and whole.units_per_round == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no stage cache, no model: the pilot is scratch


def test_a_kind_declares_nothing_more_to_be_estimated(monkeypatch, tiny_bert, synthetic_data_dir, tmp_path):
    """The toy kind (tests only) gets an estimate from the default pilot: its own first round."""
    from orchestrator.checks.estimate import estimate, pilots_per_cell
    from trainables.kinds import KINDS

    monkeypatch.setitem(KINDS, "toy", "tests.toy_kind:ToyKind")
    raw = {"name": "toy", "trainable": "toy", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
           "ablate": {"lr": [0.1, 1.0]}, "replicate": {"seeds": [0, 1, 2]}, "train": {"epochs": 4},
           "tracking": {"mlflow_uri": "sqlite:///x.db"}}
    plan = build_plan(parse_study(raw), tmp_path)
    pilots = pilots_per_cell(plan)
    assert {p.unit for p in pilots.values()} == {"round"}
    found = estimate(plan, pilots, cpus=2, stages=(0.0, 0))
    assert found.replicate_rounds == 2 * 3 * 4 and found.replicate_hours > 0


def tune_one_by_one(state: StudyState, scores: list[list[float]]) -> list[str]:
    """Tuning trials run one at a time, each epoch's dev score reported, stopped where the pruner says."""
    outcomes = []
    for values in scores:
        record = state.next_trial()
        assert record.phase == "tune"
        for epoch, value in enumerate(values, start=1):
            if state.on_result(record.key, {"epoch": epoch, "dev_spearman": value}):
                break
        state.on_finished(record.key, Outcome.COMPLETED)  # stopped early: recorded as pruned
        outcomes.append(f"{record.key} {state.records[record.key].outcome.value} after "
                        f"{len(state.records[record.key].results)}")
    return outcomes


@pytest.mark.parametrize(("scheduler", "journaled"), [("asha", True), ("hyperband", True), ("asha", False)])
def test_a_resumed_cell_prunes_as_the_uninterrupted_one_would(tiny_bert, synthetic_data_dir, tmp_path, scheduler,
                                                              journaled):
    """The pruner's rung records (Optuna's `completed_rung_N` of each finished trial) survive a resume: the
    trials after it are compared with the same earlier ones, and stopped where an uninterrupted study
    stops them (they were lost: the first trial after a resume competed with no one and always went on)."""
    study = parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1]},
                         "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 7, "startup_trials": 1,
                                  "scheduler": scheduler},
                         "replicate": {"seeds": [5]}, "train": {"epochs": 9},
                         "data_dir": str(synthetic_data_dir), "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    plan = build_plan(study, tmp_path)
    good = [60.0 + epoch for epoch in range(9)]
    scores = [good, [70.0 + epoch for epoch in range(9)], [65.0 + epoch for epoch in range(9)], good,
              [10.0] * 9, [20.0] * 9, [75.0 + epoch for epoch in range(9)]]
    straight = tune_one_by_one(StudyState(plan, Journal(tmp_path / "straight.jsonl")), scores)
    first = tune_one_by_one(StudyState(plan, Journal(tmp_path / "resumed.jsonl")), scores[:4])
    lines = (tmp_path / "resumed.jsonl").read_text().splitlines()
    assert any('"rungs"' in line for line in lines)
    if not journaled:  # a journal written before the rungs were: successive halving's are recomputed
        events = [json.loads(line) for line in lines]
        (tmp_path / "resumed.jsonl").write_text("".join(json.dumps({k: v for k, v in e.items() if k != "rungs"})
                                                        + "\n" for e in events))
    resumed = StudyState(plan, Journal(tmp_path / "resumed.jsonl"))  # a new launch replays the journal
    assert first + tune_one_by_one(resumed, scores[4:]) == straight
    assert any("pruned" in line for line in straight[4:])  # the comparison the resume must not lose
    rungs = {k: v for k, v in resumed.studies[0].trials[1].system_attrs.items() if k.startswith("completed_rung_")}
    live = StudyState(plan, Journal(tmp_path / "again.jsonl"))
    tune_one_by_one(live, scores[:2])
    assert rungs == {k: v for k, v in live.studies[0].trials[1].system_attrs.items()
                     if k.startswith("completed_rung_")} != {}


def test_a_tuning_trial_interrupted_mid_way_goes_on_from_the_rung_it_had_reached(tiny_bert, synthetic_data_dir,
                                                                                  tmp_path):
    """A trial stopped between its epochs (a crash, Ctrl-C) continues after a resume with its reported scores
    and rung records given back to its new Optuna trial: the pruner stops it where it would have."""
    study = parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1]},
                         "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 5, "startup_trials": 1},
                         "replicate": {"seeds": [5]}, "train": {"epochs": 9},
                         "data_dir": str(synthetic_data_dir), "tracking": {"mlflow_uri": "sqlite:///x.db"}})
    plan = build_plan(study, tmp_path)
    falling = [[base - 5 * epoch for epoch in range(9)] for base in (90.0, 92.0, 91.0, 93.0)]
    late = [95.0, 95.0, 85.0, 84.0, 83.0, 82.0, 81.0, 80.0, 79.0]  # the best at rung 0 (epoch 1) and at rung 1
    straight = tune_one_by_one(StudyState(plan, Journal(tmp_path / "straight.jsonl")), [*falling, late])
    assert straight[-1] == "c0-t4 completed after 9"  # (epoch 3), though below every trial's rung-0 score

    state = StudyState(plan, Journal(tmp_path / "resumed.jsonl"))
    tune_one_by_one(state, falling)
    record = state.next_trial()
    for epoch in (1, 2):  # then the driver dies
        assert not state.on_result(record.key, {"epoch": epoch, "dev_spearman": late[epoch - 1]})
    resumed = StudyState(plan, Journal(tmp_path / "resumed.jsonl"))
    again = resumed.next_trial()
    assert again.key == record.key and [r["epoch"] for r in again.results] == [1, 2]
    for epoch in range(3, 10):  # compared at rung 1 with rung 1's scores, not at rung 0 again with rung 0's
        assert not resumed.on_result(again.key, {"epoch": epoch, "dev_spearman": late[epoch - 1]})
    resumed.on_finished(again.key, Outcome.COMPLETED)
    assert resumed.records[again.key].outcome == Outcome.COMPLETED
