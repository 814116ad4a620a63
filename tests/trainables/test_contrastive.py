"""The contrastive trainable (SimCSE, miCSE) on tiny random encoders, and one real-data run."""

from __future__ import annotations

import math
import re

import pytest
import torch

from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.contrastive import ContrastiveConfig, resolve_attention_layers
from trainables.models.batching import pad
from trainables.models.encoder import build_sentence_encoder, load_tokenizer
from trainables.objectives.contrastive import (
    ContrastiveModel,
    attention_correlation,
    attention_mutual_information,
    info_nce,
    step_batches,
)

contrastive = get_kind("contrastive")


@pytest.fixture()
def corpus(tmp_path) -> str:
    import random

    words = ["cat", "dog", "man", "woman", "child", "plays", "runs", "eats", "sits", "red", "blue", "green", "small",
             "large", "house", "park", "street", "ball", "guitar", "car", "river", "tree", "sings", "walks", "reads"]
    rng = random.Random(0)
    lines = {" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) for _ in range(400)}
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sorted(lines)) + "\n")
    return str(path)


def short_simcse(model: str, data_dir, folder, **changes) -> dict:
    """A six-step SimCSE trial's config on a 20-sentence corpus written to `folder` (other tests' quick trials)."""
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(f"a man {w} the guitar near the {v}" for w in ("plays", "sings", "reads", "walks")
                                for v in ("house", "park", "street", "river", "tree")) + "\n")
    return {"model": model, "task": "stsb", "corpus": str(corpus), "data_dir": str(data_dir), "layer": 2,
            "lr": 5e-3, "steps": 6, "eval_every": 3, "batch_size": 8, "max_seq_length": 16, "max_eval_samples": 32,
            "num_threads": 1, "device": "cpu", "precision": "fp32", **changes}


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir, corpus) -> dict:
    return {"model": tiny_bert, "task": "stsb", "corpus": corpus, "data_dir": str(synthetic_data_dir),
            "pooling": "mean", "lr": 1e-3, "steps": 30, "eval_every": 10, "batch_size": 16, "max_seq_length": 16,
            "num_threads": 1, "device": "cpu", "precision": "fp32"}


def test_the_two_dropout_views_of_a_sentence_differ_only_while_training(tiny_bert):
    model = ContrastiveModel(build_sentence_encoder(tiny_bert, 2, "mean"), mlp_head=False)
    ids = load_tokenizer(tiny_bert)(["a man plays the guitar in the park"])["input_ids"]
    input_ids, mask = pad(ids + ids, 0, torch.device("cpu"))
    model.train()
    vectors, _ = model.views(input_ids, mask, None)
    assert not torch.allclose(vectors[0], vectors[1])
    model.eval()
    vectors, _ = model.views(input_ids, mask, None)
    assert torch.allclose(vectors[0], vectors[1])


def test_info_nce_is_cross_entropy_over_in_batch_cosines():
    first = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    second = torch.tensor([[2.0, 0.1], [0.1, 3.0], [1.0, 0.9]])
    cosines = torch.nn.functional.normalize(first, dim=1) @ torch.nn.functional.normalize(second, dim=1).T
    expected = -torch.log_softmax(cosines / 0.05, dim=1).diagonal().mean()
    assert info_nce(first, second, 0.05).item() == pytest.approx(expected.item(), rel=1e-6)
    assert info_nce(first, first, 0.01).item() < 1e-6  # aligned views, separated negatives


def test_correlation_variant_is_zero_for_identical_attention_and_positive_otherwise():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    logits = torch.randn(2, 2, 4, 4).masked_fill(mask[:, None, None, :] == 0, -1e9)
    attention = logits.softmax(-1)
    assert attention_correlation([attention], [attention.clone()], mask).item() == pytest.approx(0.0, abs=1e-6)
    other = (logits + torch.randn_like(logits)).softmax(-1)
    value = attention_correlation([attention], [other], mask).item()
    assert 0 < value <= 2
    dropped = attention.clone()
    dropped[0, 0, 0, 1] = 0.0  # attention dropout zeroed one entry of one view: it is left out
    assert attention_correlation([attention], [dropped], mask).item() == pytest.approx(0.0, abs=1e-6)


