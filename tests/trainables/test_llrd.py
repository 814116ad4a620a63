"""Layer-wise learning-rate decay (`train.layer_lr_decay`): every parameter's lr against ELECTRA's
reference, written out here from google-research/electra `model/optimization.py` (`_get_layer_lrs`,
commit 8a46635) for the cut model; off at 1.0; scheduled per group; refused when out of (0, 1]."""

from __future__ import annotations

import collections
import re

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from trainables.kinds.finetune import FinetuneConfig
from trainables.kinds.finetune.learner import FinetuneLearner
from trainables.models.encoder import build_sentence_encoder
from trainables.objectives import build_loss
from trainables.runtime import linear_schedule
from trainables.training.bi_encoder import build_optimizer, layer_lr_scales

LR, DECAY = 1e-4, 0.8


def electra_layer_lrs(learning_rate: float, layer_decay: float, n_layers: int) -> dict[str, float]:
    """`_get_layer_lrs` as the reference writes it (TF variable-name keys, matched by substring)."""
    key_to_depths = collections.OrderedDict({"/embeddings/": 0, "/embeddings_project/": 0,
                                             "task_specific/": n_layers + 2})
    for layer in range(n_layers):
        key_to_depths["encoder/layer_" + str(layer) + "/"] = layer + 1
    return {key: learning_rate * (layer_decay ** (n_layers + 2 - depth)) for key, depth in key_to_depths.items()}


def tf_name(name: str) -> str:
    """Our parameter name as ELECTRA's variable would be called: the encoder under `electra/`, BERT's blocks
    as `encoder/layer_i/`; what sits on top (projection, loss module, the pooler the sentence vectors never
    read, which the reference has no weights for) under `task_specific/`."""
    if name.startswith("encoder.") and not name.startswith("encoder.pooler."):
        path = name.removeprefix("encoder.").replace(".", "/")
        return "electra/" + re.sub(r"^encoder/layer/(\d+)/", r"encoder/layer_\1/", path)
    return "task_specific/" + name.replace(".", "/")


def electra_lr(name: str, n_layers: int) -> float:
    """The lr ELECTRA's `apply_gradients` gives the variable: the one key its name contains."""
    hits = [lr for key, lr in electra_layer_lrs(LR, DECAY, n_layers).items() if key in tf_name(name)]
    assert len(hits) == 1, (name, tf_name(name))
    return hits[0]


def model_and_head(path: str, layer: int | None, projection_dim: int | None):
    model = build_sentence_encoder(path, layer, "mean", projection_dim)
    dim = projection_dim or model.encoder.config.hidden_size
    head = build_loss("softmax", "classification", dim)  # a classifier on (u, v, |u-v|): the task head
    return model, [*model.named_parameters(), *((f"loss.{n}", p) for n, p in head.named_parameters())]


def lr_by_name(optimizer, params, key: str = "lr") -> dict[str, tuple[float, float]]:
    """Each parameter's (lr, weight decay); `initial_lr` is the lr before a schedule's factor."""
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    assert len(group_of) == len(params)  # every parameter in exactly one group
    return {name: (group_of[id(p)][key], group_of[id(p)]["weight_decay"]) for name, p in params}


@pytest.mark.parametrize(("layer", "blocks"), [(2, 2), (None, 3)])
@pytest.mark.parametrize("projection_dim", [None, 8])
def test_every_parameters_lr_is_electras_for_the_cut_model(tiny_bert, layer, blocks, projection_dim):
    model, params = model_and_head(tiny_bert, layer, projection_dim)
    optimizer = build_optimizer(params, LR, 0.01, layer_lr_scales(model, DECAY))
    got = lr_by_name(optimizer, params)
    for name, p in params:
        assert got[name] == (electra_lr(name, blocks), 0.01 if p.ndim >= 2 else 0.0), name
    # the numbers, spelled out: embeddings at lr * 0.8^(n+2), block i (from 0) at lr * 0.8^(n+1-i), so the
    # last block at lr * 0.8^2 (the reference leaves depth n + 1 unused), the head at lr
    assert got["encoder.embeddings.word_embeddings.weight"][0] == pytest.approx(LR * DECAY ** (blocks + 2))
    assert got["encoder.encoder.layer.0.attention.self.query.weight"][0] == pytest.approx(LR * DECAY ** (blocks + 1))
    assert got[f"encoder.encoder.layer.{blocks - 1}.output.LayerNorm.weight"][0] == pytest.approx(LR * DECAY ** 2)
    assert got["loss.classifier.weight"][0] == LR
    assert len(optimizer.param_groups) == 2 * (blocks + 2)  # (embeddings, blocks, head) x (decay, no decay)
    lrs = [group["lr"] for group in optimizer.param_groups]
    assert lrs == sorted(lrs)


