"""`orchestrator reproduce`: one replicate rerun from a report's stored config and seed, its data and
model checked first, the reported and recomputed scores side by side. Fast tests use the toy kind (a
report folder written the way `report` writes it); the slow ones a real study on Ray, its report and its
bundle unpacked into a fresh virtual environment."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.study.data import read_study_data
from orchestrator.study.inputs import with_files
from reports.environment import package_versions
from reports.record import KindRecord, StudyRecord
from trainables.contract import collect
from trainables.kinds import load_kind

TOY = "tests.toy_kind:ToyKind"


def toy_config(data_dir: Path, seed: int) -> dict:
    return {"model": "toy", "task": "stsb", "data_dir": str(data_dir), "epochs": 3, "lr": 0.5, "seed": seed,
            "max_train_samples": 100, "max_eval_samples": 50}


@pytest.fixture()
def toy_report(synthetic_data_dir, tmp_path) -> Path:
    """A report folder of a toy study whose replicates really ran (in process): what `report` writes."""
    folder = tmp_path / "report"
    folder.mkdir()
    base = toy_config(synthetic_data_dir, 0)
    record = StudyRecord(name="toy", kind=KindRecord(name="toy", path=TOY), metric="dev_spearman",
                         cells=[{"lr": 0.5}, {"lr": 1.0}], seeds=[1, 2], base=base, provenance=package_versions(),
                         data=[with_files(d) for d in read_study_data([("stsb", None)], str(synthetic_data_dir))])
    entries = []
    for lr in (0.5, 1.0):
        for seed in (1, 2):
            config = {**toy_config(synthetic_data_dir, seed), "lr": lr}
            reports: list[dict] = []
            load_kind(TOY).run(config, collect(reports))
            entries.append({"run_id": f"run-{lr}-{seed}", "trial_key": "k", "cell": f"lr={lr}", "values": {"lr": lr},
                            "seed": seed, "kind": TOY, "metric": "dev_spearman", "config": config,
                            "config_source": "exact", "hardware": {},
                            "reported": {"best_dev_spearman": reports[-1]["best_dev_spearman"],
                                         "test_spearman": reports[-1]["test_spearman"]}})
    (folder / "replicates.json").write_text(json.dumps(entries))
    (folder / "study_record.json").write_text(record.to_json())
    return folder


def test_a_replicate_rerun_matches_what_it_reported(toy_report, synthetic_data_dir):
    entries = json.loads((toy_report / "replicates.json").read_text())
    result = CliRunner().invoke(app, ["reproduce", str(toy_report), "--cell", "lr=1.0", "--seed", "2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "reproduce lr=1.0 · seed 2 (MLflow run run-1.0-2; config exact)"
    assert lines[1] == ("data: stsb/en train, dev, test: the rows the study ran on (sha256 checked, data folder "
                        f"{synthetic_data_dir})")
    reported = next(e for e in entries if e["cell"] == "lr=1.0" and e["seed"] == 2)["reported"]
    row = next(line for line in lines if line.startswith("test_spearman"))
    assert row.split()[1:] == [f"{reported['test_spearman']:.12f}", f"{reported['test_spearman']:.12f}", "0"]
    assert lines[-1] == "match: every score within 1e-06"


def test_a_score_that_differs_names_what_of_the_environment_changed(toy_report):
    entries = json.loads((toy_report / "replicates.json").read_text())
    entries[0]["reported"]["test_spearman"] += 0.01  # the number the paper printed is not what the code gives
    (toy_report / "replicates.json").write_text(json.dumps(entries))
    record = json.loads((toy_report / "study_record.json").read_text())
    record["provenance"]["torch"] = "1.0.0"
    (toy_report / "study_record.json").write_text(json.dumps(record))
    (toy_report / "environment.txt").write_text("# a lock\nnumpy==0.1\nsomething-gone==1.0\n")
    result = CliRunner().invoke(app, ["reproduce", str(toy_report), "--cell", "lr=0.5", "--seed", "1"])
    assert result.exit_code == 1
    assert "differs: a score is more than 1e-06 away from the reported one" in result.stdout
    assert f"  torch: 1.0.0 then, {package_versions()['torch']} now" in result.stdout
    assert "  something-gone: 1.0 -> absent" in result.stdout
    assert "numpy: 0.1" not in result.stdout  # a key package is named once, from the record, not the lock


def test_data_whose_rows_changed_stops_the_rerun_before_it_runs(toy_report, synthetic_data_dir, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(synthetic_data_dir, changed)
    dev = changed / "stsb" / "sts-dev.csv"
    dev.write_text(dev.read_text().replace("\t", "\t", 1).replace("4.", "3.", 1))  # one score edited
    result = CliRunner().invoke(app, ["reproduce", str(toy_report), "--cell", "lr=0.5", "--seed", "1",
                                      "--data-dir", str(changed)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: data: 'stsb/en dev' is not valid; its rows here "
                                    f"({changed}/stsb/sts-dev.csv) are not the ones the study ran on (sha256 ")
    assert "give --data-dir the folder that holds the study's data" in result.stderr


@pytest.mark.parametrize(("arguments", "message"), [
    (["--cell", "layer=1", "--seed", "1"], "error: --cell: 'layer' is not valid; not an axis of the study; its axes: "
                                           "lr\n"),
    (["--cell", "lr=3", "--seed", "1"], "error: --cell: 'lr=3' is not valid; matches no completed cell: lr=0.5, "
                                        "lr=1.0\n"),
    (["--cell", "lr", "--seed", "1"], "error: --cell: 'lr' is not valid; give the cell's axis values as AXIS=VALUE, "
                                      "e.g. --cell layer=3 or --cell 'layer=3 pooling=mean'\n"),
    (["--cell", "lr=0.5", "--seed", "7"], "error: --seed: 7 is not valid; lr=0.5 has completed replicates of seeds "
                                          "1, 2\n")])
def test_a_cell_or_seed_the_report_does_not_have_is_one_line(toy_report, arguments, message):
    result = CliRunner().invoke(app, ["reproduce", str(toy_report), *arguments])
    assert result.exit_code == 2 and result.stderr == message


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["cell", "values", "seed", "kind", "config", "reported", "lr"]), inner,
                        max_size=6), max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replicates=JSON, cell=st.sampled_from(["lr=0.5", "lr=1.0", "layer=1", "lr=0.5 lr=1.0"]) | st.text(max_size=20),
       seed=st.integers(-3, 3))
def test_a_damaged_report_or_any_cell_is_one_line_never_a_traceback(toy_report, tmp_path_factory, replicates, cell,
                                                                   seed):
    """Whatever replicates.json holds and whatever --cell and --seed say: a rerun, or one error line and exit 2."""
    damaged = tmp_path_factory.mktemp("damaged")
    shutil.copy(toy_report / "study_record.json", damaged)
    (damaged / "replicates.json").write_text(json.dumps(replicates))
    for folder in (damaged, toy_report):
        result = CliRunner().invoke(app, ["reproduce", str(folder), "--cell", cell, "--seed", str(seed)])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        if result.exit_code != 0:
            assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        else:  # only a cell and seed the report has
            assert folder == toy_report and seed in (1, 2) and result.stdout.rstrip().endswith("match: every score "
                                                                                              "within 1e-06")


def test_a_report_without_its_record_is_one_line(toy_report):
    (toy_report / "study_record.json").unlink()
    result = CliRunner().invoke(app, ["reproduce", str(toy_report), "--cell", "lr=0.5", "--seed", "1"])
    assert result.exit_code == 2
    assert result.stderr == (f"error: REPORT: '{toy_report}' is not valid; its study_record.json is missing or "
                             "unreadable; write the report again with `orchestrator report`\n")


def test_a_folder_that_is_no_report_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["reproduce", str(tmp_path), "--cell", "layer=1", "--seed", "0"])
    assert result.exit_code == 2
    assert result.stderr == (f"error: REPORT: '{tmp_path}' is not valid; no replicates.json there: give a folder "
                             "written by `orchestrator report` (or an unpacked --bundle)\n")


def test_reruns_drawn_at_random_are_set_against_their_cells_seed_spread(toy_report):
    """`verify --rerun N`'s reruns: N replicates drawn by the seed, each rerun with its own seed; a score
    that comes back different is shown as a share of its cell's seed-to-seed sd (computed here from the
    report's own replicates), and the verdict says the machine does not give the numbers back."""
    import math
    import statistics

    import orchestrator as orc
    from orchestrator.run.reproduce import render_reruns

    entries = json.loads((toy_report / "replicates.json").read_text())
    same = orc.rerun(toy_report, 2, draw_seed=3)
    assert len(same) == 2 and all(r.result.matches for r in same)
    assert all(r.share(name) == 0.0 for r in same for name in r.result.reported)
    assert render_reruns(same, 4, 3)[-1] == ("same-seed variation: none (every score within 1e-06): a rerun gives "
                                             "the reported numbers")
    again = [(r.result.entry["cell"], r.result.entry["seed"]) for r in orc.rerun(toy_report, 2, draw_seed=3)]
    assert again == [(r.result.entry["cell"], r.result.entry["seed"]) for r in same]  # the seed draws them
    assert len(orc.rerun(toy_report, 9)) == 4  # more than the report holds: every replicate once

    entries[0]["reported"]["test_spearman"] += 0.02  # as a GPU's nondeterministic kernel would leave it
    (toy_report / "replicates.json").write_text(json.dumps(entries))
    (off,) = [r for r in orc.rerun(toy_report, 4) if r.result.entry["run_id"] == entries[0]["run_id"]]
    sd = statistics.stdev(e["reported"]["test_spearman"] for e in entries if e["cell"] == entries[0]["cell"])
    assert off.seed_sd["test_spearman"] == pytest.approx(sd, rel=1e-12)
    assert off.share("test_spearman") == pytest.approx(0.02 / sd, rel=1e-6)
    lines = render_reruns([off], 4, 0)
    assert f"test_spearman 0.02 ({0.02 / sd:.1%} of its seed sd {sd:.3g})" in lines[1]
    assert lines[-1].startswith(f"same-seed variation: up to {0.02 / sd:.1%} of the seed-to-seed sd; this machine "
                                "does not give the reported numbers back exactly")
    assert not math.isnan(off.share("best_dev_spearman"))


