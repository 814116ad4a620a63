"""`tune.sampler` and `tune.scheduler`: each name is Optuna's own sampler or pruner, deciding exactly as the
library does; a sampler that cannot search a space as its name promises is refused in one line before launch;
the record, MLflow and the report's reproducibility section name the method and its settings."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

import orchestrator as orc
from benchmarks.instant import instant_executor
from orchestrator.checks.estimate import expected_tuning_rounds, halving_rounds
from orchestrator.run import launcher
from orchestrator.study.config import TuneSection, parse_study
from orchestrator.study.journal import Journal, Outcome
from orchestrator.study.plan import build_plan
from orchestrator.study.state import StudyState
from reports.reproducibility import pruner_text, sampler_text
from search_spaces.optuna_samplers import PRUNERS, SAMPLERS, hyperband_brackets
from trainables.errors import UserInputError, UserInputErrors

SEED = 1000  # tune.sampler_seed's default; the one cell's index is 0
CONTINUOUS = {"lr": {"loguniform": [1e-4, 1e-2]}, "warmup_ratio": {"uniform": [0.0, 0.3]},
              "pooling": ["mean", "cls", "max"]}
DISCRETE = {"lr": [1e-4, 3e-4, 1e-3], "pooling": ["mean", "cls"], "batch_size": {"int": [15, 16]}}


def make_plan(tiny_bert, data_dir, folder, tune: dict, epochs: int = 1, **changes):
    study = parse_study({"name": "s", "model": tiny_bert, "tune": tune, "train": {"epochs": epochs},
                         "data_dir": str(data_dir), "tracking": {"mlflow_uri": "sqlite:///x.db"}, **changes})
    return build_plan(study, folder)


def score(params: dict) -> float:
    """A smooth dev score of a configuration: best near lr 1e-3, warmup 0.1, mean pooling."""
    value = -(math.log10(params["lr"]) + 3) ** 2 - (params.get("warmup_ratio", 0.1) - 0.1) ** 2
    return value + {"mean": 0.3, "cls": 0.0, "max": 0.1}[params["pooling"]] + 0.01 * params.get("batch_size", 0)


def optuna_reference(name: str):
    """The Optuna class for `tune.sampler: name`, built as a user of Optuna would from the documented settings."""
    samplers = optuna.samplers
    return {"tpe": lambda: samplers.TPESampler(seed=SEED, n_startup_trials=2),
            "random": lambda: samplers.RandomSampler(seed=SEED),
            "gp": lambda: samplers.GPSampler(seed=SEED, n_startup_trials=2),
            "cmaes": lambda: samplers.CmaEsSampler(seed=SEED, n_startup_trials=2),
            "qmc": lambda: samplers.QMCSampler(qmc_type="halton", scramble=True, seed=SEED),
            "bruteforce": lambda: samplers.BruteForceSampler(seed=SEED),
            "nsga2": lambda: samplers.NSGAIISampler(seed=SEED, population_size=3)}[name]()  # 7 trials: a default of 3


def suggest(trial: optuna.Trial, space: dict) -> dict:
    """`space` (the study file's tune.params) through Optuna's public suggest API, in the file's order."""
    params = {}
    for name, raw in space.items():
        if isinstance(raw, list):
            params[name] = trial.suggest_categorical(name, raw)
        elif "int" in raw:
            params[name] = trial.suggest_int(name, *raw["int"])
        else:
            kind, (low, high) = next(iter(raw.items()))
            params[name] = trial.suggest_float(name, low, high, log=kind == "loguniform")
    return params


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("name", SAMPLERS)
def test_each_sampler_suggests_what_its_optuna_class_suggests(name, tiny_bert, synthetic_data_dir, tmp_path):
    """The cell's trials, told the same scores, are the trials Optuna's own class suggests in `optimize` for the
    same seed and space, past the random startup trials into the sampler's model (brute force: every one of
    the discrete space's 12 configurations, once each; GP: two of its own, each a model fit of a second or two)."""
    space, trials = (DISCRETE, 12) if name == "bruteforce" else (CONTINUOUS, 4 if name == "gp" else 7)
    tune = {"params": space, "trials": trials, "startup_trials": 2, "scheduler": "none", "sampler": name,
            "qmc_type": "halton"}
    state = StudyState(make_plan(tiny_bert, synthetic_data_dir, tmp_path, tune), Journal(tmp_path / "j.jsonl"))
    ours = []
    for _ in range(trials):
        record = state.next_trial()
        ours.append(record.tuned)
        state.on_result(record.key, {"epoch": 1, "dev_spearman": score(record.tuned)})
        state.on_finished(record.key, Outcome.COMPLETED)

    reference = optuna.create_study(direction="maximize", sampler=optuna_reference(name))
    reference.optimize(lambda trial: score(suggest(trial, space)), n_trials=trials)
    assert ours == [t.params for t in reference.trials]
    assert len({json.dumps(t, sort_keys=True) for t in ours}) == trials  # brute force: no configuration twice
    if name == "bruteforce":
        assert {(t["lr"], t["pooling"], t["batch_size"]) for t in ours} == {
            (lr, p, b) for lr in DISCRETE["lr"] for p in DISCRETE["pooling"] for b in (15, 16)}


def curves(trials: int, epochs: int) -> list[list[float]]:
    """Dev scores per epoch: each trial rises towards its own level, with noise (fixed by a seed)."""
    rng = np.random.default_rng(7)
    levels = rng.uniform(40, 80, trials)
    return [[float(level * (1 - 0.5 ** (e + 1)) + rng.normal(0, 2)) for e in range(epochs)] for level in levels]


def stops(ask, report, finish, trials: int, epochs: int, slots: int) -> list[int]:
    """Run `trials` replayed curves, `slots` at a time, every running trial reporting one epoch per time unit
    (as trials run side by side); the epoch each trial ended at."""
    data, running, ended, issued = curves(trials, epochs), {}, {}, 0
    while len(ended) < trials:
        while len(running) < slots and issued < trials:
            running[issued] = [ask(), 0]
            issued += 1
        for number in list(running):
            handle, epoch = running[number][0], running[number][1] + 1
            running[number][1] = epoch
            if report(handle, epoch, data[number][epoch - 1]) or epoch == epochs:
                finish(handle, data[number][:epoch], epoch == epochs)
                ended[number] = epoch
                del running[number]
    return [ended[n] for n in range(trials)]


@pytest.mark.parametrize(("scheduler", "grace", "eta", "epochs"), [("asha", 1, 3, 9), ("asha", 2, 2, 8),
                                                                    ("hyperband", 1, 3, 9), ("hyperband", 1, 2, 8)])
def test_each_pruner_stops_exactly_the_trials_its_optuna_pruner_stops(scheduler, grace, eta, epochs, tiny_bert,
                                                                      synthetic_data_dir, tmp_path):
    """The same replayed dev curves, 3 trials at a time, through the cell's state and through Optuna's own
    pruner in a plain ask/report/should_prune loop: the same trials stop at the same epochs. A trial that has
    trained its last epoch is complete, so neither asks the pruner then."""
    trials = 24
    tune = {"params": {"lr": {"loguniform": [1e-4, 1e-2]}}, "trials": trials, "sampler": "random",
            "scheduler": scheduler, "grace_epochs": grace, "reduction_factor": eta}
    plan = make_plan(tiny_bert, synthetic_data_dir, tmp_path, tune, epochs=epochs)
    state = StudyState(plan, Journal(tmp_path / "j.jsonl"))

    def our_report(record, epoch, value):
        return state.on_result(record.key, {"epoch": epoch, "dev_spearman": value})

    ours = stops(state.next_trial, our_report, lambda record, _, __: state.on_finished(record.key, Outcome.COMPLETED),
                 trials, epochs, 3)

    pruner = (optuna.pruners.SuccessiveHalvingPruner(min_resource=grace, reduction_factor=eta)
              if scheduler == "asha" else
              optuna.pruners.HyperbandPruner(min_resource=grace, max_resource=epochs, reduction_factor=eta))
    reference = optuna.create_study(direction="maximize", pruner=pruner, study_name="s all")  # the cell's study name

    def report(trial, epoch, value):
        trial.report(value, epoch)
        return epoch < epochs and trial.should_prune()

    def finish(trial, values, complete):
        reference.tell(trial, max(values)) if complete else reference.tell(trial, state=optuna.trial.TrialState.PRUNED)

    theirs = stops(lambda: reference.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}),
                   report, finish, trials, epochs, 3)
    assert ours == theirs
    assert len(set(ours)) >= 3  # trials stopped at two rungs at least, others ran to the end: a real test
    assert state.counts()["pruned"] == sum(e < epochs for e in ours)