def test_micse_term_is_the_references_scaled_negative_gaussian_mutual_information():
    """Rows are sentence x layer x head. Every row here has 24 entries non-zero in both views (fewer
    than the 150 the reference samples), so every row draws all of them (a permutation, which a
    correlation ignores) and the value is computable by hand."""
    torch.manual_seed(1)
    first = torch.rand(2, 3, 5, 5) + 0.01  # (batch, heads, query, key), all entries non-zero
    second = first * torch.exp(0.3 * torch.randn_like(first))
    second[:, :, 0, 0] = 0.0  # attention dropout zeroed one entry per row of one view: left out
    x, y = first.reshape(6, 25).double(), second.reshape(6, 25).double()
    rhos = torch.stack([torch.corrcoef(torch.stack([torch.log(x[r][1:]), torch.log(y[r][1:])]))[0, 1]
                        for r in range(6)])
    information = -0.5 * torch.log(1 - rhos ** 2)
    expected = -information.mean() * ((24 / 25) ** 2 + 1e-6)
    value = attention_mutual_information([first], [second]).item()
    assert value == pytest.approx(expected.item(), rel=1e-4)
    assert attention_mutual_information([first], [first.clone()]).item() < value < 0  # aligned views: lower loss
    assert attention_mutual_information([first], [torch.rand_like(first) + 0.01]).item() > value


def test_micse_defaults_follow_the_reference():
    cfg = ContrastiveConfig(model="m", method="micse")
    assert cfg.attention_loss == "mi" and cfg.attention_weight == 5e-4
    assert resolve_attention_layers("micse", None, 12) == [7, 8, 9, 10]  # the reference's min_layer=7, max_layer=11
    assert resolve_attention_layers("micse", None, 6) == [1, 2, 3, 4]
    assert resolve_attention_layers("micse", None, 1) == [0]


def test_batches_cover_the_corpus_each_pass_and_resume_to_the_same_order():
    batches = step_batches(10, 4, seed=3, steps=6)
    assert all(len(b) == 4 for b in batches)  # a short last batch is dropped
    assert len(set(batches[0] + batches[1])) == 8
    assert step_batches(10, 4, seed=3, steps=6, done=4) == batches[4:]


def test_simcse_loss_falls_and_reports_every_eval_round(config):
    reports = []
    final = contrastive.run(config, collect(reports))
    assert [r["round"] for r in reports] == [1, 2, 3] and [r["step"] for r in reports] == [10, 20, 30]
    assert reports[-1]["contrastive_loss"] < 0.5 * reports[0]["contrastive_loss"]
    assert "attention_loss" not in final and math.isfinite(final["dev_spearman"])
    assert final["test_epoch"] == final["best_epoch"] and "test_spearman" in final
    assert all("test_spearman" not in r for r in reports[:-1])  # test is scored once


def test_micse_adds_the_attention_term_and_still_trains(config):
    reports = []
    final = contrastive.run({**config, "method": "micse", "layer": 2, "attention_layers": [1, 2]},
                            collect(reports))
    assert all(r["attention_loss"] < 0 for r in reports)  # minus the views' mutual information
    assert final["train_loss"] == pytest.approx(final["contrastive_loss"] + 5e-4 * final["attention_loss"], rel=1e-6)
    variant = contrastive.run({**config, "method": "micse", "layer": 2, "attention_loss": "correlation",
                               "attention_weight": 1.0, "steps": 10}, collect([]))
    assert variant["attention_loss"] > 0 and variant["train_loss"] == pytest.approx(
        variant["contrastive_loss"] + variant["attention_loss"], rel=1e-6)
    assert reports[-1]["train_loss"] < reports[0]["train_loss"]


