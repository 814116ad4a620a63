from __future__ import annotations

import shutil

import pandas as pd
import pytest
from scipy.stats import spearmanr

from trainables.contract import collect
from trainables.errors import TrainingDivergedError, UserInputError
from trainables.kinds import get_kind
from trainables.objectives.sts import CosineMSELoss

finetune = get_kind("finetune")


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir):
    return {"model": tiny_bert, "task": "stsb", "layer": 2, "epochs": 3, "lr": 1e-3, "batch_size": 16,
            "data_dir": str(synthetic_data_dir), "precision": "fp32", "device": "cpu", "seed": 7}


def test_reports_every_epoch_and_scores_test_once_with_the_best_dev_epoch(config):
    reports = []
    final = finetune.run(config, collect(reports))
    assert [r["epoch"] for r in reports] == [1, 2, 3]
    assert all("test_spearman" not in r for r in reports[:-1])
    dev = [r["dev_spearman"] for r in reports]
    assert final["test_epoch"] == final["best_epoch"] == 1 + dev.index(max(dev))
    assert final["best_dev_spearman"] == max(dev)
    assert reports[-1]["train_loss"] < reports[0]["train_loss"]
    assert dev[-1] > 40  # word overlap is learnable: a random tiny encoder starts far lower
    assert final["params"] < 1_100_000