@pytest.mark.parametrize(("tune", "message"), [
    ({"sampler": "bruteforce", "params": {"lr": {"loguniform": [1e-4, 1e-2]}}},
     "tune.params.lr: {'loguniform': [0.0001, 0.01]} is not valid; bruteforce tries every configuration, and a "
     "loguniform range has endless values: give lr a list of values or use another tune.sampler"),
    ({"sampler": "bruteforce", "params": {"lr": [1e-4, 1e-3], "pooling": ["mean", "cls"]}, "trials": 5},
     "tune.trials: 5 is not valid; bruteforce tries each of the space's 4 configurations once: set tune.trials to "
     "at most 4"),
    ({"sampler": "cmaes", "params": {"lr": [1e-4, 1e-3], "pooling": ["mean", "cls"]}},
     "tune.sampler: 'cmaes' is not valid; CMA-ES searches numeric ranges and tune.params has only lists of values "
     "(Optuna would draw every trial at random): use tpe, gp, qmc or bruteforce, or give a range "
     "({loguniform: [a, b]})"),
    ({"sampler": "hyperopt", "params": {"lr": [1e-4]}},
     "tune.sampler: 'hyperopt' is not valid; use 'tpe', 'random', 'gp', 'cmaes', 'qmc', 'bruteforce' or 'nsga2'"),
    ({"scheduler": "pbt", "params": {"lr": [1e-4]}},
     "tune.scheduler: 'pbt' is not valid; use 'asha', 'hyperband' or 'none'"),
    ({"sampler": "qmc", "qmc_type": "lhs", "params": {"lr": [1e-4]}},
     "tune.qmc_type: 'lhs' is not valid; use 'sobol' or 'halton'"),
])
def test_a_sampler_or_pruner_that_does_not_fit_is_one_line_before_launch(tune, message, tiny_bert,
                                                                         synthetic_data_dir, tmp_path):
    with pytest.raises(UserInputError, match=re.escape(message)) as raised:
        make_plan(tiny_bert, synthetic_data_dir, tmp_path, tune)
    assert "\n" not in str(raised.value)