def test_a_rerun_count_below_one_is_one_line(toy_report):
    import orchestrator as orc

    with pytest.raises(orc.UserInputError, match=r"^--rerun: 0 is not valid; give how many replicates to rerun"):
        orc.rerun(toy_report, 0)


# --- a real study, its report and bundle (slow) ---------------------------------------------------


@pytest.fixture(scope="module")
def reported(tiny_bert, data_dir, tmp_path_factory):
    """A quickstart-like study (real STS-B, capped; a tiny random BERT), launched on Ray and reported with
    a bundle, as a user runs it from the command line."""
    folder = tmp_path_factory.mktemp("quick")
    study = {"name": "quick", "trainable": "finetune", "task": "stsb", "model": tiny_bert,
             "ablate": {"layer": [1, 3], "pooling": "mean"},
             "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-3]}}, "trials": 2, "startup_trials": 1},
             "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2, "batch_size": 16, "max_seq_length": 32},
             "data": {"max_train_samples": 160, "max_eval_samples": 80}, "data_dir": str(data_dir),
             "resources": {"cpu": 1}, "tracking": {"mlflow_uri": "sqlite:///mlflow.db"},
             "report": {"baseline": {"layer": 3}, "detect": 0.5}}
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    env = {k: v for k, v in {**os.environ, "HF_HUB_OFFLINE": "1"}.items() if k != "RAY_AUTH_MODE"}
    command = [sys.executable, "-m", "orchestrator.cli"]
    launched = subprocess.run([*command, "launch", "study.yaml", "--storage", "studies"], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=900)
    assert launched.returncode == 0, launched.stderr[-3000:]
    bundled = subprocess.run([*command, "report", "quick", "--storage", "studies", "--bundle"], cwd=folder, env=env,
                             capture_output=True, text=True, timeout=600)
    assert bundled.returncode == 0, bundled.stderr[-3000:]
    assert "bundle: reports/quick-bundle.tar.gz (" in bundled.stdout  # beside the report, as the user called it
    return folder


