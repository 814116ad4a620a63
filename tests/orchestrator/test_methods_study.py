"""A study that mixes the layer-wise methods' axes (multi-layer pooling, post-processing, layer-wise learning-rate
decay) launches on a local Ray, reports each cell and verifies, as issue 53 asks of its methods together."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.orchestrator.test_launch import run_cli, write_study

pytestmark = pytest.mark.slow


def test_a_study_mixing_three_method_axes_launches_reports_and_verifies(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir,
                        ablate={"pooling_layers": ["last", "first_last"], "postprocess": ["none", "zscore"],
                                "layer_lr_decay": [1.0, 0.8]},
                        tune=None, replicate={"seeds": [0]},
                        train={"layer": 2, "epochs": 1, "batch_size": 16, "max_seq_length": 16, "lr": 1e-3},
                        data={"max_train_samples": 64, "max_eval_samples": 40})
    storage = str(tmp_path / "studies")
    assert run_cli("validate", str(study), cwd=tmp_path).returncode == 0
    launched = run_cli("launch", str(study), "--storage", storage, cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "finished: 8 completed" in launched.stdout, launched.stdout[-2000:]
    runs = pd.read_csv(tmp_path / "reports" / "e2e" / "runs.csv")
    replicates = runs[runs.phase == "replicate"]
    assert len(replicates) == 8
    assert set(replicates.pooling_layers.astype(str)) == {"last", "first_last"}
    assert set(replicates.postprocess) == {"none", "zscore"} and set(replicates.layer_lr_decay) == {1.0, 0.8}
    by_cell = replicates.set_index(["pooling_layers", "postprocess", "layer_lr_decay"]).test_spearman
    assert by_cell["first_last", "none", 1.0] != pytest.approx(by_cell["last", "none", 1.0], abs=1e-6)
    assert by_cell["last", "zscore", 1.0] != pytest.approx(by_cell["last", "none", 1.0], abs=1e-6)
    assert by_cell["last", "none", 0.8] != pytest.approx(by_cell["last", "none", 1.0], abs=1e-6)
    report = (tmp_path / "reports" / "e2e" / "report.md").read_text()
    assert "first_last" in report or "First last" in report or "first-last" in report.lower(), report[:2000]
    verified = run_cli("verify", str(tmp_path / "reports" / "e2e"), cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr


def test_a_study_ablating_adaptive_layers_reports_every_layer_of_the_one_training_and_verifies(tiny_bert, data_dir,
                                                                                             tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"adaptive_layers": [False, True]},
                        tune=None, replicate={"seeds": [0, 1]}, report={"baseline": {"adaptive_layers": False}},
                        train={"layer": 3, "epochs": 1, "batch_size": 16, "max_seq_length": 16, "lr": 1e-3},
                        data={"max_train_samples": 64, "max_eval_samples": 40})
    launched = run_cli("launch", str(study), "--storage", str(tmp_path / "studies"), cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "finished: 4 completed" in launched.stdout, launched.stdout[-2000:]
    runs = pd.read_csv(tmp_path / "reports" / "e2e" / "runs.csv")
    adaptive = runs[(runs.phase == "replicate") & runs.adaptive_layers.astype(bool)]
    assert len(adaptive) == 2 and adaptive[[f"layer{j}_test_spearman" for j in range(4)]].notna().all().all()
    assert (adaptive.layer3_test_spearman - adaptive.test_spearman).abs().max() < 1e-9  # layer k: the trial's own
    layers = (tmp_path / "reports" / "e2e" / "layers.tex").read_text()
    assert "layer 0" in layers and "layer 3" in layers
    report = (tmp_path / "reports" / "e2e" / "report.md").read_text()
    assert "Every layer of one training" in report
    verified = run_cli("verify", str(tmp_path / "reports" / "e2e"), cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr


def test_a_2d_matryoshka_study_reports_every_layer_and_size_of_the_one_training_and_verifies(tiny_bert, data_dir,
                                                                                              tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"matryoshka_dims": [None, [32, 8]]},
                        tune=None, replicate={"seeds": [0]},
                        train={"layer": 2, "epochs": 1, "batch_size": 16, "max_seq_length": 16, "lr": 1e-3,
                               "adaptive_layers": True},
                        data={"max_train_samples": 64, "max_eval_samples": 40})
    assert run_cli("validate", str(study), cwd=tmp_path).returncode == 0
    launched = run_cli("launch", str(study), "--storage", str(tmp_path / "studies"), cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "finished: 2 completed" in launched.stdout, launched.stdout[-2000:]
    runs = pd.read_csv(tmp_path / "reports" / "e2e" / "runs.csv")
    both = runs[(runs.phase == "replicate") & runs.matryoshka_dims.notna()]
    assert len(both) == 1
    assert both[[f"layer{j}_dim{d}_test_spearman" for j in range(3) for d in (32, 8)]].notna().all().all()
    assert (both.layer2_dim32_test_spearman - both.test_spearman).abs().max() < 1e-9  # the trial's own
    report = (tmp_path / "reports" / "e2e" / "report.md").read_text()
    assert "Every layer and size of one training (2D Matryoshka)" in report
    assert "| [32, 8], layer 0 |" in report and "| d = 32 | d = 8 |" in report
    assert (tmp_path / "reports" / "e2e" / "layer_sizes.tex").is_file()
    verified = run_cli("verify", str(tmp_path / "reports" / "e2e"), cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr
