"""`tune.objectives`: several objectives per cell (dev score and parameter count), searched by Optuna's NSGA-II
without a pruner; each cell's Pareto set kept (Optuna's `best_trials`), its best-dev trial replicated, the
frontier tagged in MLflow and shown by the report; a bad combination is one line before launch; a killed
study resumes with its trials' values and NSGA-II's generations."""

from __future__ import annotations

import json
import math
import re

import optuna
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

import orchestrator as orc
from benchmarks.instant import instant_executor
from orchestrator.cli import app
from orchestrator.run import launcher
from orchestrator.study.config import parse_study
from orchestrator.study.journal import Journal, Outcome
from orchestrator.study.plan import build_plan, search_settings
from orchestrator.study.state import StudyState
from reports.reproducibility import objectives_text, sampler_text
from trainables.errors import UserInputError

TRADE_OFF = {"layer": [1, 2, 3], "lr": {"loguniform": [1e-4, 1e-2]}}


def make_plan(tiny_bert, data_dir, folder, tune: dict, **changes):
    study = parse_study({"name": "s", "model": tiny_bert, "tune": tune, "train": {"epochs": 2},
                         "data_dir": str(data_dir), "tracking": {"mlflow_uri": "sqlite:///x.db"}, **changes})
    return build_plan(study, folder)


def dominated(point: tuple[float, float], others: list[tuple[float, float]]) -> bool:
    """(dev, params), dev maximised and params minimised: another point at least as good on both, better on one."""
    return any(o[0] >= point[0] and o[1] <= point[1] and o != point for o in others)


def frontier(points: dict[str, tuple[float, float]]) -> set[str]:
    return {key for key, point in points.items() if not dominated(point, list(points.values()))}


@pytest.mark.parametrize(("tune", "message"), [
    ({"objectives": ["dev", "params"], "scheduler": "asha"},
     "tune.scheduler: 'asha' is not valid; Optuna cannot prune a study of several objectives (tune.objectives "
     "[dev, params]): use scheduler: none (their default)"),
    ({"objectives": ["dev", "params"], "scheduler": "hyperband"},
     "tune.scheduler: 'hyperband' is not valid; Optuna cannot prune a study of several objectives"),
    ({"objectives": ["dev", "params"], "sampler": "cmaes"},
     "tune.sampler: 'cmaes' is not valid; Optuna's CmaEsSampler optimises one objective and tune.objectives lists "
     "2: use nsga2 (their default), tpe, gp, random, qmc or bruteforce"),
    ({"objectives": ["params"]},
     "tune.objectives: '[params]' is not valid; list dev among them (e.g. [dev, params]): the replicates are "
     "chosen by dev, and a search on size alone only finds the smallest model"),
    ({"objectives": ["dev", "dev"]},
     "tune.objectives: '[dev, dev]' is not valid; dev is listed twice: name each objective once"),
    ({"objectives": ["dev", "params"], "trials": 8, "population_size": 8},
     "tune.population_size: 8 is not valid; NSGA-II draws its first generation of population_size trials at random "
     "and breeds after it, so with tune.trials 8 it never would: set it below 8, or use sampler: random"),
    ({"objectives": ["dev", "latency"]}, "tune.objectives.1: 'latency' is not valid; use 'dev' or 'params'"),
])
def test_a_bad_combination_is_one_line_naming_the_key_before_launch(tune, message, tiny_bert, synthetic_data_dir,
                                                                    tmp_path):
    with pytest.raises(UserInputError, match=re.escape(message)) as raised:
        make_plan(tiny_bert, synthetic_data_dir, tmp_path, {"params": TRADE_OFF, **tune})
    assert "\n" not in str(raised.value)


def test_every_mistake_of_the_tune_section_is_said_at_once_and_exits_2(tiny_bert, synthetic_data_dir, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "model": tiny_bert, "data_dir": str(synthetic_data_dir), "train": {"epochs": 1},
        "tune": {"params": TRADE_OFF, "objectives": ["dev", "params"], "trials": 4, "sampler": "cmaes",
                 "scheduler": "asha"}}))
    done = CliRunner().invoke(app, ["validate", str(path)])
    assert done.exit_code == 2
    keys = [line.split(":")[1].strip() for line in done.output.splitlines() if line.startswith("error:")]
    assert sorted(keys) == ["tune.sampler", "tune.scheduler"]