@pytest.mark.slow
def test_the_real_studys_report_answers_every_checklist_item_and_budgets_every_tuned_cell(reported, tiny_bert):
    import pandas as pd

    from reports.environment import cpu_model

    report = reported / "reports" / "quick"
    answers = {item["key"]: item for item in json.loads((report / "reproducibility.json").read_text())}
    assert list(answers) == ["models", "data", "search", "budget", "seeds", "tests", "software", "hardware",
                             "compute", "code"]
    assert not [key for key, item in answers.items() if "not recorded" in item["answer"]]
    assert answers["hardware"]["facts"]["machines"]["cpu_model"] == [cpu_model()]  # what the Ray workers said
    assert answers["models"]["facts"]["models"][0]["name"] == tiny_bert
    assert answers["data"]["facts"]["data"][0]["provenance_match"] is True  # STS-B as its PROVENANCE.md lists it
    assert answers["compute"]["facts"]["trials"] == 8 and answers["compute"]["facts"]["cpu_hours"] > 0
    budget = pd.read_csv(report / "budget.csv")
    assert sorted(budget.cell) == ["layer=1 pooling=mean", "layer=3 pooling=mean"] and (budget.trials == 2).all()
    assert "## Reproducibility" in (report / "report.md").read_text()
    assert "detectable_80" in pd.read_csv(report / "stats.csv").columns


