"""A newcomer's first hour: the data folder found without being named, `--data-dir` on every verb that reads
data, no hub retries when the hub cannot be reached, every error of a study file at once, and a run that
ends saying what to do next."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
import typer
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cli import study as cli
from trainables import hub
from trainables.data import tasks as data
from trainables.errors import DataNotFoundError, UserInputError

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


def cli_env(**extra: str) -> dict[str, str]:
    """A newcomer's shell: no data folder named, the hub not declared offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHESTRATOR_DATA_DIR", "HF_HUB_OFFLINE",
                                                           "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**env, "PYTHONPATH": str(REPO), "HF_ENDPOINT": UNREACHABLE, **extra}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=cli_env(**env), timeout=120)


# --- the data folder ------------------------------------------------------------------------------------


def test_the_default_data_folder_is_shared_data_beside_a_checkout(tmp_path, monkeypatch):
    checkout = tmp_path / "repo"
    (checkout / "trainables" / "data").mkdir(parents=True)
    monkeypatch.setattr(data, "__file__", str(checkout / "trainables" / "data" / "tasks.py"))
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    assert data.default_data_dir() is None  # no pyproject.toml: an installed package, not a checkout
    (checkout / "pyproject.toml").write_text("")
    assert data.default_data_dir() is None  # a checkout, but nothing beside it
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert data.default_data_dir() == tmp_path / "shared" / "data"
    assert data.data_dir() == tmp_path / "shared" / "data"
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "elsewhere"))
    assert data.data_dir() == tmp_path / "elsewhere"  # the variable (what --data-dir sets) comes first
    assert data.data_dir(tmp_path / "given") == tmp_path / "given"  # and an explicit folder before it


def test_examples_validate_with_the_default_data_folder_and_no_variable(data_dir):
    if data.default_data_dir() is None:
        pytest.skip("no ../shared/data beside this checkout")
    for example in ("stsb_layers", "stsb_languages", "quickstart", "nli_mnrl", "stsb_matryoshka_2d",
                    "stsb_layer_mixes", "stsb_truncation_tradeoff"):
        result = run_cli("validate", f"examples/{example}.yaml")
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""  # nothing to warn of: STS-B's own 7 train/test pairs are recorded, not said
        assert result.stdout.startswith(f"ok: {example}: ")
    plan = run_cli("plan", "examples/quickstart.yaml")
    assert plan.returncode == 0 and "trials: 9 tuning + 6 replicate = 15" in plan.stdout


@pytest.mark.parametrize("verb", ["validate", "plan", "launch", "resume", "doctor", "probe"])
def test_every_verb_that_reads_data_takes_data_dir(verb):
    group = typer.main.get_command(app)
    command = group.get_command(click.Context(group), verb)
    assert any("--data-dir" in p.opts for p in command.params if p.param_type_name == "option")


