"""Malformed study files: each gives one line naming the key, the value and the fix; exit 2;
nothing written."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app

runner = CliRunner()


@pytest.fixture()
def good(tiny_bert, synthetic_data_dir) -> dict:
    return {"name": "s", "trainable": "finetune", "task": "stsb", "model": tiny_bert,
            "ablate": {"layer": [1, 3], "pooling": "mean"},
            "tune": {"params": {"lr": {"loguniform": [1e-4, 1e-3]}}, "trials": 2},
            "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2, "batch_size": 16},
            "data_dir": str(synthetic_data_dir), "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}


def _with(study: dict, path: str, value) -> dict:
    study = yaml.safe_load(yaml.safe_dump(study))
    *parents, last = path.split(".")
    node = study
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return study


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()  # the key taken out of the file (a stable repr: the test ids are the same in every process)
CASES = [
    ("nmae", "x", "nmae: 'x' is not valid; unknown key; did you mean name? Valid keys here: name, trainable"),
    ("name", DELETE, "name: None is not valid; this key is required"),
    ("name", "my study", "name: 'my study' is not valid; use letters, digits"),
    ("trainable", "finetuning",
     "trainable: 'finetuning' is not valid; use one of: contrastive, cross_encoder, distill, finetune, probe"),
    ("trainable", "dapt", "trainable: 'dapt' is not valid; DAPT is now `trainable: finetune` with `pretrain: mlm`"),
    ("task", "stsbb", "task: 'stsbb' is not valid; did you mean stsb? valid names: korsts, mrpc, sick"),
    ("task", "unlabeled_en", "task: 'unlabeled_en' is not valid; valid names: korsts, mrpc, sick, sick_full"),
    ("language", "de", "language: 'de' is not valid; task stsb has the languages: en"),
    ("model", "no-such-org/no-such-model", "model: 'no-such-org/no-such-model' is not valid; give a local model"),
    ("model", DELETE, "model: None is not valid; this key is required: a hub id or a model folder (or list the "
                      "models under ablate.model)"),
    ("ablate.layer", [1, 9], "ablate.layer: [1, 9] is not valid; the model has 3 layers: use all, last, or numbers "
                             "in 0..3"),
    ("ablate.pooling", ["mean", "sum"], "ablate.pooling: 'sum' is not valid; use all or names from: mean, cls"),
    ("ablate.poolng", ["mean"], "ablate.poolng: 'poolng' is not valid; did you mean pooling?"),
    ("ablate.seed", [0, 1], "ablate.seed: [0, 1] is not valid; seeds are never ablated: list them under "
                            "replicate.seeds"),
    ("ablate.layer", {"uniform": [0, 3]}, "ablate.layer: {'uniform': [0, 3]} is not valid; ablate takes a value or "
                                          "a list"),
    ("ablate.pooling", ["mean", "mean"], "ablate.pooling: ['mean', 'mean'] is not valid; values repeat"),
    ("tune.params.lr", {"loguniform": [0, 1e-3]}, "tune.params.lr: {'loguniform': [0, 0.001]} is not valid; "
                                                  "loguniform needs low > 0"),
    ("tune.params.lr", {"uniform": [1e-3, 1e-4]}, "needs low < high"),
    ("tune.params.lr", {"normal": [1, 2]}, "tune.params.lr: {'normal': [1, 2]} is not valid; write one of"),
    ("tune.params.pooling", ["mean", "cls"], "tune.params.pooling: ['mean', 'cls'] is not valid; pooling is also "
                                             "ablated"),
    ("tune.params.lrr", {"uniform": [1, 2]}, "tune.params.lrr: 'lrr' is not valid; did you mean lr?"),
    ("tune.trials", 0, "tune.trials: 0 is not valid; input should be greater than or equal to 1"),
    ("tune.scheduler", "pbt", "tune.scheduler: 'pbt' is not valid; use 'asha', 'hyperband' or 'none'"),
    ("replicate.seeds", [0, 0], "replicate.seeds: [0, 0] is not valid; seeds repeat"),
    ("replicate.seeds", "five", "replicate.seeds: 'five' is not valid;"),
    ("train.epochs", 0, "train.epochs: 0 is not valid; input should be greater than or equal to 1"),
    ("train.epochs", "ten", "train.epochs: 'ten' is not valid; input should be a valid integer"),
    ("train.loss", "cosine", "train.loss: 'cosine' is not valid; use one of: angle, cached_mnrl, cosent"),
    ("train.loss", "softmax", "train.loss: 'softmax' is not valid; it trains classification tasks; task stsb needs "
                              "one of: cosine_mse, cosent, angle"),
    ("train.learning_rate", 1e-3,
     "train.learning_rate: 'learning_rate' is not valid; valid names: adaptive_kl_temperature, adaptive_kl_weight"),
    ("train.seed", 3, "train.seed: 'seed' is not valid;"),
    ("data.max_train_samples", -5, "data.max_train_samples: -5 is not valid; input should be greater than or equal"),
    ("resources.gpu", -1, "resources.gpu: -1 is not valid; input should be greater than or equal to 0"),
    ("tracking.mlflow_uri", "./mlruns", "tracking.mlflow_uri: './mlruns' is not valid; use sqlite:///path/to/"
                                        "mlflow.db (the default) or an http(s):// tracking server"),
    ("tracking.mlflow_uri", "http://127.0.0.1:9/", "tracking.mlflow_uri: 'http://127.0.0.1:9/' is not valid; the "
                                                   "tracking server does not answer"),
    ("report.formats", ["pdf"], "report.formats.0: 'pdf' is not valid; use 'markdown', 'latex' or 'csv'"),
    ("report.baseline", {"layer": 5}, "report.baseline.layer: 5 is not valid; use one of the ablated values: 1, 3"),
    ("report.rows", ["layer"], "report.rows: ['layer'] is not valid; layer is the axis across the tables "
                               "(report.columns, by default layer); remove it from report.rows"),
    ("data_dir", "/nonexistent/data", "task: 'stsb' has no data here; put stsb/sts-train.csv"),
]


@pytest.mark.parametrize(("path", "value", "message"), CASES, ids=[f"{p}={v!r}"[:40] for p, v, _ in CASES])
def test_malformed_study_is_one_line_exit_2_and_writes_nothing(good, tmp_path, monkeypatch, path, value, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("ORCHESTRATOR_DATA_DIR", raising=False)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(_with(good, path, value)))
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(app, ["validate", str(study)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message in lines[0]
    launched = runner.invoke(app, ["launch", str(study), "--storage", str(tmp_path / "studies")])
    assert launched.exit_code == 2 and message in launched.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_yaml_syntax_error_names_the_position(tmp_path):
    study = tmp_path / "bad.yaml"
    study.write_text(textwrap.dedent("""\
        name: s
        ablate: {layer: [1, 2}
        """))
    result = runner.invoke(app, ["validate", str(study)])
    assert result.exit_code == 2
    assert "YAML syntax error at line 2" in result.stderr


def test_good_study_validates_and_plans(good, tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(good))
    result = runner.invoke(app, ["validate", str(study)])
    assert result.exit_code == 0 and "2 cells, 8 trials" in result.stdout
    planned = runner.invoke(app, ["plan", str(study)])
    assert planned.exit_code == 0
    assert "layer=1 pooling=mean" in planned.stdout and "layer=3 pooling=mean" in planned.stdout
    assert "trials: 4 tuning + 4 replicate = 8; at most 16 trial-epochs" in planned.stdout


def test_layer_all_resolves_from_the_model_config(good, tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(_with(_with(good, "ablate.layer", "all"), "tune", DELETE)))
    result = runner.invoke(app, ["validate", str(study)])
    assert "4 cells, 8 trials" in result.stdout  # layers 0..3 of the tiny encoder x 2 seeds


def test_two_models_of_different_depths_share_a_study_each_with_all_its_layers(good, tmp_path):
    """`model` may be left out when `ablate.model` lists the models; `layer: all` is each one's own."""
    from tests.conftest import save_tiny_bert

    shallow = str(save_tiny_bert(tmp_path / "shallow", layers=1))
    spec = _with(_with(_with(good, "model", DELETE), "tune", DELETE), "ablate.layer", "all")
    spec["ablate"] = {"model": [good["model"], shallow], **spec["ablate"]}
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(study)])
    assert result.exit_code == 0 and "6 cells, 12 trials" in result.stdout, result.output  # layers 0..3 and 0..1
    planned = runner.invoke(app, ["plan", str(study)])
    assert planned.exit_code == 0 and shallow in planned.stdout


