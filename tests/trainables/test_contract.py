"""The contract every training kind passes through the one loop: same seed same numbers, another
seed other numbers, resume from any round to the uninterrupted numbers, test scored once with the
best-dev round's weights, and selection that never looks at test. Plus: a kind defined only in the
tests runs, validates and launches end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from orchestrator.testing.kind_contract import (
    KindContract,
    check_damaged_checkpoint,
    check_example,
    check_resume,
    check_same_seed_same_numbers,
    check_selection_ignores_test,
    check_test_scored_once,
    example_config,
    with_other_test,
)
from tests.toy_kind import ToyKind, ToyLearner
from trainables.contract import collect
from trainables.kinds import KINDS, get_kind, load_kind
from trainables.kinds.base import TrainingKind

TOY = "tests.toy_kind:ToyKind"
TRAINING_KINDS = [name for name in KINDS if isinstance(load_kind(KINDS[name]), TrainingKind)]


@pytest.mark.parametrize("name", list(KINDS))
def test_every_registered_kind_declares_an_example_that_parses_and_runs(name, tiny_bert, synthetic_data_dir,
                                                                        tmp_path):
    """A kind registered without an example fails here: the contract below runs each kind's own."""
    kind = get_kind(name)
    check_example(kind, example_config(kind, tiny_bert, synthetic_data_dir, tmp_path / "stages"))


@pytest.fixture()
def configs(tiny_bert, synthetic_data_dir, tmp_path) -> dict[str, tuple[str, dict]]:
    """Every registered training kind with its declared example (PyKEEN's MetaTestCase: a new kind is
    covered by construction), plus a pretraining stage and the kind defined only in the tests."""
    out = {name: (name, example_config(get_kind(name), tiny_bert, synthetic_data_dir, tmp_path / "stages"))
           for name in TRAINING_KINDS}
    out["finetune+mlm"] = ("finetune", {**out["finetune"][1], "layer": 1, "epochs": 2, "batch_size": 32,
                                        "max_train_samples": 96, "pretrain": "mlm", "pretrain_corpus": "task",
                                        "pretrain_steps": 3, "pretrain_batch_size": 8, "pretrain_max_seq_length": 16})
    out["toy"] = (TOY, {"seed": 3, **load_kind(TOY).example})
    return out


def kind_of(name: str):
    return load_kind(name) if ":" in name else get_kind(name)


CASES = [*TRAINING_KINDS, "finetune+mlm", "toy"]


@pytest.mark.parametrize("case", CASES)
def test_same_seed_same_numbers_other_seed_other_numbers(configs, case):
    name, config = configs[case]
    check_same_seed_same_numbers(kind_of(name), config)


@pytest.mark.parametrize("case", CASES)
def test_resume_from_the_first_round_reproduces_the_uninterrupted_run(configs, case, tmp_path):
    name, config = configs[case]
    check_resume(kind_of(name), config, tmp_path)


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_checkpoint_restarts_the_trial_to_the_uninterrupted_numbers(configs, case, tmp_path):
    """A checkpoint cut short (a crash or a full disk mid-write) is discarded like a deleted one: the
    trial starts again from round 1 and, seeded the same, reaches the same numbers; it used to fail
    for good with a SafetensorError."""
    name, config = configs[case]
    check_damaged_checkpoint(kind_of(name), config, tmp_path)


@pytest.mark.parametrize("case", CASES)
def test_test_is_scored_once_with_the_best_dev_rounds_weights(configs, case):
    name, config = configs[case]
    check_test_scored_once(kind_of(name), config)


@pytest.mark.parametrize("case", ["finetune", "distill"])
def test_selection_never_looks_at_test(configs, case, synthetic_data_dir, tmp_path):
    """The same train and dev with another test split: every dev number and the chosen round agree."""
    name, config = configs[case]
    other = with_other_test(synthetic_data_dir, tmp_path / "other-data")
    check_selection_ignores_test(kind_of(name), config, {**config, "data_dir": str(other)})


class TestTheKitsContractClassOnTheToyKind(KindContract):
    """`KindContract`, as a plugin's suite subclasses it, runs every check on a kind of its own."""

    @pytest.fixture()
    def kind(self):
        return load_kind(TOY)

    @pytest.fixture()
    def config(self):
        return {"seed": 3, **load_kind(TOY).example}


class BrokenResumeLearner(ToyLearner):
    """Forgets its weights on resume: the kit's resume check must fail on it."""

    def modules(self):
        return {}


class BrokenResumeKind(ToyKind):
    def build(self, cfg, device, dtype):
        return BrokenResumeLearner(cfg)


def test_the_kit_fails_a_kind_that_breaks_the_contract(tmp_path):
    config = {"seed": 3, **ToyKind.example}
    with pytest.raises(AssertionError, match="resumed from round 1: other numbers"):
        check_resume(BrokenResumeKind(), config, tmp_path / "resume")
    with pytest.raises(AssertionError, match="declares no example config"):
        example_config(type("NoExample", (ToyKind,), {"example": None})(), "m", "d", "c")


