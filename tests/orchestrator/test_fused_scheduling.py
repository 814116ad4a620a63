"""Fused arrays in the plan, without Ray (issue 56): `resources.fuse` resolved per cell, arrays formed from a cell's
replicates and tuning suggestions, and the cell's pruner deciding for each member exactly as for a trial alone
given the same reported values."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from orchestrator.run.tune_adapters import MEMBERS, ArrayDecisions, CellScheduler, PlanSearcher, trial_keys
from orchestrator.study.config import parse_study
from orchestrator.study.journal import Journal, Outcome
from orchestrator.study.plan import build_plan, plan_from_record, plan_record
from orchestrator.study.state import StudyState
from trainables.errors import UserInputError


def study(tiny_bert, data_dir, fuse, gpu=0.0, **changes):
    return parse_study({"name": "s", "model": tiny_bert, "ablate": {"layer": [1, 2]},
                        "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": 8, "startup_trials": 2,
                                 "grace_epochs": 1, "reduction_factor": 2},
                        "replicate": {"seeds": [0, 1, 2, 3, 4]}, "train": {"epochs": 3},
                        "resources": {"cpu": 1, "gpu": gpu, "fuse": fuse}, "data_dir": str(data_dir),
                        "tracking": {"mlflow_uri": "sqlite:///x.db"}, **changes})


def test_fuse_is_resolved_per_cell_and_said_with_its_reason(tiny_bert, synthetic_data_dir, tmp_path):
    auto = build_plan(study(tiny_bert, synthetic_data_dir, "auto"), tmp_path)
    assert [c.members for c in auto.fusion] == [1, 1] and "run on CPUs" in auto.fusion[0].why
    on_gpu = build_plan(study(tiny_bert, synthetic_data_dir, "auto", gpu=1), tmp_path)
    assert [(c.members, c.tuning) for c in on_gpu.fusion] == [(8, True), (8, True)]
    shared = build_plan(study(tiny_bert, synthetic_data_dir, "auto", gpu=0.25), tmp_path)
    assert [c.members for c in shared.fusion] == [1, 1] and "0.25 of a GPU" in shared.fusion[0].why
    fixed = build_plan(study(tiny_bert, synthetic_data_dir, 4), tmp_path)
    assert [(c.members, c.tuning, c.why) for c in fixed.fusion] == [(4, True, "resources.fuse: 4")] * 2
    assert fixed.members_of(0) == fixed.tuning_members_of(1) == 4
    # tuning a parameter that is not an optimizer scalar: replicates fuse, tuning trials run alone
    pooled = build_plan(study(tiny_bert, synthetic_data_dir, 4, tune={
        "params": {"lr": {"loguniform": [1e-4, 1e-2]}, "pooling": ["mean", "max"]}, "trials": 4}), tmp_path)
    assert pooled.members_of(0) == 4 and pooled.tuning_members_of(0) == 1
    assert pooled.fusion[0].why == "resources.fuse: 4; tuning trials alone: they tune pooling, not only optimizer " \
                                   "scalars"
    # the record keeps the choice, and a plan read back from it makes the same arrays
    again = plan_from_record(fixed.study, plan_record(fixed))
    assert again.fusion == fixed.fusion
    off = build_plan(study(tiny_bert, synthetic_data_dir, "off", gpu=1), tmp_path)
    assert [c.members for c in off.fusion] == [1, 1]


def test_a_number_the_kind_cannot_fuse_is_refused_in_one_line_and_auto_says_why(tiny_bert, synthetic_data_dir,
                                                                               tmp_path):
    with pytest.raises(UserInputError) as refused:
        build_plan(study(tiny_bert, synthetic_data_dir, 4, train={"epochs": 3, "lora_rank": 4}), tmp_path)
    assert str(refused.value) == ("resources.fuse: 4 is not valid; lora_rank: adapters are not stacked, so these "
                                  "trials cannot train as one array: use resources.fuse: off, or auto (which fuses "
                                  "the cells that can)")
    auto = build_plan(study(tiny_bert, synthetic_data_dir, "auto", gpu=1, train={"epochs": 3, "lora_rank": 4}),
                      tmp_path)
    assert [c.members for c in auto.fusion] == [1, 1] and auto.fusion[0].why == "auto: lora_rank: adapters are " \
                                                                                "not stacked"


def fake_trial(config: dict, number: int) -> SimpleNamespace:
    return SimpleNamespace(config=config, trial_id=f"ray{number}")


def replay(plan, tmp_path, name: str, curves: dict[int, list[float]]) -> dict[str, tuple[str, int]]:
    """Run the tuning through the searcher and the scheduler with each trial's dev curve given by its number in
    its cell (`curves`), every trial running at once and reporting epoch 1, then 2, then 3 in the order the trials
    were asked (a cell's trials in the same order both ways); returns each trial's outcome and last epoch."""
    state = StudyState(plan, Journal(tmp_path / f"{name}.jsonl"))
    searcher, scheduler = PlanSearcher(state), CellScheduler(state)
    running = []
    while True:
        config = searcher.suggest(f"ray{len(running)}")
        if not isinstance(config, dict):
            break  # every tuning trial is out; the replicates wait for the outcomes
        running.append(fake_trial(config, len(running)))
    for epoch in (1, 2, 3):
        for trial in running:
            keys = [k for k in trial_keys(trial.config) if not state.records[k].finished]
            if not keys or trial.trial_id not in searcher.keys:
                continue
            values = {k: {"epoch": epoch, "dev_spearman": curves[int(k.split("-t")[1])][epoch - 1]} for k in keys}
            if MEMBERS in trial.config:
                decision = scheduler.on_trial_result(None, trial, {MEMBERS: values})
            else:
                decision = scheduler.on_trial_result(None, trial, values[keys[0]])
            if decision == "STOP" or epoch == 3:
                searcher.on_trial_complete(trial.trial_id, values[keys[-1]])
    return {r.key: (r.outcome.value, int(r.last["epoch"])) for r in state.records.values()}


def test_the_pruner_decides_for_each_fused_member_as_for_the_same_trial_alone(tiny_bert, synthetic_data_dir,
                                                                             tmp_path):
    generator = random.Random(7)
    curves = {n: sorted(generator.uniform(0, 90) for _ in range(3)) for n in range(8)}
    fused = replay(build_plan(study(tiny_bert, synthetic_data_dir, 4), tmp_path), tmp_path, "fused", curves)
    alone = replay(build_plan(study(tiny_bert, synthetic_data_dir, "off"), tmp_path), tmp_path, "alone", curves)
    assert fused == alone and len(fused) == 16
    outcomes = {outcome for outcome, _ in fused.values()}
    assert outcomes == {Outcome.PRUNED.value, Outcome.COMPLETED.value}  # the replay is not one-sided


def test_an_array_of_tuning_members_asks_one_cell_for_distinct_suggestions(tiny_bert, synthetic_data_dir, tmp_path):
    plan = build_plan(study(tiny_bert, synthetic_data_dir, 4), tmp_path)
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    first = state.next_array()
    assert [r.key for r in first] == ["c1-t0", "c1-t1", "c1-t2", "c1-t3"]  # the costlier cell, one array
    assert len({r.tuned["lr"] for r in first}) == 4
    assert all(r.seed == 10_000 for r in first)
    assert [r.key for r in state.next_array()] == ["c0-t0", "c0-t1", "c0-t2", "c0-t3"]


def test_the_decisions_actor_keeps_each_arrays_stopped_members_apart():
    decisions = ArrayDecisions()
    decisions.stop("c0-t0+3", "c0-t2")
    decisions.stop("c1-t0+3", "c1-t1")
    assert decisions.stopped("c0-t0+3") == ["c0-t2"] and decisions.stopped("c9") == []


def test_a_launch_with_fused_tuning_arrays_prunes_members_and_closes_each_members_run(tiny_bert, synthetic_data_dir,
                                                                                      tmp_path):
    """The real launch (journal, per-cell Optuna, MLflow) with Tune's execution replaced by benchmarks/instant.py:
    tuning and replicate trials in arrays of 4, the members the pruner stops ending as pruned (MLflow KILLED)
    while their arrays go on, one MLflow run per trial, and every replicate of the winning config."""
    import math

    import yaml
    from mlflow.tracking import MlflowClient

    from benchmarks.instant import instant_executor
    from orchestrator.run.launcher import launch

    def score(config: dict, seed: int, epoch: int) -> float:  # the higher the lr, the better: low ones are pruned
        return 50 + 10 * math.log10(config["lr"]) + epoch + 0.1 * seed

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**study(tiny_bert, synthetic_data_dir, 4).model_dump(mode="json",
                                                                                          exclude_defaults=True),
                                    "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    result = launch(path, storage=tmp_path / "studies", progress=False, executor=instant_executor(score, slots=2))
    assert result.finished
    counts = result.counts
    assert counts["pruned"] > 0 and counts["completed"] + counts["pruned"] == 2 * 8 + 2 * 5
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("s").experiment_id])
            if "mlflow.parentRunId" in r.data.tags]
    keys = [r.data.tags["orchestrator.trial_key"] for r in runs]
    assert len(keys) == len(set(keys)) == 26
    pruned = [r for r in runs if r.info.status == "KILLED"]
    assert len(pruned) == counts["pruned"] and all("pruned" in r.info.run_name for r in pruned)
    assert {r.info.status for r in runs} <= {"FINISHED", "KILLED"}


def test_an_array_auto_formed_asks_for_the_probe_and_a_fixed_one_does_not(tiny_bert, synthetic_data_dir, tmp_path):
    """`fuse: auto` on a GPU forms arrays of up to 8 that measure first (`probe`, read by run_array_trial); a fixed
    number trains the arrays it was given."""
    for fuse, probes in (("auto", True), (4, False)):
        plan = build_plan(study(tiny_bert, synthetic_data_dir, fuse, gpu=1), tmp_path)
        searcher = PlanSearcher(StudyState(plan, Journal(tmp_path / f"{fuse}.jsonl")))
        config = searcher.suggest("ray0")
        assert len(config["members"]) == (8 if fuse == "auto" else 4)
        assert config.get("probe", False) is probes
        if probes:
            assert "measures its members fused against one alone" in plan.fusion[0].why


def test_the_reproducibility_section_says_what_autos_probe_measured():
    import pandas as pd

    from reports.reproducibility import fusion_text

    fusion = [{"members": 8, "why": "auto: the trials run on a GPU", "tuning": False}, {"members": 1, "why": "x"}]
    trials = pd.DataFrame({"fuse_probe_gain": [3.5, 3.5, 0.9, None], "fused_members": [8, 8, 1, None]})
    said = fusion_text(fusion, trials)
    assert "The replicates of 1 of 2 cells trained in fused arrays of up to 8 members" in said
    assert "0.90–3.50× the pairs/s of the same members one after another" in said
    assert "2 of 4 trials ended their last round fused" in said
    assert "probe" not in fusion_text(fusion, pd.DataFrame({"fused_members": [4]}))  # a fixed number: no probe
    assert fusion_text([{"members": 1, "why": "off"}], trials) == ""
