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


def test_probe_scores_in_fp32_by_default_even_where_bf16_is_fast(tiny_bert, synthetic_data_dir, monkeypatch):
    """Like every training kind's scoring: on bf16 hardware `auto` would score under bf16 autocast
    (here pretended: the CPU is said to have AMX), which moves the numbers."""
    from trainables import runtime

    monkeypatch.setattr(runtime, "_cpu_has_fast_bf16", lambda: True)
    config = {"model": tiny_bert, "data_dir": str(synthetic_data_dir), "splits": ["dev"], "layers": [2, 3],
              "device": "cpu"}
    default = probe_layers(ProbeConfig(**config))
    fp32 = probe_layers(ProbeConfig(**config, precision="fp32"))
    auto = probe_layers(ProbeConfig(**config, precision="auto"))
    assert [r["dev_spearman"] for r in default] == [r["dev_spearman"] for r in fp32]
    assert [r["dev_spearman"] for r in default] != [r["dev_spearman"] for r in auto]


def test_a_constant_layer_is_never_the_selected_one(tiny_bert, synthetic_data_dir):
    """Layer 0 with CLS pooling has no score (NaN); `max` over a list starting with NaN kept the NaN."""
    metrics = get_kind("probe").run({"model": tiny_bert, "data_dir": str(synthetic_data_dir), "layers": [0, 2],
                                     "pooling": "cls"}, collect([]))
    assert metrics["best_layer"] == 2 and metrics["layer0_dev_cosine_spread"] == 0.0


@pytest.mark.slow
def test_minilm_cls_layers_collapse_but_rank_pairs_as_a_float64_model_does(data_dir, minilm_path):
    """MiniLM's CLS vectors at layers 1-3 lie within 1e-4 in cosine of each other (a collapsed encoder)
    and still rank STS-B's test pairs: the fp32 probe (float64 cosines) scores them as a float64 model
    does, within 0.1 point here (float32 cosines gave 29.3 against 39.0 at layer 3). Layer 0's CLS
    is one vector for every sentence: no correlation. ~25 s."""
    import numpy as np
    from scipy.stats import spearmanr
    from transformers import AutoModel, AutoTokenizer

    from trainables.data.tasks import load_task

    rows = probe_layers(ProbeConfig(model="sentence-transformers/all-MiniLM-L6-v2", data_dir=str(data_dir),
                                    splits=["test"], layers=[0, 1, 2, 3], pooling="cls"))
    assert np.isnan(rows[0]["test_spearman"]) and rows[0]["test_cosine_spread"] == 0.0
    test = load_task("stsb", None, data_dir).test
    sentences = list(dict.fromkeys(list(test.sentence1) + list(test.sentence2)))
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    model = AutoModel.from_pretrained(minilm_path, num_hidden_layers=3).double().eval()
    cls = {}
    with torch.inference_mode():
        for start in range(0, len(sentences), 128):
            batch = sentences[start:start + 128]
            states = model(**tokenizer(batch, padding=True, truncation=True, max_length=128, return_tensors="pt"),
                           output_hidden_states=True).hidden_states
            cls.update({s: [states[k][i, 0] for k in (1, 2, 3)] for i, s in enumerate(batch)})
    for k in (1, 2, 3):
        first = torch.nn.functional.normalize(torch.stack([cls[s][k - 1] for s in test.sentence1]), dim=-1)
        second = torch.nn.functional.normalize(torch.stack([cls[s][k - 1] for s in test.sentence2]), dim=-1)
        cosines = (first * second).sum(-1).numpy()
        float64 = 100 * spearmanr(cosines, test.score).statistic
        assert 0 < rows[k]["test_cosine_spread"] < 1e-4 and np.ptp(cosines) < 1e-4  # collapsed, and flagged
        assert abs(rows[k]["test_spearman"] - float64) < 1.0 and float64 > 20  # real ranking, as in float64


def test_every_layer_comes_from_one_forward_pass_per_chunk(tiny_bert, synthetic_data_dir, monkeypatch):
    """The probe's speed: each distinct sentence of the splits goes through the encoder once, in the
    evaluator's chunks, and that one pass scores every layer (a probe that re-encoded per layer
    would run 4x the forwards here); the encoder is cut after the deepest layer asked for."""
    from trainables.data.tasks import load_task
    from trainables.evaluation import probe
    from trainables.models.batching import EVAL_TOKENS_PER_CHUNK, padding_chunks
    from trainables.models.encoder import encoder_layers

    rows_seen, encoders = [], []

    def counted(name, *args, **kwargs):
        encoder = load_encoder(name, *args, **kwargs)
        encoder.embeddings.register_forward_hook(lambda module, inputs, output: rows_seen.append(output.shape[0]))
        encoders.append(encoder)
        return encoder

    load_encoder = probe.load_encoder
    monkeypatch.setattr(probe, "load_encoder", counted)
    config = ProbeConfig(model=tiny_bert, data_dir=str(synthetic_data_dir), precision="fp32", device="cpu")
    rows = probe_layers(config)
    assert [r["layer"] for r in rows] == [0, 1, 2, 3] and all("test_spearman" in r for r in rows)
    data = load_task("stsb", None, synthetic_data_dir)
    distinct = list(dict.fromkeys(s for split in (data.dev, data.test) for column in ("sentence1", "sentence2")
                                  for s in split[column]))
    tokens = TokenCache(load_tokenizer(tiny_bert), 128)
    chunks = padding_chunks([len(ids) for ids in tokens.lookup(distinct)], EVAL_TOKENS_PER_CHUNK, 256)
    assert len(rows_seen) == len(chunks) and sum(rows_seen) == len(distinct)

    rows_seen.clear()
    probe_layers(ProbeConfig(model=tiny_bert, data_dir=str(synthetic_data_dir), layers=[1], device="cpu"))
    assert len(encoder_layers(encoders[-1])) == 1 and sum(rows_seen) == len(distinct)