def test_a_kind_is_one_module_and_one_registry_line(monkeypatch, tiny_bert, synthetic_data_dir, tmp_path):
    from orchestrator.study.config import parse_study
    from orchestrator.study.plan import build_plan

    monkeypatch.setitem(KINDS, "toy", TOY)
    assert isinstance(get_kind("toy"), TrainingKind)
    study = parse_study({"name": "toy", "trainable": "toy", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
                         "ablate": {"lr": [0.1, 1.0]}, "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2},
                         "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}})
    plan = build_plan(study, tmp_path)
    assert plan.kind_path == TOY and plan.metric == "dev_spearman" and plan.epochs == 2
    assert [c.key for c in plan.cells] == ["lr=0.1", "lr=1.0"]


@pytest.mark.slow
def test_a_kind_defined_only_in_the_tests_launches_end_to_end(monkeypatch, tiny_bert, synthetic_data_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.run.launcher import launch

    monkeypatch.setitem(KINDS, "toy", TOY)
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({
        "name": "toy", "trainable": "toy", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
        "ablate": {"lr": [0.1, 1.0]}, "tune": None, "replicate": {"seeds": [0, 1]}, "train": {"epochs": 3},
        "resources": {"cpu": 1}, "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}))
    result = launch(path, storage=tmp_path / "studies", progress=False)
    assert result.finished and result.counts["completed"] == 4 and result.counts["failed"] == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("toy")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 4 and all(r.data.tags["epoch"] == "3" and "test_spearman" in r.data.metrics for r in runs)
    assert len({r.data.metrics["test_spearman"] for r in runs}) == 4  # seeds and lr change the toy's numbers
    # and a report, from the study record alone: no line of the reports knows the toy kind
    from reports.build import build_report
    from reports.collect import collect

    runs = collect(f"sqlite:///{tmp_path / 'mlflow.db'}", "toy")
    assert runs.record.kind.path == TOY and runs.record.kind.round_name == "epoch"
    written = {p.name for p in build_report(runs, tmp_path / "report")}
    assert {"report.md", "ablation.tex", "cells.csv", "runs.csv"} <= written
    assert "| LR 0.1 | LR 1.0 |" in (tmp_path / "report" / "report.md").read_text()  # the axis, labelled


def test_constant_embeddings_are_degenerate_rounds_never_selected_and_never_not_finished(configs):
    """Layer 0 with CLS pooling gives every sentence the same vector: correlations are undefined."""
    _, config = configs["finetune"]
    reports = []
    final = get_kind("finetune").run({**config, "layer": 0, "pooling": "cls", "epochs": 2}, collect(reports))
    assert [r["degenerate"] for r in reports] == [1, 1]
    assert all(r["best_epoch"] == 0 and r["best_dev_spearman"] is None for r in reports)
    # no round had a dev score, so no weights were selected: test is not scored with arbitrary (the last) ones
    assert final["test_degenerate"] == 1 and final["test_epoch"] == 0
    assert not any(key.startswith("test_") and key not in ("test_degenerate", "test_epoch") for key in final)

    import pandas as pd

    from reports.aggregate import _why_missing

    runs = pd.DataFrame({"outcome": ["completed", "completed"], "degenerate": [1, 1], "test_degenerate": [1, 1],
                         "error": [None, None]})
    assert _why_missing(runs).startswith("degenerate")
    assert _why_missing(runs.assign(outcome=["running", "running"])) == "not finished"


@pytest.mark.parametrize("case", ["finetune", "contrastive", "distill"])
def test_a_saved_model_loads_in_sentence_transformers_and_scores_the_runs_test(configs, case, synthetic_data_dir,
                                                                                 tmp_path):
    """On any machine. It failed on CPUs with AVX512-BF16 for two reasons: precision auto trained and
    scored under bf16 autocast there; and the contrastive example's CLS vectors had collapsed (every
    cosine within 3e-5), so its Spearman ranked rounding noise. Scoring is fp32 now, the example
    pools by mean (a collapsed split is now scored in float64 and flagged, see test_evaluation)."""
    import pandas as pd
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    name, config = configs[case]
    if case == "finetune":
        config = {**config, "projection_dim": 16, "pooling": "max"}
    saved = {}

    def keep(metrics, checkpoint_dir=None):
        if (Path(checkpoint_dir) / "model").exists():
            saved["model"] = shutil.copytree(Path(checkpoint_dir) / "model", tmp_path / "model")
            saved["predictions"] = pd.read_csv(Path(checkpoint_dir) / "test_predictions.csv")

    # trained under bf16 autocast (where `auto` puts it on CUDA and AVX512-BF16/AMX CPUs), scored in fp32 by
    # default: scored under autocast, the run's test differed from the saved model's by 0.13-0.31 points
    final = kind_of(name).run({**config, "export_model": True, "precision": "bf16"}, keep)
    model = SentenceTransformer(str(saved["model"]), device="cpu")
    lines = [line.split("\t") for line in (synthetic_data_dir / "stsb" / "sts-test.csv").read_text().splitlines()]
    test = pd.DataFrame({"score": [float(r[4]) for r in lines], "a": [r[5] for r in lines], "b": [r[6] for r in lines]})
    a, b = model.encode(list(test.a), convert_to_tensor=True), model.encode(list(test.b), convert_to_tensor=True)
    cosines = torch.nn.functional.cosine_similarity(a, b).numpy()
    # the same vectors, to what fp32 on any CPU gives (sentence-transformers' SDPA against the evaluator's
    # attention); not the same Spearman to a fixed tolerance: a tiny random model's cosines lie close
    # together, so rounding reorders some of them (0.054 points on an AMD EPYC without AVX-512)
    predictions = saved["predictions"]
    assert len(predictions) == len(test)
    np.testing.assert_allclose(cosines, predictions["prediction"], atol=1e-4, rtol=0)
    assert 100 * spearmanr(predictions["prediction"], test.score).statistic == pytest.approx(final["test_spearman"],
                                                                                               abs=1e-6)