def test_every_mismatch_of_the_file_is_said_at_once_and_exits_2(tiny_bert, synthetic_data_dir, tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "model": tiny_bert, "data_dir": str(synthetic_data_dir), "train": {"epochs": 1},
        "tune": {"sampler": "bruteforce", "trials": 4,
                 "params": {"lr": {"loguniform": [1e-4, 1e-2]}, "warmup_ratio": {"uniform": [0.0, 0.2]}}}}))
    done = CliRunner().invoke(app, ["validate", str(path)])
    assert done.exit_code == 2
    lines = [line for line in done.output.splitlines() if line.startswith("error:")]
    assert [line.split(":")[1].strip() for line in lines] == ["tune.params.lr", "tune.params.warmup_ratio"]
    with pytest.raises(UserInputErrors):
        make_plan(tiny_bert, synthetic_data_dir, tmp_path, {"sampler": "bruteforce", "params": {
            "lr": {"loguniform": [1e-4, 1e-2]}, "warmup_ratio": {"uniform": [0.0, 0.2]}}})


def test_the_names_match_the_study_file_schema():
    fields = TuneSection.model_fields
    assert tuple(fields["sampler"].annotation.__args__) == SAMPLERS
    assert tuple(fields["scheduler"].annotation.__args__) == PRUNERS


