from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import pearsonr, spearmanr

from trainables.evaluation.evaluators import (
    Embedder,
    PairClassificationEvaluator,
    STSEvaluator,
    best_accuracy_threshold,
    best_f1_threshold,
    pair_cosines,
)
from trainables.models.batching import TokenCache
from trainables.models.encoder import build_sentence_encoder, load_tokenizer

VECTORS = {"a": [1.0, 0.0], "b": [0.8, 0.6], "c": [0.0, 1.0], "d": [-1.0, 0.1], "e": [0.6, 0.8]}


def lookup(sentences):
    return torch.tensor([VECTORS[s] for s in sentences])


@pytest.mark.parametrize(("spread", "scored", "flagged"), [(0.0, False, True), (1e-16, False, True),
                                                       (1e-9, True, True), (3e-5, True, True), (9e-5, True, True),
                                                       (2e-4, True, False), (0.3, True, False)])
def test_only_a_constant_output_has_no_correlation_and_a_collapsed_one_is_scored_and_flagged(spread, scored,
                                                                                             flagged):
    """Cosines that rise with the gold score but lie `spread` apart. MiniLM's CLS at layers 1-3 has a
    spread of 2e-6 to 1.5e-5 and ranks STS-B pairs for real (a float64 model gives the same Spearman),
    so such a split is scored, with `dev_cosine_spread` for the report's mark; only an exactly constant
    output (or one float64 cannot resolve) is degenerate: NaN, never selected."""
    frame = pd.DataFrame({"sentence1": ["a"] * 6, "sentence2": [f"s{i}" for i in range(6)],
                          "score": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]})
    cosines = 1.0 - spread + np.linspace(0.0, 1.0, 6) * spread  # rising with the gold score, `spread` apart

    def embed(sentences):  # unit vectors whose cosine with "a" is the wanted one (float64: exact)
        rows = [[1.0, 0.0] if s == "a" else [cosines[int(s[1:])], np.sqrt(1 - cosines[int(s[1:])] ** 2)]
                for s in sentences]
        return torch.tensor(rows, dtype=torch.float64)

    metrics = STSEvaluator({"dev": frame}).evaluate(embed, "dev")
    if scored:
        assert metrics["dev_spearman"] == pytest.approx(100.0) and metrics["dev_pearson"] == pytest.approx(100.0)
    else:
        assert np.isnan(metrics["dev_spearman"]) and np.isnan(metrics["dev_pearson"])
    assert ("dev_cosine_spread" in metrics) == flagged
    if flagged:
        assert metrics["dev_cosine_spread"] == pytest.approx(spread, rel=1e-3, abs=1e-15)


def test_cosines_are_float64_so_a_float32_tie_is_still_ranked():
    """Two float32 vectors whose float32 cosines tie (both round to the same value) are ranked in float64."""
    base = torch.tensor([1.0, 0.0, 0.0])
    near = {"a": base, "b": torch.tensor([1.0, 3e-4, 0.0]), "c": torch.tensor([1.0, 4e-4, 0.0])}
    frame = pd.DataFrame({"sentence1": ["a", "a"], "sentence2": ["b", "c"], "score": [1.0, 0.0]})
    as32 = torch.nn.functional.cosine_similarity(base[None], torch.stack([near["b"], near["c"]]))
    assert as32[0] == as32[1]  # float32 cannot tell them apart
    cosines = pair_cosines(lambda batch: torch.stack([near[s] for s in batch]), frame)
    assert cosines.dtype == np.float64 and cosines[0] > cosines[1]


def test_sts_metrics_are_correlations_of_cosines_times_100():
    frame = pd.DataFrame({"sentence1": ["a", "a", "a", "b"], "sentence2": ["b", "c", "d", "e"],
                          "score": [0.9, 0.1, 0.0, 0.8]})
    metrics = STSEvaluator({"dev": frame}).evaluate(lookup, "dev")
    cosines = [0.8, 0.0, -1.0 / np.hypot(1, 0.1), 0.96]
    assert metrics["dev_spearman"] == pytest.approx(100 * spearmanr(cosines, frame.score).statistic)
    assert metrics["dev_pearson"] == pytest.approx(100 * pearsonr(cosines, frame.score).statistic)
    assert STSEvaluator({}).primary("dev") == "dev_spearman"


def test_threshold_maximizes_accuracy():
    assert best_accuracy_threshold(np.array([0.9, 0.8, 0.3, 0.2]), np.array([1, 1, 0, 0])) == pytest.approx(0.55)
    assert best_accuracy_threshold(np.array([0.9, 0.8]), np.array([1, 1])) == pytest.approx(0.8)
    assert best_accuracy_threshold(np.array([0.9, 0.8]), np.array([0, 0])) > 0.9