def test_several_objectives_search_with_nsga2_without_a_pruner_unless_told_otherwise(tiny_bert, synthetic_data_dir,
                                                                                     tmp_path):
    plan = make_plan(tiny_bert, synthetic_data_dir, tmp_path,
                     {"params": TRADE_OFF, "objectives": ["dev", "params"], "trials": 12})
    tune = plan.study.tune
    assert (tune.sampler, tune.scheduler, plan.objectives) == ("nsga2", "none", ("dev", "params"))
    assert search_settings(plan.study)["objectives"] == ["dev", "params"]
    assert search_settings(plan.study)["population_size"] == 4  # a quarter of 12 trials, at least 4
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    study = state.studies[0]
    assert isinstance(study.sampler, optuna.samplers.NSGAIISampler) and study.sampler.population_size == 4
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    assert isinstance(study.pruner, optuna.pruners.NopPruner)
    told = make_plan(tiny_bert, synthetic_data_dir, tmp_path, {"params": TRADE_OFF, "objectives": ["dev", "params"],
                                                               "sampler": "tpe", "population_size": 5})
    assert told.study.tune.sampler == "tpe" and "population_size" not in search_settings(told.study)
    single = make_plan(tiny_bert, synthetic_data_dir, tmp_path, {"params": TRADE_OFF})
    assert single.study.tune.sampler == "tpe" and single.study.tune.scheduler == "asha"
    assert "objectives" not in search_settings(single.study)  # a single-objective record is as before
    assert StudyState(single, Journal(tmp_path / "k.jsonl")).studies[0].directions == [
        optuna.study.StudyDirection.MAXIMIZE]


def finish(state, record, dev: float, params: float | None, epochs: int = 2) -> None:
    for epoch in range(1, epochs + 1):
        metrics = {"epoch": epoch, "dev_spearman": dev - (epochs - epoch)}
        if params is not None:
            metrics["params"] = params
        assert state.on_result(record.key, metrics) is False  # never pruned
    state.on_finished(record.key, Outcome.COMPLETED)


def test_the_pareto_set_is_optunas_and_the_replicates_rerun_its_best_dev_trial(tiny_bert, synthetic_data_dir,
                                                                               tmp_path):
    """Dev and parameters of six trials: one dominated, one degenerate (no dev score), one that reported no
    parameter count, two with the same values (a tie broken by the trial asked first)."""
    plan = make_plan(tiny_bert, synthetic_data_dir, tmp_path,
                     {"params": TRADE_OFF, "objectives": ["dev", "params"], "trials": 7}, replicate={"seeds": [0]})
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    told = {"c0-t0": (50.0, 3000), "c0-t1": (60.0, 4000), "c0-t2": (60.0, 4000), "c0-t3": (40.0, 2000),
            "c0-t4": (45.0, 4000), "c0-t5": (math.nan, 1000), "c0-t6": (70.0, None)}
    records = [state.next_trial() for _ in range(7)]
    assert [r.key for r in records] == list(told)
    for record in records:
        finish(state, record, *told[record.key])
    cell = plan.cells[0]
    expected = frontier({k: v for k, v in told.items() if v[1] is not None and not math.isnan(v[0])})
    assert expected == {"c0-t0", "c0-t1", "c0-t2", "c0-t3"}
    assert [r.key for r in state.pareto(cell)] == sorted(expected)
    assert state.best_tuned(cell).key == "c0-t1"  # best dev on the frontier; t2 ties it and was asked later
    replicate = state.next_trial()
    assert replicate.phase == "replicate" and replicate.tuned == state.records["c0-t1"].tuned
    assert state.pareto_marks() == {k: k in expected for k in told}
    values = {t.user_attrs["trial_key"]: t.values for t in state.studies[0].trials}
    assert values["c0-t0"] == [50.0, 3000.0] and values["c0-t5"] is None and values["c0-t6"] is None
    assert state.studies[0].trials[5].state == optuna.trial.TrialState.FAIL  # degenerate: never on a frontier