def test_data_dir_is_the_folder_validate_reads(synthetic_data_dir, tmp_path, minilm_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": str(minilm_path), "ablate": {"layer": [1]}}))
    ok = run_cli("validate", str(study), "--data-dir", str(synthetic_data_dir))
    assert ok.returncode == 0, ok.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = run_cli("validate", str(study), "--data-dir", str(empty))
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"error: task: 'stsb' has no data here; put stsb/sts-train.csv, stsb/sts-dev.csv, stsb/sts-test.csv under "
        f"the data folder {empty.resolve()}, or go online: the hub copy sentence-transformers/stsb cannot be "
        "reached from here"]
    nowhere = run_cli("validate", str(study), "--data-dir", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 2
    assert nowhere.stderr.strip() == (f"error: --data-dir: '{tmp_path / 'nowhere'}' is not valid; give an existing "
                                      "folder in the layout of shared/data")


def test_data_dir_that_contradicts_the_study_file_is_refused(synthetic_data_dir, tmp_path, minilm_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": str(minilm_path), "ablate": {"layer": [1]},
                                     "data_dir": str(synthetic_data_dir)}))
    other = tmp_path / "other"
    other.mkdir()
    result = CliRunner().invoke(app, ["validate", str(study), "--data-dir", str(other)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: --data-dir: '{other}' is not valid; the study file sets data_dir: "
                                     f"{synthetic_data_dir} ({synthetic_data_dir}); remove one of the two")
    same = CliRunner().invoke(app, ["validate", str(study), "--data-dir", str(synthetic_data_dir)])
    assert same.exit_code == 0, same.output


# --- the hub, when it cannot be reached ---------------------------------------------------------------


@pytest.fixture
def fresh_hub_check(monkeypatch):
    """hub_reachable() asked again, and whatever offline mode a test sets undone afterwards."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    hub.hub_reachable.cache_clear()
    yield monkeypatch
    hub.hub_reachable.cache_clear()


def test_an_offline_variable_answers_without_touching_the_network(fresh_hub_check):
    def no_network(*args, **kwargs):
        raise AssertionError("the network was tried although HF_HUB_OFFLINE is set")

    fresh_hub_check.setattr(hub.socket, "create_connection", no_network)
    fresh_hub_check.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_reachable() is False


def test_an_unreachable_hub_is_known_at_once(fresh_hub_check):
    fresh_hub_check.setenv("HF_ENDPOINT", UNREACHABLE)
    started = time.monotonic()
    assert hub.hub_reachable() is False
    assert time.monotonic() - started < hub.CHECK_TIMEOUT_S + 0.5
    assert hub.endpoint() == ("127.0.0.1", 9)


def test_a_name_lookup_that_hangs_is_abandoned(fresh_hub_check):
    def hang(*args, **kwargs):
        time.sleep(5)  # a name server that does not answer
        raise OSError("timed out")

    fresh_hub_check.setattr(hub.socket, "create_connection", hang)
    started = time.monotonic()
    assert hub.hub_reachable() is False
    assert time.monotonic() - started < hub.CHECK_TIMEOUT_S + 0.5


def test_missing_data_with_the_hub_unreachable_never_asks_the_hub(fresh_hub_check, tmp_path):
    import datasets

    asked = []
    fresh_hub_check.setattr(datasets, "load_dataset", lambda *args, **kwargs: asked.append(args))
    fresh_hub_check.setattr(hub, "can_connect", lambda *args: False)
    with pytest.raises(DataNotFoundError, match="cannot be reached from here"):
        data.load_task("stsb", data_folder=tmp_path)
    assert asked == []  # no retry loop: the hub client was never called


def test_a_hub_model_with_the_hub_unreachable_fails_without_retries(fresh_hub_check, tmp_path):
    from trainables.models.files import model_depth

    fresh_hub_check.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # nothing cached
    fresh_hub_check.setattr(hub, "can_connect", lambda *args: False)
    started = time.monotonic()
    with pytest.raises(UserInputError, match="model: 'someone/no-such-encoder' is not valid"):
        model_depth("someone/no-such-encoder")
    assert time.monotonic() - started < 2.0
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # the hub clients of this process and its children read the cache


def test_validate_without_data_and_without_the_hub_is_one_line_in_seconds(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    started = time.monotonic()
    result = run_cli("validate", "examples/stsb_layers.yaml", ORCHESTRATOR_DATA_DIR=str(empty))
    took = time.monotonic() - started
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Retrying" not in result.stderr
    assert took < 10  # about 1 s here (imports and the 1.5 s cap at most); the hub's retries took 25 s


# --- every error of a study file at once ---------------------------------------------------------------


def test_validate_reports_every_structural_error_at_once(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "bad study", "model": "sentence-transformers/all-MiniLM-L6-v2", "ablate": {"layer": [1]},
        "tune": {"params": {"lr": "default"}, "trials": 0, "schedular": "asha"}, "report": {"alpha": 2}},
        sort_keys=False))
    result = CliRunner().invoke(app, ["validate", str(study)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: name: 'bad study' is not valid; use letters, digits, '_', '.' or '-' (it names folders)",
        "error: tune.trials: 0 is not valid; input should be greater than or equal to 1",
        "error: tune.schedular: 'asha' is not valid; unknown key; did you mean scheduler? Valid keys here: params, "
        "trials, objectives, sampler, scheduler, grace_epochs, reduction_factor, startup_trials, qmc_type, "
        "population_size, sampler_seed, seed",
        "error: report.alpha: 2 is not valid; input should be less than 1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # nothing written


def test_validate_reports_every_deep_error_at_once(tmp_path, synthetic_data_dir, minilm_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "deep", "model": str(minilm_path), "data_dir": str(synthetic_data_dir),
        "ablate": {"layer": [1, 9], "pooling": ["mean", "avg"]},
        "tune": {"params": {"lr": "default", "warmup": {"uniform": [0, 0.1]}}, "trials": 2},
        "tracking": {"mlflow_uri": "ftp://x"}}, sort_keys=False))
    result = CliRunner().invoke(app, ["validate", str(study)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()  # in the order of the keys in the file
    assert lines[0] == ("error: ablate.layer: [1, 9] is not valid; the model has 6 layers: use all, last, or numbers "
                        "in 0..6")
    assert lines[1].startswith("error: ablate.pooling: 'avg' is not valid; use all or names from: mean, cls, max, "
                               "mean_sqrt_len")
    assert lines[2].startswith("error: tune.params.warmup: 'warmup' is not valid; did you mean warmup_ratio? ")
    assert lines[3:] == [
        "error: tracking.mlflow_uri: 'ftp://x' is not valid; use sqlite:///path/to/mlflow.db (the default) or an "
        "http(s):// tracking server"]


FIVE_MISTAKES = """\
name: five
model: {model}
data_dir: {data}
ablate: {{layer: [1, 9]}}
tune: {{params: {{lr: {{loguniform: [1.0e-5, 1.0e-4]}}}}, trails: 3}}
train: {{epochs: two, epochz: 3, batch_size: -16}}
"""


@pytest.mark.parametrize("through", ["validate", "plan", "launch", "api", "overrides"])
def test_five_mistakes_of_five_kinds_are_five_lines_in_file_order(through, tmp_path, synthetic_data_dir, tiny_bert,
                                                                     monkeypatch):
    """A layer the model lacks (a model check), an unknown key of the file's structure, a type, an unknown
    key of the kind's and a range: each its own line, in the file's order, exit 2, nothing written; the
    same through the Python API and when the mistakes come as command-line overrides."""
    import orchestrator as orc
    from trainables.errors import UserInputErrors

    monkeypatch.chdir(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(FIVE_MISTAKES.format(model=tiny_bert, data=synthetic_data_dir))
    args = [str(study)]
    if through == "overrides":
        study.write_text(f"name: five\nmodel: {tiny_bert}\ndata_dir: {synthetic_data_dir}\n"
                         "ablate: {layer: 1}\ntune: {params: {lr: {loguniform: [1.0e-5, 1.0e-4]}}}\n")
        args += ["ablate.layer=[1,9]", "tune.trails=3", "train.epochs=two", "train.epochz=3", "train.batch_size=-16"]
    expected = [
        "ablate.layer: [1, 9] is not valid; the model has 3 layers: use all, last, or numbers in 0..3",
        "tune.trails: 3 is not valid; unknown key; did you mean trials? Valid keys here: ",
        "train.epochs: 'two' is not valid; input should be a valid integer",
        "train.epochz: 'epochz' is not valid; did you mean epochs? ",
        "train.batch_size: -16 is not valid; input should be greater than or equal to 2"]
    before = sorted(p.name for p in tmp_path.iterdir())
    if through == "api":
        with pytest.raises(UserInputErrors) as raised:
            orc.load_study(study)
        lines = raised.value.lines()
    else:
        result = CliRunner().invoke(app, [through if through != "overrides" else "validate", *args])
        assert result.exit_code == 2, result.output
        lines = [line.removeprefix("error: ") for line in result.stderr.splitlines()]
    assert len(lines) == 5, lines
    assert all(line.startswith(start) for line, start in zip(lines, expected, strict=True)), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_one_mistake_repeated_by_every_cell_is_said_once(tmp_path, synthetic_data_dir, minilm_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "loss", "model": str(minilm_path), "data_dir": str(synthetic_data_dir),
                                     "ablate": {"layer": [1, 2, 3]}, "train": {"loss": "cosine_msee"}}))
    result = CliRunner().invoke(app, ["validate", str(study)])
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: train.loss: 'cosine_msee'")


# --- how a run ends ------------------------------------------------------------------------------------


def finished_result(folder: Path) -> SimpleNamespace:
    report = SimpleNamespace(folder=Path("reports") / folder.name, files=["report.md"] * 9)
    return SimpleNamespace(study_dir=folder, finished=True, reconciled={}, report=report,
                           counts={"completed": 13, "pruned": 2, "diverged": 0, "failed": 0, "planned": 15})


def test_a_finished_run_ends_with_its_wall_time_and_what_to_do_next(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [".venv/bin/orchestrator", "launch", "examples/quickstart.yaml"])
    result = finished_result(tmp_path / "studies" / "quickstart")
    monkeypatch.setattr(cli.time, "monotonic", lambda: 1000.0)  # the report's writing takes no time here
    cli.run_to_end("quickstart", None, 1000.0 - 221, lambda stops: result)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-5:] == [
        "report: reports/quickstart/report.md (9 files)",
        "quickstart: done in 3m41s. Next:",
        "  .venv/bin/orchestrator ui quickstart              # the runs in the MLflow UI",
        "  .venv/bin/orchestrator verify reports/quickstart  # every number of the report checked against MLflow",
        "  .venv/bin/orchestrator report quickstart          # the report written again (after editing report: in "
        "the study file)"]


def test_the_hints_name_the_storage_folder_when_it_is_not_the_default(tmp_path, monkeypatch, capsys):
    from orchestrator.api import StudyInterrupted

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/python", "-m", "orchestrator.cli"])
    result = finished_result(tmp_path / "elsewhere" / "quickstart")
    result.finished = False

    def stopped(stops):
        raise StudyInterrupted(result)

    with pytest.raises(typer.Exit):
        cli.run_to_end("quickstart", tmp_path / "elsewhere", time.monotonic(), stopped)
    assert capsys.readouterr().err.splitlines()[-1] == (f"interrupted: orchestrator resume quickstart --storage "
                                                        f"{tmp_path / 'elsewhere'}")
