from __future__ import annotations

import pytest
import torch

from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.evaluation.evaluators import Embedder, STSEvaluator
from trainables.evaluation.probe import probe_layers
from trainables.kinds import get_kind
from trainables.kinds.probe import ProbeConfig
from trainables.models.batching import TokenCache
from trainables.models.encoder import build_sentence_encoder, load_tokenizer


def test_every_layer_is_scored_like_the_model_cut_there(tiny_bert, synthetic_data_dir):
    rows = probe_layers(ProbeConfig(model=tiny_bert, data_dir=str(synthetic_data_dir), splits=["dev"],
                                    precision="fp32", device="cpu"))
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    assert [r["params"] for r in rows] == sorted(r["params"] for r in rows)
    from trainables.data.tasks import load_task

    dev = load_task("stsb", None, synthetic_data_dir).dev
    for k in (0, 2):
        model = build_sentence_encoder(tiny_bert, layer=k).eval()
        alone = STSEvaluator({"dev": dev}).evaluate(
            Embedder(model, TokenCache(load_tokenizer(tiny_bert), 128), torch.device("cpu")), "dev")
        assert rows[k]["dev_spearman"] == pytest.approx(alone["dev_spearman"], abs=1e-3)


def test_probe_trainable_reports_the_dev_selected_layer(tiny_bert, synthetic_data_dir):
    reports = []
    metrics = get_kind("probe").run({"model": tiny_bert, "data_dir": str(synthetic_data_dir), "layers": [1, 3]},
                                    collect(reports))
    assert len(reports) == 1
    best = metrics["best_layer"]
    assert best in (1, 3)
    assert metrics["dev_spearman"] == max(metrics["layer1_dev_spearman"], metrics["layer3_dev_spearman"])
    assert metrics["test_spearman"] == metrics[f"layer{best}_test_spearman"]


def test_layers_outside_the_model_are_refused(tiny_bert, synthetic_data_dir):
    with pytest.raises(UserInputError, match=r"layers: \[0, 7\] is not valid; this model has 3 layers: use values "
                                             r"in 0\.\.3"):
        probe_layers(ProbeConfig(model=tiny_bert, data_dir=str(synthetic_data_dir), layers=[0, 7]))


@pytest.mark.slow
def test_minilm_zero_shot_profile_matches_the_published_figure(data_dir, minilm_path):
    rows = probe_layers(ProbeConfig(model="sentence-transformers/all-MiniLM-L6-v2", data_dir=str(data_dir),
                                    splits=["test"]))
    assert len(rows) == 7
    assert 81.7 <= rows[6]["test_spearman"] <= 82.1  # SBERT reports about 82 for this model
    assert rows[6]["test_spearman"] == max(r["test_spearman"] for r in rows)
    assert rows[0]["params"] < rows[6]["params"] == 22_565_376  # all of MiniLM but its unused pooler
