"""Post-processing (`postprocess:`): whitening as BERT-whitening's reference computes it, all-but-the-top
and z-scoring against numpy and scipy on fixed vectors, fitted on train sentences only in the probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from trainables.errors import UserInputError
from trainables.evaluation.postprocess import abtt_dim, fit


def vectors(n: int = 300, width: int = 12, seed: int = 0, layer_norm: bool = False) -> np.ndarray:
    """Correlated, anisotropic vectors (a common direction, uneven scales); `layer_norm`: each row
    normalized as a LayerNorm does, times a gain plus a bias (so they span width - 1 dimensions)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, width)) @ rng.normal(size=(width, width)) + 3.0
    if layer_norm:
        x = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
        x = x * rng.uniform(0.5, 2.0, width) + rng.normal(size=width)
    return x


def bert_whitening(vecs: np.ndarray, n_components: int | None = None):
    """bojone/BERT-whitening's compute_kernel_bias and its transform, as published (y = (x + bias) · kernel)."""
    mu = vecs.mean(axis=0, keepdims=True)
    cov = np.cov(vecs.T)
    u, s, vh = np.linalg.svd(cov)
    w = np.dot(u, np.diag(1 / np.sqrt(s)))
    return w[:, :n_components], -mu


@pytest.mark.parametrize("dim", [None, 5])
def test_whitening_is_the_references_kernel_and_bias(dim):
    x, new = vectors(), vectors(seed=1, n=40)
    kernel, bias = bert_whitening(x, dim)
    ours = fit("whiten", x, dim)
    np.testing.assert_allclose(ours(torch.from_numpy(new)).numpy(), (new + bias) @ kernel, atol=1e-9, rtol=0)
    whitened = ours(torch.from_numpy(x)).numpy()  # on what it was fitted on: mean 0, covariance I
    np.testing.assert_allclose(np.cov(whitened.T), np.eye(dim or 12), atol=1e-9)


def test_whitening_keeps_the_directions_a_layer_norms_output_spans():
    """LayerNorm rows span width - 1 dimensions: the reference's last 1 / sqrt(s) divides by rounding;
    we keep the 11 real directions (the reference's first 11 columns) and refuse a 12th asked for."""
    x = vectors(layer_norm=True)
    s = np.linalg.svd(np.cov(x.T), compute_uv=False)
    assert s[-1] < 1e-12 * s[0]
    ours = fit("whiten", x)
    assert ours.matrix.shape == (12, 11)
    kernel, bias = bert_whitening(x, 11)
    np.testing.assert_allclose(ours(torch.from_numpy(x)).numpy(), (x + bias) @ kernel, atol=1e-8, rtol=0)
    with pytest.raises(UserInputError, match="postprocess_dim: 12 is not valid; the train sentences' vectors span "
                                             "11 of their 12 dimensions: give 11 or less"):
        fit("whiten", x, 12)


@pytest.mark.parametrize("dim", [None, 3])
def test_all_but_the_top_removes_the_top_principal_directions_of_the_centred_vectors(dim):
    x, new = vectors(width=250), vectors(width=250, seed=1, n=30)
    removed = dim or abtt_dim(250)
    assert abtt_dim(250) == 2 and abtt_dim(384) == 4 and abtt_dim(32) == 1  # d / 100, at least 1
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(x.T))  # PCA another way: the covariance's eigenvectors
    top = eigenvectors[:, np.argsort(eigenvalues)[::-1][:removed]]
    centred = new - x.mean(axis=0)
    expected = centred - (centred @ top) @ top.T
    ours = fit("abtt", x, dim)(torch.from_numpy(new)).numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-9, rtol=0)
    np.testing.assert_allclose(ours @ top, 0, atol=1e-9)


