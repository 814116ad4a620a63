"""What a study read and spent, recorded at launch and reported: data and model hashes, the locked
environment, every trial's wall time × resources per cell and phase, and the estimate beside it.
Studies run in process with trials that take no time but claim known durations (benchmarks/instant.py)."""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from benchmarks.instant import instant_executor
from orchestrator.run.launcher import launch
from orchestrator.study.journal import Journal, TrialRecord
from reports.build import build_report
from reports.collect import collect
from reports.compute import spent, totals

EPOCH_S = {1: 30.0, 2: 45.0, 3: 60.0}  # the seconds each layer's epoch claims: layer k -> 15 (k + 1) s


def score(config: dict, seed: int, epoch: int) -> float:
    return 50 + 5 * config["layer"] + 1e4 * config.get("lr", 0.0) + seed * (1 + 0.7 * config["layer"]) + epoch


def epoch_seconds(config: dict, epoch: int) -> float:
    return EPOCH_S[config["layer"]]


def write_study(folder: Path, model: str, data_dir: Path, **changes) -> Path:
    study = {"name": "spent", "model": model, "ablate": {"layer": [1, 3]},
             "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-3]}}, "trials": 4, "startup_trials": 2},
             "replicate": {"seeds": [0, 1]}, "train": {"epochs": 3, "batch_size": 16},
             "data": {"max_train_samples": 100, "max_eval_samples": 50}, "data_dir": str(data_dir),
             "resources": {"cpu": 2}, "tracking": {"mlflow_uri": "sqlite:///mlflow.db"},
             "report": {"baseline": {"layer": 3}}, **changes}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.fixture(scope="module")