def test_hyperband_brackets_and_expected_rounds_are_optunas(tiny_bert, synthetic_data_dir, tmp_path):
    """Hyperband over 9 epochs, grace 1, η 3: Optuna's 3 brackets, first rungs after 1, 3 and 9 epochs, weighted
    9 : 5 : 3; the estimate's expected rounds per trial average successive halving over them."""
    assert hyperband_brackets(9, 1, 3) == [9, 5, 3]
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=9, reduction_factor=3)
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    trial.report(1.0, 1)
    trial.should_prune()  # Optuna sets its brackets up on the first decision
    assert pruner._trial_allocation_budgets == [9, 5, 3]
    assert hyperband_brackets(2, 1, 3) == [1] and hyperband_brackets(1, 2, 3) == []  # one bracket, none
    plan = make_plan(tiny_bert, synthetic_data_dir, tmp_path, {"params": {"lr": [1e-4]}, "scheduler": "hyperband"},
                     epochs=9)
    expected = (9 * halving_rounds(9, 1, 3) + 5 * halving_rounds(9, 1, 3, 1) + 3 * 9) / 17
    assert halving_rounds(9, 1, 3) == pytest.approx(1 + 2 / 3 + 6 / 9) and halving_rounds(9, 1, 3, 1) == 5
    assert expected_tuning_rounds(plan, plan.cells[0]) == pytest.approx(expected) == pytest.approx(73 / 17)


@pytest.mark.parametrize(("search", "sampler", "pruner"), [
    ({"sampler": "tpe"}, "TPE (Optuna's `TPESampler`, seed 1000 plus the cell's index, the first 3 trials random)",
     "asynchronous successive halving inside each cell (Optuna's `SuccessiveHalvingPruner`, first rung after 1 "
     "epoch, reduction factor 3)"),
    ({"sampler": "gp", "scheduler": "hyperband"},
     "Gaussian-process Bayesian optimisation (Optuna's `GPSampler`, seed 1000 plus the cell's index, the first 3 "
     "trials random)",
     "Hyperband inside each cell (Optuna's `HyperbandPruner`, min_resource 1 epoch, max_resource the cell's epochs, "
     "reduction factor 3; brackets: 2 for 4 epochs, 3 for 9 epochs; a trial's bracket follows from its cell's "
     "Optuna study name and its number)"),
    ({"sampler": "cmaes", "scheduler": "none"},
     "CMA-ES (Optuna's `CmaEsSampler`, seed 1000 plus the cell's index, the first 3 trials random, lists of values "
     "drawn at random)", "no pruning"),
    ({"sampler": "qmc", "qmc_type": "halton"},
     "quasi-Monte Carlo search (Optuna's `QMCSampler`, seed 1000 plus the cell's index, a scrambled Halton "
     "sequence)", None),
    ({"sampler": "bruteforce"}, "brute force (Optuna's `BruteForceSampler`, seed 1000 plus the cell's index, each "
                                "configuration at most once, in an order the seed shuffles)", None),
    ({"sampler": "random"}, "random search (Optuna's `RandomSampler`, seed 1000 plus the cell's index)", None),
])
def test_the_reproducibility_text_names_each_sampler_and_pruner_with_its_settings(search, sampler, pruner):
    settings = {"sampler_seed": 1000, "startup_trials": 3, "scheduler": "asha", "grace_epochs": 1,
                "reduction_factor": 3, **search}
    assert sampler_text(settings, has_choices=True) == sampler
    if pruner is not None:
        assert pruner_text(settings, "epoch", [9, 4, 9]) == pruner


def score_of(config: dict, seed: int, epoch: int) -> float:
    """The instant executor's dev score: a trial's lr and epoch decide it (the pruner has something to compare)."""
    return 60 - 10 * abs(math.log10(config["lr"]) + 3) + 2 * epoch + 0.1 * seed


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for the module's launches (each study its own experiment): its tables are made once."""
    return tmp_path_factory.mktemp("store") / "mlflow.db"


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize(("sampler", "scheduler", "named"), [
    ("gp", "hyperband", ("`GPSampler`", "`HyperbandPruner`")), ("cmaes", "asha", ("`CmaEsSampler`",)),
    ("qmc", "hyperband", ("`QMCSampler`", "`HyperbandPruner`")), ("bruteforce", "none", ("`BruteForceSampler`",))])