def test_f1_threshold_maximizes_f1_where_accuracy_would_cut_elsewhere():
    scores, labels = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), np.array([1, 0, 1, 1, 0, 0])
    # accuracy: the top 4 (5/6); F1 of the positive class: also the top 4 (2*3/(4+3) = 0.857) beats the top 1 (0.5)
    assert best_accuracy_threshold(scores, labels) == pytest.approx(0.55)
    assert best_f1_threshold(scores, labels) == pytest.approx(0.55)
    scores, labels = np.array([0.9, 0.8, 0.7, 0.6, 0.5]), np.array([1, 0, 0, 1, 1])
    # accuracy peaks predicting only the top pair (3/5 right); F1 peaks predicting all five (2*3/(5+3) = 0.75)
    assert best_accuracy_threshold(scores, labels) == pytest.approx(0.85)
    assert best_f1_threshold(scores, labels) == pytest.approx(0.5)


def test_select_f1_makes_f1_the_primary_metric_and_tunes_its_threshold():
    import pandas as pd

    from trainables.evaluation.evaluators import make_evaluator

    dev = pd.DataFrame({"sentence1": list("abcde"), "sentence2": list("vwxyz"), "label": [1, 0, 0, 1, 1]})
    cosines = dict(zip("abcde", [0.9, 0.8, 0.7, 0.6, 0.5], strict=True))

    def embed(sentences):  # 2-d vectors whose pair cosines are the scores above
        import math

        rows = []
        for s in sentences:
            angle = math.acos(cosines[s]) if s in cosines else 0.0
            rows.append([math.cos(angle), math.sin(angle)])
        return torch.tensor(rows)

    by_f1 = make_evaluator("classification", {"dev": dev}, "f1")
    assert by_f1.primary("dev") == "dev_f1"
    metrics = by_f1.evaluate(embed, "dev")
    assert metrics["dev_f1"] == pytest.approx(75.0) and metrics["dev_threshold"] == pytest.approx(0.5, abs=1e-6)
    by_accuracy = make_evaluator("classification", {"dev": dev})
    assert by_accuracy.primary("dev") == "dev_accuracy"
    assert by_accuracy.evaluate(embed, "dev")["dev_accuracy"] == pytest.approx(60.0)


def test_classification_threshold_comes_from_dev_only():
    dev = pd.DataFrame({"sentence1": ["a", "a", "a"], "sentence2": ["a", "b", "c"], "label": [1, 1, 0]})
    test = pd.DataFrame({"sentence1": ["a", "b"], "sentence2": ["c", "c"], "label": [1, 1]})
    evaluator = PairClassificationEvaluator({"dev": dev, "test": test})
    on_dev = evaluator.evaluate(lookup, "dev")
    assert on_dev["dev_accuracy"] == 100.0 and on_dev["dev_threshold"] == pytest.approx(0.4)
    on_test = evaluator.evaluate(lookup, "test")  # cosines 0.0 and 0.6: only the second clears 0.4
    assert on_test["test_accuracy"] == 50.0
    assert on_test["test_f1"] == pytest.approx(100 * 2 * (1.0 * 0.5) / 1.5)


def test_embedder_encodes_each_distinct_sentence_once_and_keeps_train_mode(tiny_bert):
    model = build_sentence_encoder(tiny_bert, layer=2).train()
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    embed = Embedder(model, TokenCache(load_tokenizer(tiny_bert), 32), torch.device("cpu"))
    out = embed(["a dog", "a cat", "a dog", "a dog"])
    assert sum(seen) == 2 and out.shape == (4, 32)
    torch.testing.assert_close(out[0], out[2])
    assert model.training


@pytest.mark.slow
def test_sts_evaluator_agrees_with_sentence_transformers(data_dir, minilm_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from tests.conftest import MINILM
    from trainables.data.tasks import load_task

    dev = load_task("stsb", None, data_dir).dev
    ours = STSEvaluator({"dev": dev}).evaluate(
        Embedder(build_sentence_encoder(MINILM).eval(), TokenCache(load_tokenizer(MINILM), 128),
                 torch.device("cpu"), torch.float32), "dev")
    model = SentenceTransformer(str(minilm_path), device="cpu")
    model.max_seq_length = 128
    theirs = EmbeddingSimilarityEvaluator(list(dev.sentence1), list(dev.sentence2), list(dev.score))(model)
    assert ours["dev_spearman"] / 100 == pytest.approx(theirs["spearman_cosine"], abs=1e-4)
    assert ours["dev_pearson"] / 100 == pytest.approx(theirs["pearson_cosine"], abs=1e-4)