def test_same_seed_same_numbers_and_resume_from_a_checkpoint(config, tmp_path):
    first, second = [], []
    contrastive.run({**config, "steps": 20}, collect(first))
    contrastive.run({**config, "steps": 20}, collect(second))
    timeless = [[{k: v for k, v in r.items() if k != "train_seconds"} for r in rs] for rs in (first, second)]
    assert timeless[0] == timeless[1]
    saved = {}

    def keep(metrics, checkpoint_dir=None):
        if metrics["epoch"] == 1:
            import shutil

            saved["dir"] = shutil.copytree(checkpoint_dir, tmp_path / "ckpt")

    contrastive.run({**config, "steps": 20}, keep)
    resumed = []
    contrastive.run({**config, "steps": 20}, collect(resumed), checkpoint_dir=str(saved["dir"]))
    assert len(resumed) == 1
    for key in ("dev_spearman", "train_loss", "test_spearman"):
        assert resumed[0][key] == pytest.approx(first[-1][key], abs=1e-6)


@pytest.mark.parametrize(("changes", "message"), [
    ({"corpus": "task+test"}, "corpus: 'task+test' is not valid; test sentences train only with transductive: true"),
    ({"method": "mocse"}, "method: 'mocse' is not valid; use one of: micse, simcse"),
    ({"method": "micse", "layer": 0}, "layer: 0 is not valid; micse aligns attention, and layer 0 has none"),
    ({"method": "micse", "layer": 2, "attention_layers": [3]},
     "attention_layers: [3] is not valid; the encoder keeps 2 layers: use numbers in 1..2"),
    ({"task": "mrpc"}, "task: 'mrpc' is not valid; contrastive selects on an STS dev split"),
])
def test_bad_settings_are_one_clear_error(config, changes, message):
    with pytest.raises(UserInputError, match=re.escape(message)):
        contrastive.run({**config, **changes}, collect([]))


def test_test_sentences_train_only_when_transductive_and_it_is_recorded(config):
    reports = []
    final = contrastive.run({**config, "corpus": "task+test", "transductive": True, "steps": 10}, collect(reports))
    assert final["transductive"] == 1 and final["corpus_sentences"] > 400


def test_attention_layers_resolve_to_zero_based_kept_layers():
    assert resolve_attention_layers("micse", [4], 4) == [3]
    assert resolve_attention_layers("micse", [2, 1, 2], 4) == [0, 1]
    assert resolve_attention_layers("simcse", None, 4) is None
    with pytest.raises(UserInputError, match=re.escape("attention_layers: [5] is not valid; the encoder keeps 4")):
        resolve_attention_layers("micse", [5], 4)


def test_evaluation_reads_whole_sentences_while_training_truncates(config, synthetic_data_dir):
    from trainables.kinds.contrastive.learner import ContrastiveLearner

    cfg = ContrastiveConfig(**{**config, "max_seq_length": 8})
    learner = ContrastiveLearner(cfg, torch.device("cpu"), torch.float32)
    longest = max(learner.data.dev.sentence1, key=len)
    assert len(learner.tokens.tokenizer(longest)["input_ids"]) > 8
    assert len(learner.tokens.lookup([longest])[0]) == 8  # training length
    learner.evaluate("dev")
    assert len(learner.eval_tokens[longest]) == len(learner.tokens.tokenizer(longest)["input_ids"])
    capped = ContrastiveLearner(ContrastiveConfig(**{**config, "max_seq_length": 8, "eval_max_seq_length": 10}),
                                torch.device("cpu"), torch.float32)
    assert len(capped.eval_tokens.lookup([longest])[0]) == 10


def test_a_contrastive_stage_starts_finetune_through_the_stage_cache(config, tmp_path):
    finetune = get_kind("finetune")
    reports = []
    common = {"model": config["model"], "task": "stsb", "data_dir": config["data_dir"], "layer": 2, "epochs": 1,
              "batch_size": 16, "max_seq_length": 16, "pretrain": "simcse", "pretrain_corpus": config["corpus"],
              "pretrain_steps": 8, "pretrain_batch_size": 16, "pretrain_lr": 1e-3, "num_threads": 1,
              "cache_dir": str(tmp_path / "stages")}
    finetune.run(common, collect(reports))
    finetune.run({**common, "layer": 1}, collect(reports))
    assert [r["dapt_cache_hit"] for r in reports] == [0, 1]
    assert len(list((tmp_path / "stages").glob("dapt-*/model.safetensors"))) == 1
    with pytest.raises(UserInputError, match="pretrain_grad_accum: 2 is not valid; contrastive objectives"):
        finetune.run({**common, "pretrain_grad_accum": 2}, collect([]))