def study(tiny_bert, synthetic_data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("spent")
    path = write_study(folder, tiny_bert, synthetic_data_dir)
    result = launch(path, storage=folder / "studies", progress=False,
                    executor=instant_executor(score, slots=2, epoch_seconds=epoch_seconds))
    assert result.finished
    return folder, result.study_dir


def expected_wall(record: TrialRecord) -> float:
    return sum(EPOCH_S[record.config["layer"]] for _ in range(record.rounds_reached))


def test_the_record_hashes_every_data_file_and_split_and_the_model_weights(study, synthetic_data_dir, tiny_bert):
    folder, study_dir = study
    record = json.loads((study_dir / "study_record.json").read_text())
    assert record["version"] == 3 and record["resources"] == {"cpu": 2.0, "gpu": 0.0}
    assert record["search"] == {"sampler": "tpe", "sampler_seed": 1000, "startup_trials": 2, "scheduler": "asha",
                                "grace_epochs": 1, "reduction_factor": 3, "trials": 4, "seed": 10000}
    [data] = record["data"]
    assert data["name"] == "stsb" and data["origin"] == f"data folder {synthetic_data_dir}"
    for entry in data["files"]:  # the bytes on disk, as sha256sum computes them
        assert entry["sha256"] == hashlib.sha256((synthetic_data_dir / entry["path"]).read_bytes()).hexdigest()
    assert sorted(f["path"] for f in data["files"]) == [f"stsb/sts-{s}.csv" for s in ("dev", "test", "train")]
    assert {k: v["rows"] for k, v in data["splits"].items()} == {"train": 240, "dev": 80, "test": 80}
    assert data["provenance_file"] == "" and data["provenance_match"] is None  # the synthetic folder has none
    [model] = record["models"]
    assert model["name"] == tiny_bert and model["source"] == "local folder" and model["depth"] == 3
    assert model["files"][0]["sha256"] == hashlib.sha256((Path(tiny_bert) / "model.safetensors").read_bytes()
                                                         ).hexdigest()
    assert record["provenance"]["torch"] == version("torch") and record["provenance"]["ray"] == version("ray")
    assert len(record["provenance"]["commit"]) == 40 and record["provenance"]["dirty"] in ("yes", "no")


def test_the_record_reads_the_real_data_folders_provenance_and_license(data_dir):
    from orchestrator.study.data import read_study_data
    from orchestrator.study.inputs import with_files

    [found] = [with_files(d) for d in read_study_data([("stsb", None)], str(data_dir))]
    assert found.title == "STS Benchmark (English): original release files"
    assert "Scores: CC BY-SA 4.0." in found.license and found.provenance_file == "stsb/PROVENANCE.md"
    assert found.provenance_match is True  # every file's sha256 is the one PROVENANCE.md lists
    listed = (data_dir / "stsb" / "PROVENANCE.md").read_text()
    assert len(found.files) == 3 and all(f.sha256 in listed for f in found.files)
    [sick] = [with_files(d) for d in read_study_data([("sick", None)], str(data_dir))]
    assert sick.provenance_file == "sick/PROVENANCE.md" and sick.license.startswith("CC BY-NC-SA 3.0")


def test_the_locked_environment_is_kept_in_the_folder_and_on_the_parent_run(study):
    folder, study_dir = study
    lock = (study_dir / "environment.txt").read_text()
    assert f"torch=={version('torch')}" in lock.splitlines() and f"mlflow=={version('mlflow')}" in lock.splitlines()
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    parent = client.search_runs([client.get_experiment_by_name("spent").experiment_id],
                                "tags.`orchestrator.role` = 'study'")[0]
    assert {"environment.txt", "study_record.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    from importlib.metadata import distribution

    pins = [line for line in lock.splitlines() if not line.startswith("#")]
    if distribution("ablation-orchestrator").read_text("direct_url.json"):  # a checkout (pip install -e .): no
        # index has this commit, so `pip install -r` must not ask one for it (the bundle's source/ installs it)
        assert not [line for line in pins if line.startswith("ablation-orchestrator==")]
        assert f"# not from an index: ablation-orchestrator=={version('ablation-orchestrator')} (file://" in lock


class FakeDistribution:
    def __init__(self, name: str, version: str, url: str | None = None):
        self.metadata, self.version, self.url = {"Name": name}, version, url

    def read_text(self, name: str) -> str | None:
        return json.dumps({"url": self.url, "dir_info": {}}) if name == "direct_url.json" and self.url else None


def test_a_lock_pins_what_an_index_has_and_names_where_the_rest_came_from(monkeypatch):
    from reports import environment

    monkeypatch.setattr(environment, "distributions", lambda: [
        FakeDistribution("torch", "2.13.0+cpu"), FakeDistribution("my_plugin", "0.3", "file:///home/me/plugin"),
        FakeDistribution("Alembic", "1.20.1"), FakeDistribution("zed", "1.0", "git+https://example.org/zed@abc")])
    lock = environment.environment_lock().splitlines()
    assert lock[2:] == ["Alembic==1.20.1", "# not from an index: my_plugin==0.3 (file:///home/me/plugin)",
                        "torch==2.13.0+cpu", "# not from an index: zed==1.0 (git+https://example.org/zed@abc)"]
    assert environment.read_lock("\n".join(lock)) == {"alembic": "1.20.1", "my-plugin": "0.3",
                                                      "torch": "2.13.0+cpu", "zed": "1.0"}


def test_every_trial_records_its_wall_time_in_the_journal_and_mlflow(study):
    folder, study_dir = study
    records = Journal(study_dir / "journal.jsonl").records()
    finished = {e["key"]: e for e in Journal(study_dir / "journal.jsonl").events() if e["event"] == "finished"}
    assert len(records) == 12 and any(r.outcome.value == "pruned" for r in records.values())
    for key, record in records.items():
        assert record.wall_s == pytest.approx(expected_wall(record)) and finished[key]["wall_s"] == record.wall_s
        assert record.hardware == {"cpu_model": "Instant CPU", "gpu_model": "none"}
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = collect(f"sqlite:///{folder / 'mlflow.db'}", "spent").runs
    for _, row in runs.iterrows():
        wall = expected_wall(records[row.trial_key])
        assert row.wall_s == pytest.approx(wall) and row.cpu_hours == pytest.approx(2 * wall / 3600)
        assert row.gpu_hours == 0 and row["hardware.cpu_model"] == "Instant CPU"
    parent = client.search_runs([client.get_experiment_by_name("spent").experiment_id],
                                "tags.`orchestrator.role` = 'study'")[0]
    total = sum(expected_wall(r) for r in records.values()) * 2 / 3600
    assert parent.data.metrics["compute.cpu_hours"] == pytest.approx(total)
    tuning = sum(expected_wall(r) for r in records.values() if r.phase == "tune") * 2 / 3600
    assert parent.data.metrics["compute.tune.cpu_hours"] == pytest.approx(tuning)
    pruned = sum(expected_wall(r) for r in records.values() if r.outcome.value == "pruned") * 2 / 3600
    assert parent.data.metrics["compute.pruned_share"] == pytest.approx(pruned / total)


def test_the_report_gives_cpu_hours_per_cell_and_phase_that_add_up(study, tmp_path):
    folder, study_dir = study
    records = Journal(study_dir / "journal.jsonl").records()
    build_report(collect(f"sqlite:///{folder / 'mlflow.db'}", "spent"), tmp_path)
    table = pd.read_csv(tmp_path / "compute.csv").set_index(["cell", "phase"])
    keys = {0: "layer=1", 1: "layer=3"}
    for index, cell in keys.items():
        for phase in ("tune", "replicate"):
            truth = sum(expected_wall(r) for r in records.values() if r.cell == index and r.phase == phase)
            assert table.loc[(cell, phase), "cpu_hours"] == pytest.approx(2 * truth / 3600)
            assert table.loc[(cell, phase), "wall_hours"] == pytest.approx(truth / 3600)
    for phase in ("tune", "replicate"):
        assert table.loc[("total", phase), "cpu_hours"] == pytest.approx(
            sum(table.loc[(c, phase), "cpu_hours"] for c in keys.values()))
    assert table.loc[("total", "all"), "cpu_hours"] == pytest.approx(
        table.loc[("total", "tune"), "cpu_hours"] + table.loc[("total", "replicate"), "cpu_hours"])
    report = (tmp_path / "report.md").read_text()
    assert "**Compute spent per cell: trials and CPU-hours of tuning and of the replicates" in report
    row = next(line for line in report.splitlines() if line.startswith("| Total |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "8" and cells[3] == "4"  # 2 cells x 4 tuning trials, 2 cells x 2 seeds
    assert float(cells[5]) == pytest.approx(table.loc[("total", "all"), "cpu_hours"], rel=1e-2)
    assert "ran on: cpu model Instant CPU; gpu model none" in report


def test_totals_and_the_pruned_share_of_a_hand_made_frame():
    trials = pd.DataFrame({"cell": ["a", "a", "a", "b"], "phase": ["tune", "tune", "replicate", "replicate"],
                           "outcome": ["pruned", "completed", "completed", "failed"],
                           "wall_s": [360.0, 720.0, 1800.0, None]})
    figures = totals(trials, {"cpu": 4, "gpu": 0.5})
    assert figures["compute.cpu_hours"] == pytest.approx(4 * 2880 / 3600)
    assert figures["compute.gpu_hours"] == pytest.approx(0.5 * 2880 / 3600)
    assert figures["compute.tune.cpu_hours"] == pytest.approx(4 * 1080 / 3600)
    assert figures["compute.pruned_share"] == pytest.approx(360 / 2880)
    table = spent(trials, {"cpu": 4, "gpu": 0.5}).set_index(["cell", "phase"])
    assert table.loc[("total", "all"), "timed"] == 3 and table.loc[("total", "all"), "trials"] == 4


def test_a_plan_estimate_is_recorded_and_the_report_puts_it_beside_what_was_spent(tiny_bert, synthetic_data_dir,
                                                                                 tmp_path, monkeypatch):
    from orchestrator.checks.estimate import Estimate, estimate_summary
    from orchestrator.study.folder import StudyFolder

    def save_estimate(folder, text, found):  # what `plan --estimate` keeps in the study folder
        StudyFolder(folder).save_estimate(text, estimate_summary(found, "plan"))

    path = write_study(tmp_path, tiny_bert, synthetic_data_dir, name="estimated")
    save_estimate(tmp_path / "studies" / "estimated", path.read_text(), Estimate(0.02, 0.01, 0.016, 2, 10.0, 12))
    launch(path, storage=tmp_path / "studies", progress=False,
           executor=instant_executor(score, slots=2, epoch_seconds=epoch_seconds))
    record = json.loads((tmp_path / "studies" / "estimated" / "study_record.json").read_text())
    assert record["estimate"]["trial_hours"] == pytest.approx(0.03) and record["estimate"]["from_budget"] == 0
    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "estimated"), tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    spent_hours = pd.read_csv(tmp_path / "report" / "compute.csv").set_index(["cell", "phase"]).loc[
        ("total", "all"), "wall_hours"]
    assert ("estimate (plan --estimate, before the launch): tuning 0.02, replicates 0.01, total 0.03 trial-hours "
            "(wall 0.016 h on 2 slots); spent: ") in report
    assert f"total {spent_hours:.3g} trial-hours ({100 * spent_hours / 0.03:.0f} % of the estimate)" in report

    edited = path.read_text().replace("max_train_samples: 100", "max_train_samples: 90")
    other = tmp_path / "other"
    other.mkdir()
    (other / "study.yaml").write_text(edited.replace("name: estimated", "name: edited"))
    save_estimate(tmp_path / "studies" / "edited", path.read_text(), Estimate(0.02, 0.01, 0.016, 2, 10.0, 12))
    launch(other / "study.yaml", storage=tmp_path / "studies", progress=False, executor=instant_executor(score))
    assert json.loads((tmp_path / "studies" / "edited" / "study_record.json").read_text())["estimate"] is None


@pytest.mark.slow
def test_a_ray_study_reports_cpu_hours_that_match_its_trials_known_wall_time(monkeypatch, synthetic_data_dir,
                                                                           tiny_bert, tmp_path):
    """Toy trials that sleep a known time per round, on a local Ray (1 CPU each): every trial's wall time
    is at least its sleeps and at most what the driver saw on its own clock, and the report's CPU-hours per
    cell, per phase and in all are the trials' wall time × their CPU, within 5 % (and at least the sleeps)."""
    from reports.environment import cpu_model
    from trainables.kinds import KINDS

    monkeypatch.setitem(KINDS, "toy", "tests.toy_kind:ToyKind")
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({
        "name": "slept", "trainable": "toy", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
        "ablate": {"sleep_s": [1.0, 2.0]}, "tune": {"params": {"lr": {"loguniform": [0.01, 1.0]}}, "trials": 3,
                                                    "startup_trials": 2},
        "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2}, "resources": {"cpu": 1},
        "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}))
    result = launch(path, storage=tmp_path / "studies", progress=False, max_concurrent=2)
    assert result.finished and result.counts["failed"] == 0
    records = Journal(result.study_dir / "journal.jsonl").records()
    slept = {key: r.rounds_reached * r.config["sleep_s"] for key, r in records.items()}
    for key, record in records.items():  # what each trial ran: its sleeps and a little more (a round's
        # evaluation and checkpoint; seconds more on a loaded machine), within what the driver saw on its own
        # clock (from handing the trial out to hearing it finish, a fresh worker's imports included)
        assert slept[key] <= record.wall_s <= slept[key] + 1.5 * record.rounds_reached, (key, record.wall_s)
        assert record.wall_s <= record.ended - record.started
        assert record.hardware["cpu_model"] == cpu_model()
    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "slept"), tmp_path / "report")
    table = pd.read_csv(tmp_path / "report" / "compute.csv").set_index(["cell", "phase"])
    for cell, sleep in (("sleep_s=1.0", 1.0), ("sleep_s=2.0", 2.0)):
        for phase in ("tune", "replicate"):
            mine = [r for r in records.values() if r.config["sleep_s"] == sleep and r.phase == phase]
            assert len(mine) == (3 if phase == "tune" else 2)
            measured = table.loc[(cell, phase), "cpu_hours"]
            assert measured == pytest.approx(sum(r.wall_s for r in mine) * 1 / 3600, rel=0.05)
            assert measured >= sum(slept[r.key] for r in mine) / 3600
            assert table.loc[(cell, phase), "gpu_hours"] == 0
    wall = sum(r.wall_s for r in records.values())
    assert table.loc[("total", "all"), "cpu_hours"] == pytest.approx(wall / 3600, rel=0.05)
    assert sum(slept.values()) / 3600 <= table.loc[("total", "all"), "cpu_hours"]
    assert cpu_model() in (tmp_path / "report" / "report.md").read_text()


def test_stats_say_what_difference_the_seeds_could_detect_and_how_many_a_named_one_needs(study, tmp_path):
    from reports.power import detectable_difference, seeds_needed

    folder, _ = study
    runs = collect(f"sqlite:///{folder / 'mlflow.db'}", "spent")
    runs = type(runs)(**{**runs.__dict__, "report": {**runs.report, "detect": 0.5}})
    build_report(runs, tmp_path)
    stats = pd.read_csv(tmp_path / "stats.csv").set_index("cell")
    replicates = runs.replicates().set_index(["cell", "seed"]).test_spearman
    differences = [replicates["layer=1", s] - replicates["layer=3", s] for s in (0, 1)]
    sd = float(pd.Series(differences).std(ddof=1))
    row = stats.loc["layer=1"]
    assert row.difference_sd == pytest.approx(sd) and row.n_seeds == 2
    assert row.detectable_80 == pytest.approx(detectable_difference(2, sd, 0.05))
    assert row.detectable_80_corrected == pytest.approx(detectable_difference(2, sd, 0.05))  # one comparison
    assert row.seeds_for_detect == seeds_needed(0.5, sd, 0.05)
    assert "detecting 0.5 points would take" in (tmp_path / "report.md").read_text()


def test_every_tuned_cell_gets_its_budget_and_expected_best_dev(study, tmp_path):
    from reports.evp import expected_max

    folder, _ = study
    runs = collect(f"sqlite:///{folder / 'mlflow.db'}", "spent")
    build_report(runs, tmp_path)
    budget = pd.read_csv(tmp_path / "budget.csv").set_index("cell")
    tuning = runs.runs[runs.runs.phase == "tune"]
    assert sorted(budget.index) == sorted(tuning.cell.unique())
    for cell, group in tuning.groupby("cell"):
        done = group[group.outcome == "completed"].best_dev_spearman
        assert budget.loc[cell, "trials"] == 4 and budget.loc[cell, "completed"] == len(done)
        assert budget.loc[cell, "trial_epochs"] == group.epoch.sum()
        assert budget.loc[cell, "expected_best"] == pytest.approx(expected_max(done.to_numpy(), len(done))[0])
    # four trials a cell, some pruned: the trend test of "still rising" needs 4 completed trials to reach p < 0.05
    assert budget.too_few.all() and not budget.rising.any()
    assert "too few: under 4 completed trials no order of the scores reaches p < 0.05" in (
        tmp_path / "report.md").read_text()
    curves = pd.read_csv(tmp_path / "expected_dev.csv")
    assert sorted(curves.cell.unique()) == sorted(budget.index)
    assert (tmp_path / "expected_dev_by_trials.png").exists() and (tmp_path / "expected_dev_by_trials.pdf").exists()
    report = (tmp_path / "report.md").read_text()
    assert "**Tuning budget per cell (trials, trial-epochs) and the expected best dev spearman ×100" in report


ITEMS = ["models", "data", "search", "budget", "seeds", "tests", "software", "hardware", "compute", "code"]


def test_the_reproducibility_section_answers_every_item_from_the_study(study, tiny_bert, synthetic_data_dir,
                                                                       tmp_path):
    import subprocess

    folder, study_dir = study
    build_report(collect(f"sqlite:///{folder / 'mlflow.db'}", "spent"), tmp_path)
    answers = {item["key"]: item for item in json.loads((tmp_path / "reproducibility.json").read_text())}
    assert list(answers) == ITEMS
    report = (tmp_path / "report.md").read_text()
    section = report[report.index("## Reproducibility"):]
    assert section == (tmp_path / "reproducibility.md").read_text()
    assert "not recorded" not in section
    for key, item in answers.items():  # each answer is in the report, under the checklist items it answers
        assert f"| {', '.join(item['checklists'])} | {item['question']} | " in section, key

    records = Journal(study_dir / "journal.jsonl").records()
    weights = hashlib.sha256((Path(tiny_bert) / "model.safetensors").read_bytes()).hexdigest()
    models = answers["models"]["facts"]
    assert [m["name"] for m in models["models"]] == [tiny_bert] and weights in section
    assert models["params"] == {"layer=1": 2000, "layer=3": 4000}  # what the runs logged (the instant trials' count)

    data = answers["data"]["facts"]["data"][0]
    for split, entry in data["splits"].items():  # rows counted here, from the files
        lines = (synthetic_data_dir / "stsb" / f"sts-{split}.csv").read_text().splitlines()
        assert entry["rows"] == len(lines) and entry["used"] == {"train": 100}.get(split, 50)
        assert entry["sha256"] in section
    for entry in data["files"]:
        assert hashlib.sha256((synthetic_data_dir / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
        assert entry["sha256"] in section

    search = answers["search"]["facts"]
    assert search["tuned"] == {"lr": "LogUniform(low=0.0001, high=0.001)"}
    assert "lr log-uniform on [0.0001, 0.001]" in answers["search"]["answer"]
    assert search["search"]["trials"] == 4 and search["search"]["scheduler"] == "asha"
    for index, cell in ((0, "layer=1"), (1, "layer=3")):  # the journal's best completed tuning trial, by dev
        done = [r for r in records.values() if r.cell == index and r.phase == "tune" and r.outcome.value == "completed"]
        best = max(done, key=lambda r: max(x["dev_spearman"] for x in r.results))
        assert search["chosen"][cell] == {"lr": best.tuned["lr"]}
        assert f"{cell}: lr {best.tuned['lr']:.3g}" in section
    assert search["fixed"] == {"batch_size": 16, "epochs": 3, "max_train_samples": 100, "max_eval_samples": 50}
    assert search["defaults"]["loss"] == "cosine_mse" and "loss cosine_mse" in section
    # the defaults a rerun needs, not those of a feature the study left off (pretraining) or left unset
    assert search["defaults"]["pretrain"] is None and search["defaults"]["pretrain_steps"] == 200
    assert "pretrain_steps" not in section and "pretrain None" not in section
    assert "more that are off or unused, in reproducibility.json)" in section

    seeds = answers["seeds"]["facts"]
    assert seeds["seeds"] == [0, 1] and seeds["tuning_seed"] == 10000
    assert seeds["n"] == {"layer=1": 2, "layer=3": 2} and "sample standard deviation (ddof = 1)" in section

    tests = answers["tests"]["facts"]
    assert (tests["test"], tests["alpha"], tests["correction"], tests["bootstrap"]) == ("paired t-test", 0.05,
                                                                                        "holm", 1000)

    software = answers["software"]["facts"]
    for name, distribution in (("torch", "torch"), ("transformers", "transformers"), ("ray", "ray"),
                               ("sentence-transformers", "sentence-transformers"), ("optuna", "optuna"),
                               ("mlflow", "mlflow")):
        assert software["versions"][name] == version(distribution) and f"{name} {version(distribution)}" in section
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                          text=True).stdout.strip()
    assert software["commit"] == head and head in section

    assert answers["hardware"]["facts"] == {"resources": {"cpu": 2.0, "gpu": 0.0},
                                            "machines": {"cpu_model": ["Instant CPU"], "gpu_model": ["none"]}}
    compute = answers["compute"]["facts"]
    assert compute["cpu_hours"] == pytest.approx(sum(expected_wall(r) for r in records.values()) * 2 / 3600)
    assert compute["trials"] == 12


def test_the_reproducibility_section_compiles_as_an_appendix(study, tmp_path):
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (CI installs texlive)")
    folder, _ = study
    build_report(collect(f"sqlite:///{folder / 'mlflow.db'}", "spent"), tmp_path)
    (tmp_path / "appendix.tex").write_text("\\documentclass[twocolumn]{article}\\usepackage[T1]{fontenc}"
                                           "\\usepackage[utf8]{inputenc}\\begin{document}\\input{reproducibility}"
                                           "\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "appendix.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "Reproducibility" in (tmp_path / "reproducibility.tex").read_text()
    # report.tex ends with it, as the paper's appendix
    assert "\\onecolumn\n\\appendix\n\\input{reproducibility}\n\\end{document}" in (tmp_path / "report.tex").read_text()
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "report.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    import pdfplumber  # a dev dependency (poppler's pdftotext is not installed)
    with pdfplumber.open(tmp_path / "report.pdf") as document:
        text = "\n".join(page.extract_text() or "" for page in document.pages)
    assert "Reproducibility" in text and "How many runs does each number average" in text


def test_only_the_defaults_in_effect_are_listed():
    from reports.reproducibility import in_effect

    defaults = {"pretrain": None, "pretrain_steps": 200, "pretrain_lr": 5e-5, "loss": "cosine_mse", "select": None,
                "random_init": False, "random_init_std": 0.02, "max_seq_length": 128, "group_by_length": True,
                "group_by_length_bins": 8}
    assert in_effect(defaults) == {"loss": "cosine_mse", "random_init": False, "max_seq_length": 128,
                                   "group_by_length": True, "group_by_length_bins": 8}


def test_a_study_from_before_the_record_kept_these_facts_says_what_it_cannot_answer(tmp_path):
    from tests.reports.test_reports import make_store

    build_report(collect(make_store(tmp_path), "synthetic"), tmp_path / "report")
    answers = {i["key"]: i for i in json.loads((tmp_path / "report" / "reproducibility.json").read_text())}
    assert list(answers) == ITEMS
    for key in ("models", "data", "software", "compute"):
        assert answers[key]["answer"].startswith("not recorded: the study ran before the orchestrator recorded ")


def test_the_bundle_holds_everything_a_reader_needs_to_reproduce_a_cell(study, synthetic_data_dir, tmp_path):
    import subprocess
    import tarfile

    from typer.testing import CliRunner

    from orchestrator.cli import app

    folder, study_dir = study
    result = CliRunner().invoke(app, ["report", "spent", "--storage", str(folder / "studies"), "--out",
                                      str(tmp_path / "report"), "--bundle"])
    assert result.exit_code == 0, result.output
    archive = tmp_path / "report-bundle.tar.gz"
    assert f"bundle: {archive} (" in result.stdout
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    bundle = tmp_path / "unpacked" / "spent-bundle"
    assert sorted(p.name for p in bundle.iterdir()) == ["README.md", "data.sha256", "environment.txt", "report",
                                                        "source", "study.yaml", "study_record.json"]
    assert (bundle / "environment.txt").read_text() == (study_dir / "environment.txt").read_text()
    assert (bundle / "study.yaml").read_text() == (study_dir / "study.yaml").read_text()
    assert json.loads((bundle / "study_record.json").read_text()) == json.loads(
        (study_dir / "study_record.json").read_text())
    checked = subprocess.run(["sha256sum", "-c", str(bundle / "data.sha256")], cwd=synthetic_data_dir,
                             capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 3, checked.stdout
    replicates = json.loads((bundle / "report" / "replicates.json").read_text())
    assert len(replicates) == 4 and all(r["config_source"] == "exact" for r in replicates)
    records = Journal(study_dir / "journal.jsonl").records()
    for entry in replicates:  # the exact config each replicate's trial got, from the journal
        assert entry["config"] == records[entry["trial_key"]].config
    readme = (bundle / "README.md").read_text()
    for entry in replicates:
        assert (f"`orchestrator reproduce . --cell 'layer={entry['values']['layer']}' --seed {entry['seed']} "
                "--data-dir DATA`") in readme
    [source] = (bundle / "source").iterdir()
    with tarfile.open(source) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames()}
        stem = source.name.removesuffix(".tar.gz")
        assert {"pyproject.toml", "reports/bundle.py", "orchestrator/run/reproduce.py"} <= names
        here = (Path(__file__).resolve().parents[2] / "reports" / "bundle.py").read_bytes()
        assert tar.extractfile(f"{stem}/reports/bundle.py").read() == here  # the code that runs, uncommitted or not


@pytest.mark.parametrize("size", ["10pt", "11pt"])
def test_the_compute_and_budget_tables_fit_an_acl_page(study, tmp_path, size):
    from tests.reports.test_report_layout import SMALLEST, compile_alone, printed

    folder, _ = study
    build_report(collect(f"sqlite:///{folder / 'mlflow.db'}", "spent"), tmp_path, ("latex",))
    for table in ("compute", "budget"):
        log, pdf = compile_alone(tmp_path, table, size)
        assert "Overfull \\hbox" not in log, (table, size)
        seen = printed(pdf)
        assert seen["table"] >= SMALLEST - 0.01 and seen["note_lines"] <= 3, (table, size, seen)


def test_trials_that_hold_gpus_report_gpu_hours_and_the_gpu_model(tiny_bert, synthetic_data_dir, tmp_path,
                                                                   monkeypatch):
    import torch

    from reports.environment import gpus

    path = write_study(tmp_path, tiny_bert, synthetic_data_dir, name="gpu", tune=None,
                       resources={"cpu": 4, "gpu": 0.5, "fuse": "off"})  # each trial's own wall time
    launch(path, storage=tmp_path / "studies", progress=False,
           executor=instant_executor(score, slots=2, epoch_seconds=epoch_seconds))
    build_report(collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "gpu"), tmp_path / "report")
    table = pd.read_csv(tmp_path / "report" / "compute.csv").set_index(["cell", "phase"])
    wall = 2 * 3 * (EPOCH_S[1] + EPOCH_S[3])  # 2 seeds x 3 epochs of each cell
    assert table.loc[("total", "all"), "gpu_hours"] == pytest.approx(0.5 * wall / 3600)
    assert table.loc[("total", "all"), "cpu_hours"] == pytest.approx(4 * wall / 3600)
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| Layer | Tuning trials | Tuning CPU-h | Replicates | Replicate CPU-h | CPU-h | Pruned | GPU-h |" in report
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what a worker on a GPU node reports
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    assert gpus() == {"gpu_model": "NVIDIA H100 80GB HBM3", "gpus": "2"}