def test_a_cell_whose_trials_report_no_parameter_count_is_skipped_saying_why(tiny_bert, synthetic_data_dir, tmp_path):
    plan = make_plan(tiny_bert, synthetic_data_dir, tmp_path,
                     {"params": TRADE_OFF, "objectives": ["dev", "params"], "trials": 3}, replicate={"seeds": [0]})
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))
    for record in [state.next_trial() for _ in range(3)]:
        finish(state, record, 50.0, None)
    assert state.skip_reason(plan.cells[0]) == "skipped: no tuning trial reported params (tune.objectives)"
    assert state.next_trial() == "FINISHED"


def test_a_killed_multi_objective_study_resumes_with_its_values_and_generations(tiny_bert, synthetic_data_dir,
                                                                                tmp_path):
    """The driver dies with 6 of 8 trials finished and one half-way: the replayed cell study holds the same
    values, NSGA-II's generations come back (so its next trials breed from them instead of starting a random
    first generation again), and the interrupted trial continues in its own generation."""
    plan = make_plan(tiny_bert, synthetic_data_dir, tmp_path,
                     {"params": TRADE_OFF, "objectives": ["dev", "params"], "trials": 8, "population_size": 2},
                     replicate={"seeds": [0]})
    journal = tmp_path / "j.jsonl"
    first = StudyState(plan, Journal(journal))

    def dev_of(tuned: dict) -> float:
        return 40 + 10 * tuned["layer"] - 5 * abs(math.log10(tuned["lr"]) + 3)

    for _ in range(6):
        record = first.next_trial()
        finish(first, record, dev_of(record.tuned), 1000 * (1 + record.tuned["layer"]))
    running = first.next_trial()
    first.on_result(running.key, {"epoch": 1, "dev_spearman": 30.0, "params": 2000})
    generation = "NSGAIISampler:generation"
    before = {t.user_attrs["trial_key"]: (t.values, t.system_attrs.get(generation)) for t in first.studies[0].trials}
    assert before[running.key][1] >= 1  # breeding had begun: a later generation than the random first one
    assert json.loads(journal.read_text().splitlines()[-2])["sampler_attrs"] == {generation: before[running.key][1]}

    second = StudyState(plan, Journal(journal))
    replayed = {t.user_attrs["trial_key"]: (t.values, t.system_attrs.get(generation))
                for t in second.studies[0].trials}
    assert replayed == {k: v for k, v in before.items() if k != running.key}
    assert [r.key for r in second.pareto(plan.cells[0])] == [r.key for r in first.pareto(plan.cells[0])]
    again = second.next_trial()
    assert again.key == running.key and again.tuned == running.tuned
    asked = second.asked[running.key]
    assert asked.storage.get_trial_system_attrs(asked._trial_id)[generation] == before[running.key][1]
    finish(second, again, dev_of(again.tuned), 1000 * (1 + again.tuned["layer"]))
    last = second.next_trial()
    assert last.key == "c0-t7"
    assert second.asked[last.key].storage.get_trial_system_attrs(second.asked[last.key]._trial_id)[generation] >= 1
    finish(second, last, dev_of(last.tuned), 1000 * (1 + last.tuned["layer"]))
    points = {r.key: (second._value(r), r.results[-1]["params"]) for r in second.issued(plan.cells[0], "tune")}
    assert {r.key for r in second.pareto(plan.cells[0])} == frontier(points)
    assert second.next_trial().tuned == second.records[max(points, key=lambda k: (points[k][0], -points[k][1]))].tuned


def score(config: dict, seed: int, epoch: int) -> float:
    """The instant executor's dev score: deeper cuts score higher (and cost parameters: 1000 per layer), a
    learning rate far from 1e-3 costs points; a trade-off with a frontier of several trials."""
    return 40 + 8 * config["layer"] - 6 * abs(math.log10(config["lr"]) + 3) + epoch + 0.1 * seed