def test_schema_is_json_schema_of_the_study_file():
    import json

    result = runner.invoke(app, ["schema"])
    schema = json.loads(result.stdout)
    assert schema["title"] == "StudyConfig" and "ablate" in schema["properties"] and "name" in schema["required"]


@pytest.mark.parametrize(("trainable", "train", "message"), [
    ("distill", {"mode": "both"}, "error: train.mode: 'both' is not valid; use one of: mutual, self, teacher"),
    ("distill", {"cross_pooling": "sum"},
     "error: train.cross_pooling: 'sum' is not valid; use one of: cls, last_token, max, mean, mean_sqrt_len"),
    ("contrastive", {"method": "mocse"}, "error: train.method: 'mocse' is not valid; use one of: micse, simcse"),
    ("contrastive", {"method": "micse", "attention_layers": [5]},
     "error: train.attention_layers: [5] is not valid; the encoder keeps 3 layers: use numbers in 1..3"),
    ("cross_encoder", {"loss": "cosine_mse"}, "error: train.loss: 'cosine_mse' is not valid; use one of: bce, mse"),
])
def test_names_inside_the_newer_trainables_are_checked_before_launch(good, tmp_path, monkeypatch, trainable, train,
                                                                      message):
    monkeypatch.chdir(tmp_path)
    study = {**good, "trainable": trainable, "train": train, "tune": None, "ablate": {}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    result = runner.invoke(app, ["validate", str(tmp_path / "study.yaml")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith(message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


@pytest.mark.parametrize(("trainable", "ablate", "train", "tune", "key", "value"), [
    ("finetune", {}, {"layer": 9}, None, "train.layer", "9"),
    ("finetune", {"pooling": ["mean", "cls"]}, {}, {"params": {"layer": {"int": [1, 5]}}, "trials": 2},
     "tune.params.layer", "5"),
    ("cross_encoder", {}, {"layer": 4}, None, "train.layer", "4"),
    ("contrastive", {}, {"layer": 7}, None, "train.layer", "7"),
    ("distill", {}, {"cross_layer": 6}, None, "train.cross_layer", "6"),
    ("distill", {"partner_layer": [1, 8]}, {"mode": "mutual"}, None, "ablate.partner_layer", "8"),
    ("distill", {}, {"layer": 2}, {"params": {"cross_layer": {"choice": [1, 4]}}, "trials": 2},
     "tune.params.cross_layer", "4"),
    ("probe", {}, {"layers": [0, 9]}, None, "train.layers", "[0, 9]"),
])
def test_a_layer_above_the_models_depth_is_refused_before_launch_wherever_it_is_set(
        good, tmp_path, monkeypatch, trainable, ablate, train, tune, key, value):
    monkeypatch.chdir(tmp_path)
    study = {**good, "trainable": trainable, "ablate": ablate, "train": train, "tune": tune,
             "replicate": {"seeds": [0]}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    result = runner.invoke(app, ["validate", str(tmp_path / "study.yaml")])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith(f"error: {key}: {value} is not valid; ")
    assert line.endswith("has 3 layers: use numbers in 0..3")
    assert "\n" not in line and sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


@pytest.mark.parametrize(("ablate", "report", "message"), [
    ({"layer": [1, 2], "pooling": ["mean", "cls"]}, {"baseline": {"pooling": "mean"}},
     "error: report.baseline.pooling: 'mean' is not valid; significance compares the cells of a row against the "
     "baseline of the column axis (layer); set report.columns: pooling"),
    ({"layer": [1, 2]}, {"baseline": {"layer": "last"}},
     "error: report.baseline.layer: 'last' is not valid; last is the model's last layer (3), which the study does "
     "not ablate (1, 2); add it to ablate.layer or name an ablated layer"),
    ({"layer": [1, 3], "pooling": ["mean", "cls"]}, {"baseline": {"pooling": "last"}, "columns": "pooling"},
     "error: report.baseline.pooling: 'last' is not valid; last means the model's last layer"),
])
def test_a_baseline_the_report_cannot_compute_is_refused(good, tmp_path, monkeypatch, ablate, report, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({**good, "ablate": ablate, "report": report}))
    result = runner.invoke(app, ["validate", str(tmp_path / "study.yaml")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith(message)


def test_a_baseline_on_the_column_axis_and_the_real_last_layer_validate(good, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for ablate, report in (({"layer": [1, 3]}, {"baseline": {"layer": "last"}}),
                           ({"layer": [1, 2], "pooling": ["mean", "cls"]},
                            {"baseline": {"pooling": "mean"}, "columns": "pooling"})):
        (tmp_path / "study.yaml").write_text(yaml.safe_dump({**good, "ablate": ablate, "report": report}))
        result = runner.invoke(app, ["validate", str(tmp_path / "study.yaml")])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("change", "extends"), [
    ({"replicate": {"seeds": [0, 1, 2]}}, True),
    ({"tune": {"params": {"lr": {"loguniform": [1e-4, 1e-3]}}, "trials": 4}}, True),
    ({"ablate": {"layer": [1, 2, 3], "pooling": "mean"}}, True),
    ({"report": {"formats": ["markdown"]}, "resources": {"cpu": 2}, "max_concurrent": 3}, True),
    ({"model": "other/model"}, "model: 'other/model' is not valid; the study was launched with "),
    ({"tune": {"params": {"lr": {"loguniform": [1e-5, 1e-3]}}, "trials": 2}},
     "tune.params.lr.loguniform: [1e-05, 0.001] is not valid; the study was launched with [0.0001, 0.001]"),
    ({"train": {"epochs": 3, "batch_size": 16}}, "train.epochs: 3 is not valid; the study was launched with 2"),
    ({"replicate": {"seeds": [1]}}, "replicate.seeds: [1] is not valid; the study was launched with [0, 1]"),
    ({"ablate": {"layer": [1], "pooling": "mean"}}, "ablate.layer: [1] is not valid; the study was launched with"),
    ({"ablate": {"layer": [1, 3], "pooling": "mean", "loss": ["cosent"]}}, "ablate.loss: ['cosent'] is not valid"),
])
def test_an_edited_study_resumes_only_when_the_change_extends_it(good, change, extends):
    from orchestrator.study.config import parse_study
    from orchestrator.study.edits import check_edit
    from trainables.errors import UserInputError

    stored, edited = parse_study(good), parse_study({**good, **change})
    if extends is True:
        assert check_edit(stored, edited)
    else:
        with pytest.raises(UserInputError) as error:
            check_edit(stored, edited)
        assert str(error.value).startswith(extends) and "restore it, or launch under a new name" in str(error.value)