@pytest.mark.slow
def test_minilm_short_simcse_on_the_wikipedia_slice_reports_dev_spearman(data_dir, minilm_path):
    reports = []
    final = contrastive.run({"model": "sentence-transformers/all-MiniLM-L6-v2", "corpus": "unlabeled_en",
                             "layer": 6, "pooling": "mean", "steps": 20, "eval_every": 10, "batch_size": 32,
                             "max_train_samples": 2000, "max_eval_samples": 400, "data_dir": str(data_dir),
                             "num_threads": 1}, collect(reports))  # 1: the suite runs three test processes
    assert len(reports) == 2 and final["corpus_sentences"] == 2000
    assert final["dev_spearman"] > 75 and final["test_spearman"] > 70  # the packaged model stays a good encoder


@pytest.mark.parametrize("masks", ["fast", "torch"])
def test_simcse_and_micse_of_one_seed_draw_the_same_dropout_masks(config, masks):
    """A paired comparison: with the attention term off, miCSE's first forward is SimCSE's (with `fast`
    masks miCSE ran eager attention with torch's dropout, 3.4e-2 apart on BERT), and so is the whole
    first round (both reseed per step)."""
    from trainables.kinds.contrastive.learner import ContrastiveLearner
    from trainables.runtime import seed_everything

    def learner(method: str) -> ContrastiveLearner:
        seed_everything(0)  # what the loop does before building: the MLP head starts the same
        cfg = ContrastiveConfig(**{**config, "method": method, "layer": 3, "pooling": "cls", "dropout_masks": masks,
                                   "attention_weight": 0.0, "steps": 4, "eval_every": 4})
        return ContrastiveLearner(cfg, torch.device("cpu"), torch.float32)

    def first_forward(arm: ContrastiveLearner) -> torch.Tensor:
        ids, mask = pad([arm.tokens[arm.sentences[i]] for i in arm.batches[0]] * 2, arm.tokens.pad_id,
                        torch.device("cpu"))
        arm.model.train()
        torch.manual_seed(123)
        vectors, attentions = arm.model.views(ids, mask, arm.attention_layers)
        assert (len(attentions) == 2) == bool(arm.attention_layers)
        return vectors

    simcse, micse = learner("simcse"), learner("micse")
    assert micse.attention_layers == [0, 1]
    first, second = first_forward(simcse), first_forward(micse)
    assert not torch.allclose(first[:16], first[16:])  # dropout is on: the two views differ
    assert torch.allclose(first, second, atol=1e-6, rtol=0)
    simcse, micse = learner("simcse"), learner("micse")
    assert simcse.train_round(1)["contrastive_loss"] == pytest.approx(micse.train_round(1)["contrastive_loss"],
                                                                      abs=1e-6)


def test_fused_attention_runs_eager_only_where_the_pairing_needs_it():
    from trainables.kinds.contrastive.learner import uses_eager_attention
    from trainables.models.attention import INFERENCE
    from trainables.models.dropout import ATTENTION

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not uses_eager_attention(True, ATTENTION, cpu) and not uses_eager_attention(False, ATTENTION, cuda)
    assert uses_eager_attention(True, "sdpa", cpu) and not uses_eager_attention(False, "sdpa", cpu)
    assert uses_eager_attention(False, "sdpa", cuda)  # CUDA's fused kernels draw masks of their own
    # torch masks: the encoder's attention is SDPA in training whatever evaluation runs (unfused on a CPU)
    assert uses_eager_attention(False, INFERENCE, cuda) and not uses_eager_attention(False, INFERENCE, cpu)