def test_a_multi_objective_study_launches_reports_verifies_and_resumes(tiny_bert, synthetic_data_dir, tmp_path,
                                                                       monkeypatch):
    """The whole launch (study folder, journal, per-cell Optuna studies, MLflow) with Tune's execution of the
    trials replaced by benchmarks/instant.py, interrupted after 9 trials and resumed; then the report and
    verify. The frontier MLflow holds is the non-dominated set of the runs' own numbers; the report's table
    and figure show it; a frontier tag changed in MLflow afterwards is what verify names."""
    def interrupt(finished: int) -> None:
        if finished == 9:
            raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2, on_finished=interrupt))
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "mlflow.db"
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({
        "name": "trade_off", "model": tiny_bert, "ablate": {"pooling": ["mean", "max"]},
        "tune": {"params": TRADE_OFF, "objectives": ["dev", "params"], "trials": 8},
        "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2}, "data_dir": str(synthetic_data_dir),
        "report": {"formats": ["markdown", "latex"]}, "tracking": {"mlflow_uri": f"sqlite:///{store}"}}))
    storage = tmp_path / "studies"
    with pytest.raises(KeyboardInterrupt):
        orc.launch(path, storage=storage, progress=False)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score, slots=2))
    result = orc.resume("trade_off", storage=storage, progress=False)
    assert result.finished and result.counts["completed"] == 20 and result.counts["pruned"] == 0
    record = json.loads((storage / "trade_off" / "study_record.json").read_text())
    assert record["search"]["objectives"] == ["dev", "params"] and record["search"]["sampler"] == "nsga2"

    client = MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("trade_off").experiment_id], max_results=1000)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 20 and len({r.data.tags["orchestrator.trial_key"] for r in children}) == 20
    fronts, picked = {}, {}
    for cell in ("pooling=mean", "pooling=max"):
        tuning = {r.data.tags["orchestrator.trial_key"]: r for r in children
                  if r.data.tags["cell"] == cell and r.data.tags["phase"] == "tune"}
        points = {k: (r.data.metrics["best_dev_spearman"], float(r.data.params["params"])) for k, r in tuning.items()}
        tagged = {k for k, r in tuning.items() if r.data.tags.get("orchestrator.pareto") == "1"}
        assert tagged == frontier(points)
        fronts[cell] = tagged
        best = picked[cell] = min(tagged, key=lambda k: (-points[k][0], points[k][1], int(k.rsplit("-t", 1)[1])))
        reran = [r for r in children if r.data.tags["cell"] == cell and r.data.tags["phase"] == "replicate"]
        assert {(r.data.params["layer"], r.data.params["lr"]) for r in reran} == {
            (tuning[best].data.params["layer"], tuning[best].data.params["lr"])}
    assert max(len(f) for f in fronts.values()) >= 2  # a real trade-off: more than the best-dev trial

    report = result.report
    table = report.tables["pareto"]
    shown = {label.split(" · ")[0]: set() for label in table.index}
    for label in table.index:
        shown[label.split(" · ")[0]].add(label.split(" · ")[1])
    assert shown == {pooling: {f"t{k.rsplit('-t', 1)[1]}" for k in fronts[f"pooling={pooling}"]}
                     for pooling in ("mean", "max")}
    marked = [label for label, value in table.iloc[:, -1].items() if value.endswith("*")]
    assert sorted(marked) == sorted(f"{cell.split('=')[1]} · t{key.rsplit('-t', 1)[1]}" for cell, key in picked.items())
    runs_csv = pd.read_csv(report.folder / "runs.csv")
    assert set(runs_csv[runs_csv.pareto == 1].trial_key) == set().union(*fronts.values())
    assert (report.folder / "dev_by_params.png").exists() and (report.folder / "pareto.tex").exists()
    reproducibility = (report.folder / "reproducibility.md").read_text()
    assert "NSGA-II (Optuna's `NSGAIISampler`, seed 1000 plus the cell's index, population 4" in reproducibility
    assert "kept its Pareto set" in reproducibility and "no pruning" in reproducibility
    assert orc.verify(report.folder).ok

    off = next(r for r in children if r.data.tags.get("orchestrator.pareto") == "1")
    client.set_tag(off.info.run_id, "orchestrator.pareto", "0")
    checked = orc.verify(report.folder)
    assert not checked.ok and any(off.info.run_id in problem and "pareto" in problem for problem in checked.problems)


def test_the_reproducibility_text_names_nsga2_and_the_objectives():
    settings = {"sampler": "nsga2", "sampler_seed": 1000, "startup_trials": 3, "population_size": 4}
    assert sampler_text(settings) == ("NSGA-II (Optuna's `NSGAIISampler`, seed 1000 plus the cell's index, population "
                                      "4 per generation, the first drawn at random)")
    assert objectives_text(["dev", "params"], "dev_spearman").startswith(
        "Each cell's Optuna study optimised 2 objectives, dev_spearman (maximised), the parameter count (minimised)")