def test_decay_one_gives_todays_groups(tiny_bert):
    model, params = model_and_head(tiny_bert, 2, 8)
    assert set(layer_lr_scales(model, 1.0).values()) == {1.0}

    def groups(optimizer):
        return [([id(p) for p in g["params"]], g["lr"], g["weight_decay"]) for g in optimizer.param_groups]

    today = build_optimizer(params, LR, 0.01)
    assert groups(build_optimizer(params, LR, 0.01, layer_lr_scales(model, 1.0))) == groups(today)
    assert len(today.param_groups) == 2 and {g["lr"] for g in today.param_groups} == {LR}


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir) -> dict:
    return {"model": tiny_bert, "task": "mrpc", "loss": "softmax", "layer": 2, "epochs": 2, "lr": LR,
            "batch_size": 16, "projection_dim": 8, "data_dir": str(synthetic_data_dir), "precision": "fp32",
            "device": "cpu", "seed": 7}


def test_the_learner_builds_electras_groups_and_the_schedule_scales_each_alike(config):
    learner = FinetuneLearner(FinetuneConfig(**config, layer_lr_decay=DECAY), torch.device("cpu"), torch.float32)
    params = [*learner.model.named_parameters(), *((f"loss.{n}", p) for n, p in learner.loss_fn.named_parameters())]
    start = lr_by_name(learner.optimizer, params, "initial_lr")  # the schedule's warmup starts the lr at 0
    assert {name: lr for name, (lr, _) in start.items()} == {name: electra_lr(name, 2) for name, _ in params}
    assert learner.train_round(1)["train_loss"] > 0
    steps = -(-len(learner.lengths) // 16)  # one epoch of batches of 16
    total, warmup = 2 * steps, round(0.1 * 2 * steps)
    factor = (total - steps) / (total - warmup)  # transformers' linear decay, past the warmup
    assert learner.scheduler.last_epoch == steps > warmup
    for group in learner.optimizer.param_groups:  # ELECTRA: one warmup/decay factor times each layer's lr
        assert group["lr"] == pytest.approx(group["initial_lr"] * factor, rel=1e-12)
    ratios = {round(group["lr"] / group["initial_lr"], 12) for group in learner.optimizer.param_groups}
    assert len(ratios) == 1
    off = FinetuneLearner(FinetuneConfig(**config), torch.device("cpu"), torch.float32)
    assert len(off.optimizer.param_groups) == 2 and {g["initial_lr"] for g in off.optimizer.param_groups} == {LR}


def test_the_schedule_keeps_the_groups_proportional(tiny_bert):
    model, params = model_and_head(tiny_bert, 2, None)
    optimizer = build_optimizer(params, LR, 0.01, layer_lr_scales(model, DECAY))
    initial = [group["lr"] for group in optimizer.param_groups]
    scheduler = linear_schedule(optimizer, 2, 10)
    assert [group["initial_lr"] for group in optimizer.param_groups] == initial
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    factor = (10 - 5) / (10 - 2)  # transformers' linear decay after a warmup of 2 of 10 steps
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([lr * factor for lr in initial])


runner = CliRunner()


@pytest.fixture()
def study(tiny_bert, synthetic_data_dir) -> dict:
    return {"name": "s", "trainable": "finetune", "task": "stsb", "model": tiny_bert,
            "ablate": {"layer": [1, 3], "layer_lr_decay": [1.0, 0.8]}, "replicate": {"seeds": [0]},
            "train": {"epochs": 2, "batch_size": 16}, "data_dir": str(synthetic_data_dir),
            "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}


def validate(study: dict, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return runner.invoke(app, ["validate", str(path)])


def test_layer_lr_decay_is_an_axis_and_a_tuned_parameter(study, tmp_path, monkeypatch):
    result = validate(study, tmp_path, monkeypatch)
    assert result.exit_code == 0 and "4 cells" in result.stdout, result.output
    tuned = {**study, "tune": {"params": {"layer_lr_decay": {"uniform": [0.7, 1.0]}}, "trials": 2}}
    tuned["ablate"] = {"layer": [1, 3]}
    result = validate(tuned, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("value", "message"), [
    (0, "train.layer_lr_decay: 0 is not valid; input should be greater than 0"),
    (1.5, "train.layer_lr_decay: 1.5 is not valid; input should be less than or equal to 1"),
    ("x", "train.layer_lr_decay: 'x' is not valid; input should be a valid number"),
])
def test_a_bad_layer_lr_decay_is_one_line_and_exit_2(study, tmp_path, monkeypatch, value, message):
    study = {**study, "ablate": {"layer": [1, 3]}, "train": {**study["train"], "layer_lr_decay": value}}
    result = validate(study, tmp_path, monkeypatch)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