def test_a_study_of_each_new_sampler_and_pruner_launches_reports_and_verifies(sampler, scheduler, named, tiny_bert,
                                                                              synthetic_data_dir, tmp_path, store,
                                                                              monkeypatch):
    """The whole launch (study folder, journal, per-cell Optuna studies, MLflow), Tune's execution of the trials
    replaced by benchmarks/instant.py; then the report and verify. MLflow's parent run and the report's
    reproducibility section name the sampler and the pruner with their settings."""
    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(score_of, slots=2))
    monkeypatch.chdir(tmp_path)
    params = ({"lr": [1e-4, 3e-4, 1e-3, 3e-3]} if sampler == "bruteforce" else
              {"lr": {"loguniform": [1e-4, 1e-2]}, "warmup_ratio": {"uniform": [0.0, 0.2]}})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({
        "name": sampler, "model": tiny_bert, "ablate": {"layer": [1, 3]}, "replicate": {"seeds": [0, 1]},
        "tune": {"params": params, "trials": 4, "startup_trials": 3, "sampler": sampler, "scheduler": scheduler},
        "train": {"epochs": 3}, "data_dir": str(synthetic_data_dir), "report": {"formats": ["markdown"]},
        "tracking": {"mlflow_uri": f"sqlite:///{store}"}}))
    result = orc.launch(path, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["failed"] == 0 and result.counts["completed"] >= 4
    record = json.loads((tmp_path / "studies" / sampler / "study_record.json").read_text())
    assert record["search"]["sampler"] == sampler and record["search"]["scheduler"] == scheduler
    client = MlflowClient(f"sqlite:///{store}")
    parent = next(r for r in client.search_runs([client.get_experiment_by_name(sampler).experiment_id])
                  if r.data.tags.get("orchestrator.role") == "study")
    assert parent.data.tags["tune.sampler"] == sampler and parent.data.tags["tune.scheduler"] == scheduler
    assert parent.data.tags["tune.sampler_seed"] == "1000" and parent.data.tags["tune.trials"] == "4"
    reproducibility = (result.report.folder / "reproducibility.md").read_text()
    assert all(name in reproducibility for name in named) and "seed 1000 plus the cell's index" in reproducibility
    checked = orc.verify(result.report.folder)
    assert checked.ok, checked


@pytest.mark.slow
def test_a_gp_and_hyperband_study_runs_on_ray_then_reports_and_verifies(tiny_bert, synthetic_data_dir, tmp_path,
                                                                        monkeypatch):
    """For real, on a local Ray: GP sampling and Hyperband pruning (η 2 over 2 epochs: 2 brackets) in one cell,
    4 tuning trials and 2 replicates; the report names both, and verify recomputes it from MLflow."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({
        "name": "gp_hyperband", "model": tiny_bert, "ablate": {"layer": [2]}, "replicate": {"seeds": [0, 1]},
        "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-2]}, "warmup_ratio": {"uniform": [0.0, 0.2]}},
                 "trials": 4, "startup_trials": 2, "sampler": "gp", "scheduler": "hyperband", "reduction_factor": 2},
        "train": {"epochs": 2, "batch_size": 16, "max_seq_length": 32},
        "data": {"max_train_samples": 64, "max_eval_samples": 48}, "data_dir": str(synthetic_data_dir),
        "resources": {"cpu": 1}, "report": {"formats": ["markdown"]},
        "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    result = orc.launch(path, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["failed"] == 0
    assert result.counts["completed"] + result.counts["pruned"] == 6
    reproducibility = (result.report.folder / "reproducibility.md").read_text()
    assert "Optuna's `GPSampler`, seed 1000 plus the cell's index, the first 2 trials random" in reproducibility
    assert "Optuna's `HyperbandPruner`, min_resource 1 epoch" in reproducibility and "2 for 2 epochs" in reproducibility
    checked = orc.verify(result.report.folder)
    assert checked.ok and checked.cells == 1, checked.problems
