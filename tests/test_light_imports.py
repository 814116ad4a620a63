"""Reading a kind never imports torch: `validate` and `plan` check a study of every registered kind
from the kinds' declarations and the model's `config.json` alone (the learners, which need torch,
load only in trials), and the depth read from `config.json` is the one transformers would give."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from orchestrator.study.plan import MANAGED
from trainables.errors import UserInputError
from trainables.kinds import KINDS, get_kind
from trainables.models.encoder import encoder_depth, load_config
from trainables.models.files import model_depth, model_type

HEAVY = ("torch", "transformers", "sentence_transformers", "ray", "mlflow")
PROBE = f"""
import sys
from orchestrator.cli import app
sys.argv = ["orchestrator", *sys.argv[1:]]
try:
    app()
except SystemExit as exc:
    code = exc.code
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print("heavy:", heavy)
sys.exit(code or (3 if heavy else 0))
"""


def study_of(kind_name: str, model: str, data_dir, folder) -> str:
    example = get_kind(kind_name).example
    raw = {"name": f"light_{kind_name}", "trainable": kind_name, "model": model, "data_dir": str(data_dir),
           "train": {k: v for k, v in example.items() if k not in MANAGED},
           "data": {k: v for k, v in example.items() if k in ("max_train_samples", "max_eval_samples")},
           "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}
    path = folder / f"{kind_name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("name", list(KINDS))
def test_validate_and_plan_import_no_torch_for_any_kind(name, tiny_bert, synthetic_data_dir, tmp_path):
    study = study_of(name, tiny_bert, synthetic_data_dir, tmp_path)
    for command in ("validate", "plan"):
        done = subprocess.run([sys.executable, "-c", PROBE, command, study], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "heavy: []" in done.stdout


def test_the_depth_from_config_json_is_transformers_depth(tiny_bert, tmp_path):
    assert model_depth(tiny_bert) == encoder_depth(load_config(tiny_bert)) == 3
    assert model_type(tiny_bert) == "bert"
    distil = tmp_path / "distil"
    distil.mkdir()
    (distil / "config.json").write_text(json.dumps({"model_type": "distilbert", "n_layers": 4, "dim": 32}))
    assert model_depth(str(distil)) == encoder_depth(load_config(str(distil))) == 4
    # no depth key at all: transformers' own default for the architecture (BERT: 12)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert model_depth(str(bare)) == encoder_depth(load_config(str(bare))) == 12


def test_a_folder_without_a_readable_config_is_one_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserInputError, match="no config.json"):
        model_depth(str(empty))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(UserInputError, match="cannot be read"):
        model_depth(str(broken))


def test_an_unknown_hub_id_offline_names_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserInputError) as caught:
        model_depth("nobody/no-such-model-here")
    assert caught.value.key == "model" and caught.value.value == "nobody/no-such-model-here"