def test_same_seed_same_numbers_and_other_seed_other_numbers(config):
    a, b, c = [], [], []
    finetune.run(config, collect(a))
    finetune.run(config, collect(b))
    finetune.run({**config, "seed": 8}, collect(c))
    strip = lambda rows: [{k: v for k, v in r.items() if "second" not in k} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    assert a[-1]["dev_spearman"] != c[-1]["dev_spearman"]


def test_resume_from_a_checkpoint_reproduces_the_uninterrupted_run(config, tmp_path):
    uninterrupted, saved = [], []

    def report(metrics, checkpoint_dir=None):
        uninterrupted.append(metrics)
        target = tmp_path / f"epoch{metrics['epoch']}"
        shutil.copytree(checkpoint_dir, target)
        saved.append(target)

    finetune.run(config, report)
    assert sorted(p.name for p in saved[0].iterdir()) == ["model.safetensors", "optimizer.safetensors",
                                                          "trainer_state.json"]
    predictions = pd.read_csv(saved[-1] / "test_predictions.csv")
    assert list(predictions.columns) == ["pair", "prediction", "score"] and len(predictions) == 80
    rho = 100 * spearmanr(predictions.prediction, predictions.score).statistic
    assert rho == pytest.approx(uninterrupted[-1]["test_spearman"], abs=1e-6)
    resumed = []
    finetune.run(config, collect(resumed), checkpoint_dir=str(saved[0]))
    assert [r["epoch"] for r in resumed] == [2, 3]
    for ours, theirs in zip(resumed, uninterrupted[1:], strict=True):
        for key in ("train_loss", "dev_spearman", "best_epoch"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-6)
    assert resumed[-1]["test_spearman"] == pytest.approx(uninterrupted[-1]["test_spearman"], abs=1e-6)


def test_a_nan_loss_ends_the_trial_as_diverged(config, monkeypatch):
    monkeypatch.setattr(CosineMSELoss, "forward", lambda self, u, v, t: (u * float("nan")).sum())
    with pytest.raises(TrainingDivergedError, match=r"loss became nan at epoch 1, step 1 \(lr=0.001\)"):
        finetune.run(config, collect([]))


@pytest.mark.parametrize("loss", ["softmax", "cosine_bce"])
def test_pair_classification_reports_accuracy_and_f1(config, loss):
    reports = []
    final = finetune.run({**config, "task": "mrpc", "loss": loss, "epochs": 2}, collect(reports))
    assert {"dev_accuracy", "dev_f1", "test_accuracy", "test_f1"} <= set(final)
    assert final["best_dev_accuracy"] == max(r["dev_accuracy"] for r in reports)
    assert reports[-1]["train_loss"] < reports[0]["train_loss"]
    chosen = reports[final["best_epoch"] - 1]
    assert final["test_threshold"] == chosen["dev_threshold"]  # test reuses the dev-tuned threshold
    by_f1 = []
    finetune.run({**config, "task": "mrpc", "loss": loss, "epochs": 2, "select": "f1"}, collect(by_f1))
    assert by_f1[-1]["best_dev_f1"] == max(r["dev_f1"] for r in by_f1)
    assert by_f1[-1]["test_epoch"] == 1 + [r["dev_f1"] for r in by_f1].index(max(r["dev_f1"] for r in by_f1))


@pytest.mark.parametrize(("pooling", "extra"), [("cls", {}), ("max", {"projection_dim": 16}),
                                                ("mean_sqrt_len", {"loss": "cosent"}), ("mean", {"loss": "angle"}),
                                                ("mean", {"random_init": True, "layer": 0})])
def test_poolings_objectives_and_baselines_train(config, pooling, extra):
    reports = []
    finetune.run({**config, "pooling": pooling, "epochs": 2, **extra}, collect(reports))
    assert reports[1]["train_loss"] < reports[0]["train_loss"]  # each objective and pooling learns
    assert reports[1]["dev_spearman"] != reports[0]["dev_spearman"]


@pytest.mark.parametrize(("change", "message"), [
    ({"lr": -1}, "lr: -1 is not valid; input should be greater than 0"),
    ({"epochs": 0}, "epochs: 0 is not valid; input should be greater than or equal to 1"),
    ({"learning_rate": 1e-3},
     "learning_rate: 0.001 is not valid; unknown key; valid keys are: adaptive_kl_temperature, adaptive_kl_weight"),
    ({"layer": 9}, "layer: 9 is not valid; this model has 3 layers: use 0..3"),
    ({"pooling": "sum"}, "pooling: 'sum' is not valid; use one of: cls, last_token, max, mean, mean_sqrt_len"),
    ({"task": "mrpc"}, "train.loss: 'cosine_mse' is not valid; it trains sts tasks"),
    ({"precision": "fp16"}, "precision: 'fp16' is not valid; use one of: auto, bf16, fp32"),
])
def test_bad_configs_are_one_clear_line(config, change, message):
    with pytest.raises(UserInputError) as error:
        finetune.run({**config, **change}, collect([]))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_bf16_autocast_path_runs_on_cpu_close_to_fp32(config):
    common = {**config, "epochs": 1, "max_train_samples": 32, "max_eval_samples": 16}
    bf16 = finetune.run({**common, "precision": "bf16"}, collect([]))
    fp32 = finetune.run(common, collect([]))
    assert bf16["train_loss"] == pytest.approx(fp32["train_loss"], rel=0.05)  # bf16 rounding, the same training
    assert bf16["test_spearman"] == pytest.approx(fp32["test_spearman"], abs=5)
    assert bf16["train_loss"] != fp32["train_loss"]  # it did run in bf16


@pytest.mark.slow
def test_short_finetune_of_minilm_improves_dev_over_the_untrained_truncated_model(data_dir, minilm_path):
    from trainables.evaluation.probe import probe_layers
    from trainables.kinds.probe import ProbeConfig

    common = {"model": "sentence-transformers/all-MiniLM-L6-v2", "task": "stsb", "data_dir": str(data_dir),
              "max_eval_samples": 300}
    before = probe_layers(ProbeConfig(**common, layers=[2], splits=["dev"]))[0]["dev_spearman"]
    final = finetune.run({**common, "layer": 2, "epochs": 2, "lr": 1e-4, "max_train_samples": 500,
                          "precision": "fp32"}, collect([]))
    assert final["best_dev_spearman"] > before + 1.0
    assert final["params"] < 0.8 * 22_713_216  # two of six layers: well under the full model