def test_zscore_is_scipys_and_leaves_a_constant_dimension_at_zero():
    x = vectors()
    x[:, 3] = 7.0
    ours = fit("zscore", x)(torch.from_numpy(x)).numpy()
    with np.errstate(invalid="ignore", divide="ignore"), pytest.warns(RuntimeWarning):  # the constant dimension
        expected = stats.zscore(x, axis=0, ddof=0)
    expected[:, 3] = 0.0
    np.testing.assert_allclose(ours, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", ["whiten", "abtt", "zscore"])
def test_the_map_as_a_linear_layer_gives_the_same_vectors(method):
    x = vectors()
    affine = fit(method, x)
    with torch.no_grad():
        as_layer = affine.as_linear()(torch.from_numpy(x).float())
    torch.testing.assert_close(as_layer.double(), affine(torch.from_numpy(x)), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("method", "dim", "n", "message"), [
    ("whitening", None, 50, "postprocess: 'whitening' is not valid; use one of: abtt, none, whiten, zscore"),
    ("whiten", None, 8, "fitting it needs at least 13 distinct train sentences and the train split has 8"),
    ("whiten", 20, 50, "postprocess_dim: 20 is not valid; the vectors have 12 dimensions: use 1..12"),
    ("zscore", 3, 50, "zscore keeps every dimension: remove postprocess_dim"),
    ("abtt", 2, 2, "fitting it needs at least 3 distinct train sentences"),
])
def test_a_map_the_vectors_cannot_determine_is_one_line(method, dim, n, message):
    with pytest.raises(UserInputError) as error:
        fit(method, vectors(n=n), dim)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_probe_fits_on_train_sentences_only_and_scores_what_the_reference_scores(tiny_bert, synthetic_data_dir,
                                                                                  monkeypatch):
    """Per layer, the probe's whitened test Spearman is the one computed here: the cut model's vectors of the
    train split's distinct sentences whitened by the reference's kernel and bias, test cosines, Spearman."""
    import trainables.evaluation.probe as probe_module
    from trainables.data.tasks import load_task
    from trainables.kinds import get_kind
    from trainables.kinds.probe import ProbeConfig
    from trainables.models.encoder import build_sentence_encoder, load_tokenizer

    fitted_rows, cosines_scored = [], []
    real_fit, real_evaluator = probe_module.fit, probe_module.make_evaluator
    monkeypatch.setattr(probe_module, "fit", lambda method, x, dim: fitted_rows.append(len(x)) or real_fit(method, x,
                                                                                                          dim))

    def recording(*args, **kwargs):  # each layer's test cosines, as the probe's evaluator scored them
        evaluator = real_evaluator(*args, **kwargs)
        evaluate = evaluator.evaluate
        evaluator.evaluate = lambda embed, split: (evaluate(embed, split),
                                                   cosines_scored.append(evaluator.last_scores[split].copy()))[0]
        return evaluator

    monkeypatch.setattr(probe_module, "make_evaluator", recording)
    cfg = ProbeConfig(model=tiny_bert, layers=[1, 3], splits=["test"], data_dir=str(synthetic_data_dir),
                      postprocess="whiten", postprocess_dim=16, max_train_samples=120, device="cpu")
    rows = probe_module.probe_layers(cfg)
    data = load_task("stsb", None, str(synthetic_data_dir), max_train_samples=120)
    train = list(dict.fromkeys(list(data.train["sentence1"]) + list(data.train["sentence2"])))
    assert fitted_rows == [len(train)] * 2  # the train split's distinct sentences, nothing of test
    tokenizer = load_tokenizer(tiny_bert)
    for row, scored in zip(rows, cosines_scored, strict=True):
        model = build_sentence_encoder(tiny_bert, row["layer"], "mean").eval()

        def embed(sentences, model=model):
            batch = tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
            with torch.no_grad():
                return model(batch["input_ids"], batch["attention_mask"]).double().numpy()

        kernel, bias = bert_whitening(embed(train), 16)
        first, second = ((embed(list(data.test[c])) + bias) @ kernel for c in ("sentence1", "sentence2"))
        cosines = (first * second).sum(1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
        np.testing.assert_allclose(scored, cosines, atol=1e-6, rtol=0)
        # the Spearman of those cosines (the synthetic pairs' cosines tie where the sentences repeat, and
        # differences of 1e-8 order such ties: the same ranks only to rounding)
        assert row["test_spearman"] == pytest.approx(100 * stats.spearmanr(scored, data.test["score"]).statistic,
                                                     abs=1e-9)
        assert row["test_spearman"] == pytest.approx(100 * stats.spearmanr(cosines, data.test["score"]).statistic,
                                                     abs=0.1)
    plain = probe_module.probe_layers(cfg.model_copy(update={"postprocess": "none", "postprocess_dim": None}))
    assert [r["test_spearman"] for r in plain] != [r["test_spearman"] for r in rows]
    with pytest.raises(UserInputError, match="postprocess_dim: 16 is not valid; postprocess none has no dimension"):
        get_kind("probe").check(cfg.model_copy(update={"postprocess": "none"}))


def test_a_finetune_trial_scores_through_the_map_and_its_saved_model_carries_it(tiny_bert, synthetic_data_dir,
                                                                               tmp_path, monkeypatch):
    """Fine-tuning with `postprocess: whiten`: every evaluation refits the map on the train split's distinct
    sentences (never dev or test) with the weights it holds; the model saved with the map, loaded in
    sentence-transformers, gives the cosines the trial scored test on."""
    from sentence_transformers import SentenceTransformer

    import trainables.evaluation.postprocess as learner_module
    from trainables.contract import collect
    from trainables.kinds import get_kind
    from trainables.models.encoder import save_sentence_transformer
    from trainables.training.loop import train

    finetune = get_kind("finetune")
    config = {"model": tiny_bert, "task": "stsb", "layer": 2, "epochs": 2, "lr": 1e-3, "batch_size": 16,
              "data_dir": str(synthetic_data_dir), "precision": "fp32", "device": "cpu", "seed": 7,
              "max_train_samples": 100, "postprocess": "whiten", "postprocess_dim": 8}
    fitted_rows = []
    real_fit = learner_module.fit
    monkeypatch.setattr(learner_module, "fit", lambda method, x, dim: fitted_rows.append(len(x)) or real_fit(
        method, x, dim))
    learner, metrics = train(finetune, finetune.parse(config), collect([]))
    distinct = len(set(learner.first + learner.second))
    assert fitted_rows == [distinct] * 3  # dev after each of 2 epochs, then test once
    exported = []
    monkeypatch.setattr(learner_module, "fit", lambda method, x, dim: exported.append(len(x)) or real_fit(
        method, x, dim))
    train(finetune, finetune.parse({**config, "export_model": True}), collect([]))
    assert exported == [distinct] * 3  # the export right after test reuses test's map (same weights)
    learner.postprocess_map()
    again = len(exported)
    learner.postprocess_map()
    assert len(exported) == again  # unchanged weights: fitted once
    plain = finetune.run({**config, "postprocess": "none", "postprocess_dim": None}, collect([]))
    assert plain["test_spearman"] != metrics["test_spearman"]
    folder = save_sentence_transformer(learner.model, learner.tokens.tokenizer, tmp_path / "m", 128, "",
                                       learner.postprocess_map())
    loaded = SentenceTransformer(str(folder), device="cpu")
    test = learner.test_frame
    vectors = loaded.encode(list(test["sentence1"]) + list(test["sentence2"]), convert_to_numpy=True).astype(np.float64)
    assert vectors.shape[1] == 8
    first, second = vectors[: len(test)], vectors[len(test):]
    cosines = (first * second).sum(1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    np.testing.assert_allclose(cosines, learner.evaluator.last_scores["test"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["contrastive", "distill"])
def test_contrastive_and_distill_fit_the_map_on_what_they_train_on_and_score_through_it(
        kind, tiny_bert, synthetic_data_dir, tmp_path, monkeypatch):
    """SimCSE fits `postprocess` on its corpus's sentences, Trans-Encoder on its unlabeled pairs' (never dev or
    test), once per state of the bi-encoder's weights; dev and test are scored through the map (the same cosines
    as the map applied by hand to the encoder's vectors), and the map is what `save:` stores."""
    import trainables.evaluation.postprocess as postprocess
    from tests.trainables.test_contrastive import short_simcse
    from trainables.contract import collect
    from trainables.kinds import get_kind
    from trainables.training.loop import train

    config = short_simcse(tiny_bert, synthetic_data_dir, tmp_path) if kind == "contrastive" else {
        "model": tiny_bert, "task": "stsb", "data_dir": str(synthetic_data_dir), "layer": 2, "cycles": 1,
        "bi_epochs": 1, "bi_lr": 1e-3, "bi_batch_size": 32, "cross_epochs": 1, "cross_lr": 1e-3,
        "cross_batch_size": 32, "bi_max_seq_length": 24, "cross_max_seq_length": 48, "max_train_samples": 96,
        "num_threads": 1, "device": "cpu", "precision": "fp32", "cache_dir": str(tmp_path / "stages")}
    config = {**config, "postprocess": "zscore"}
    fitted = []
    real_fit = postprocess.fit
    monkeypatch.setattr(postprocess, "fit", lambda method, x, dim: fitted.append(len(x)) or real_fit(method, x, dim))
    trainable = get_kind(kind)
    learner, metrics = train(trainable, trainable.parse(config), collect([]))
    if kind == "contrastive":
        sentences, embed, scores = learner.sentences, learner.embed, learner.evaluator.last_scores
    else:
        sentences = list(learner.pairs["sentence1"]) + list(learner.pairs["sentence2"])
        side = learner.sides[0]
        embed = side.postprocess.embed
        _, last = learner.evaluate("test")
        scores = {"test": last}
    assert fitted and set(fitted) == {len(set(sentences))}  # the train sentences, each once
    affine = real_fit("zscore", embed(list(dict.fromkeys(sentences))))
    test = learner.test_frame
    first = affine(embed(list(test["sentence1"]))).numpy().astype(np.float64)
    second = affine(embed(list(test["sentence2"]))).numpy().astype(np.float64)
    cosines = (first * second).sum(1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    np.testing.assert_allclose(cosines, scores["test"], atol=1e-5, rtol=0)
    assert learner.postprocess_map() is learner.postprocess_map()  # the same weights: one fit
    plain = trainable.run({**config, "postprocess": "none"}, collect([]))
    assert plain["test_spearman"] != metrics["test_spearman"]


def test_contrastive_fits_its_map_on_a_fixed_sample_of_a_large_corpus(monkeypatch):
    """A wiki1m corpus would be embedded whole at every evaluation: the map is fitted on at most POSTPROCESS_FIT
    distinct sentences, the same ones every time, in corpus order; a smaller corpus whole."""
    from trainables.kinds.contrastive import learner as contrastive

    monkeypatch.setattr(contrastive, "POSTPROCESS_FIT", 5)
    corpus = [f"sentence {i}" for i in range(12)] + ["sentence 3"]
    sample = contrastive.fit_sample(corpus)
    assert len(sample) == 5 and len(set(sample)) == 5 and set(sample) <= set(corpus)
    assert sample == sorted(sample, key=corpus.index) and contrastive.fit_sample(corpus) == sample
    assert contrastive.fit_sample(corpus[:4]) == corpus[:4]