@pytest.mark.slow
def test_reproduce_reruns_a_cell_of_a_real_study_to_1e6(reported, data_dir):
    result = CliRunner().invoke(app, ["reproduce", str(reported / "reports" / "quick"), "--cell", "layer=3",
                                      "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "data: stsb/en train, dev, test: the rows the study ran on (sha256 checked" in result.stdout
    assert "model: " in result.stdout and "the weights the study ran on (sha256 checked" in result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()
            if line.startswith(("best_dev_spearman", "test_spearman", "test_pearson"))}
    assert set(rows) == {"best_dev_spearman", "test_spearman", "test_pearson"}
    assert all(float(difference) <= 1e-6 for _, _, difference in rows.values())
    assert result.stdout.rstrip().endswith("match: every score within 1e-06")


@pytest.mark.slow
def test_verify_reruns_replicates_of_a_real_study_and_finds_no_same_seed_variation_on_a_cpu(reported, data_dir,
                                                                                          monkeypatch):
    monkeypatch.chdir(reported)  # the study's MLflow store is sqlite:///mlflow.db, beside its study file
    result = CliRunner().invoke(app, ["verify", str(reported / "reports" / "quick"), "--rerun", "1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok: every number of ") and lines[1].startswith("rerun 1 of 4 replicates (drawn with "
                                                                               "seed 0) here")
    assert lines[2].startswith("  layer=") and "best_dev_spearman 0 (0.0% of its seed sd " in lines[2]
    assert lines[-1].startswith("same-seed variation: none (every score within 1e-06)")


def fresh_venv(folder: Path) -> Path:
    """A virtual environment of this interpreter that sees the project's dependencies (the test
    environment's site-packages, as a plain path: its .pth files, the editable install of this checkout
    among them, are not read) and nothing of the project itself."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    import sysconfig

    site = Path(subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder / "bin" / "python"


@pytest.mark.slow
def test_a_fresh_venv_reproduces_a_cell_from_the_bundle_alone(reported, data_dir, tmp_path):
    with tarfile.open(reported / "reports" / "quick-bundle.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    bundle = tmp_path / "quick-bundle"
    assert {p.name for p in bundle.iterdir()} >= {"README.md", "report", "study.yaml", "study_record.json",
                                                  "environment.txt", "data.sha256", "source"}
    checked = subprocess.run(["sha256sum", "-c", str(bundle / "data.sha256")], cwd=data_dir, capture_output=True,
                             text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 3, checked.stdout
    python = fresh_venv(tmp_path / "venv")
    [source] = (bundle / "source").iterdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_AUTH_MODE")} | {"HF_HUB_OFFLINE": "1"}
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-build-isolation", "--no-index", "-q", str(source)], env=env, capture_output=True,
                               text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import orchestrator, reports; print(orchestrator.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where  # the bundle's code, not this checkout's
    readme = (bundle / "README.md").read_text()
    line = next(row for row in readme.splitlines() if row.startswith("| layer=1 pooling=mean | 0 |"))
    command = shlex.split(line.split("`")[1].replace("DATA", str(data_dir)))
    assert command[:2] == ["orchestrator", "reproduce"]
    result = subprocess.run([str(tmp_path / "venv" / "bin" / "orchestrator"), *command[1:]], cwd=bundle, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.rstrip().endswith("match: every score within 1e-06")
