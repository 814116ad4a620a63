"""Cross-encoders and Trans-Encoder distillation on tiny random encoders, and one real-data cycle."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from trainables.contract import collect
from trainables.data.tasks import unlabeled_pairs
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.distill import DistillConfig
from trainables.kinds.distill import learner as distill_module
from trainables.models.encoder import load_tokenizer
from trainables.training.cross_encoder import CrossEncoder, PairTokens, cross_loss, predict

cross_encoder, distill = get_kind("cross_encoder"), get_kind("distill")


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir, tmp_path) -> dict:
    return {"model": tiny_bert, "task": "stsb", "data_dir": str(synthetic_data_dir), "layer": 2, "cycles": 2,
            "bi_epochs": 2, "bi_lr": 1e-3, "bi_batch_size": 32, "cross_epochs": 2, "cross_lr": 1e-3,
            "cross_batch_size": 32, "bi_max_seq_length": 24, "cross_max_seq_length": 48, "max_train_samples": 160,
            "num_threads": 1, "device": "cpu", "precision": "fp32", "cache_dir": str(tmp_path / "stages")}


def test_cross_encoder_reads_both_sentences_in_one_input(tiny_bert):
    tokens = PairTokens(load_tokenizer(tiny_bert), 16)
    (ids,) = tokens.lookup(["a man plays"], ["a guitar"])
    tokenizer = load_tokenizer(tiny_bert)
    assert ids.count(tokenizer.sep_token_id) == 2 and ids[0] == tokenizer.cls_token_id
    (long_ids,) = tokens.lookup(["word " * 40], ["other " * 40])
    assert len(long_ids) == 16 and long_ids.count(tokenizer.sep_token_id) == 2  # both sides truncated
    model = CrossEncoder(tiny_bert, 2)
    scores = predict(model, tokens.lookup(["a", "b c"], ["d", "e"]), tokens.pad_id, torch.device("cpu"),
                     torch.float32)
    assert scores.shape == (2,) and ((scores > 0) & (scores < 1)).all()
    forward = predict(model, tokens.lookup(["b c", "a"], ["e", "d"]), tokens.pad_id, torch.device("cpu"),
                      torch.float32)
    assert np.allclose(scores, forward[::-1], atol=1e-6)  # padding and order do not change a pair's score


def test_the_second_sentence_is_segment_b_as_the_tokenizer_says(tiny_bert):
    """BERT-family encoders embed segments: the cross-encoder must feed the tokenizer's segment ids
    (a random token-type table makes segment A and B embeddings differ, as in MiniLM by up to 0.12)."""
    from trainables.models.batching import pad
    from trainables.models.encoder import last_hidden_state, pool, segment_ids

    tokenizer = load_tokenizer(tiny_bert)
    first, second = ["a man plays the guitar", "word " * 40, "b"], ["a guitar", "other " * 40, "c d e f"]
    encoded = tokenizer(first, second, truncation="longest_first", max_length=24, padding=True, return_tensors="pt")
    model = CrossEncoder(tiny_bert, 2, head="linear").eval()
    assert model.separator == tokenizer.sep_token_id
    derived = segment_ids(encoded["input_ids"], encoded["attention_mask"], model.separator)
    assert torch.equal(derived, encoded["token_type_ids"]) and derived.sum() > 0
    tokens = PairTokens(tokenizer, 24)
    input_ids, mask = pad(tokens.lookup(first, second), tokens.pad_id, torch.device("cpu"))
    with torch.no_grad():
        ours = model(input_ids, mask)
        expected = model.head(pool(last_hidden_state(model.encoder, input_ids, mask, encoded["token_type_ids"]),
                                   mask, model.pooling)).squeeze(-1)
        without = model.head(pool(last_hidden_state(model.encoder, input_ids, mask), mask, model.pooling)).squeeze(-1)
    assert torch.allclose(ours, expected, atol=1e-6)
    assert not torch.allclose(ours, without, atol=1e-4)  # segment ids change what the encoder computes


def test_the_pretrained_head_is_sentence_transformers_cross_encoder(tiny_bert):
    """`head: pretrained` scores a pair as sentence-transformers' CrossEncoder(num_labels=1) does (the
    Trans-Encoder reference's cross-encoder): the model's pooler (dense + tanh) on the first token,
    dropout, a new classifier, sigmoid; the same seed gives the same new classifier."""
    from sentence_transformers import CrossEncoder as STCrossEncoder

    pairs = [("a man plays the guitar", "a guitar is played"), ("word " * 30, "b c d"), ("x", "y z")]
    torch.manual_seed(7)
    theirs = STCrossEncoder(tiny_bert, num_labels=1, device="cpu", max_length=24)
    torch.manual_seed(7)
    ours = CrossEncoder(tiny_bert, head="pretrained")
    assert ours.classifier.base_model.pooler is not None  # kept: the head reads it
    assert torch.equal(ours.classifier.classifier.weight, theirs.model.classifier.weight)
    tokens = PairTokens(load_tokenizer(tiny_bert), 24)
    scores = predict(ours, tokens.lookup([a for a, _ in pairs], [b for _, b in pairs]), tokens.pad_id,
                     torch.device("cpu"), torch.float32)
    assert np.allclose(scores, theirs.predict(pairs), atol=1e-6)
    truncated = CrossEncoder(tiny_bert, 1, head="pretrained")
    assert truncated.classifier.base_model.pooler is not None and len(truncated.backbone().encoder.layer) == 1
    linear = CrossEncoder(tiny_bert, 1, head="linear")
    assert linear.encoder.pooler is None and not hasattr(linear, "classifier")


def test_a_model_reports_the_same_size_whether_its_layer_is_null_or_its_depth(tiny_bert):
    """`params` counts what the forward reads. With `layer: null` the encoder keeps its pretrained
    pooler, which a pooling head (bi-encoder) or `head: linear` never reads: it was counted (the
    cross-encoder heads study reported 22.7 M for both heads, where the linear one reads 22.57 M), and
    the same model cut at its full depth reported 0.15 M less. `head: pretrained` reads it: counted."""
    from trainables.models.encoder import (
        build_sentence_encoder,
        count_parameters,
        encoder_layers,
        used_parameter_count,
    )

    depth = len(encoder_layers(CrossEncoder(tiny_bert, head="linear").encoder))
    for build in (lambda layer: CrossEncoder(tiny_bert, layer, head="linear"),
                  lambda layer: build_sentence_encoder(tiny_bert, layer)):
        full, cut = build(None), build(depth)
        assert full.encoder.pooler is not None and cut.encoder.pooler is None  # kept with null, not read
        assert used_parameter_count(full) == used_parameter_count(cut) == count_parameters(cut)
    pretrained, linear = CrossEncoder(tiny_bert, head="pretrained"), CrossEncoder(tiny_bert, head="linear")
    hidden = pretrained.classifier.config.hidden_size
    assert used_parameter_count(pretrained) == count_parameters(pretrained)  # its pooler is read
    # the pooler (dense + tanh) is the difference; both classifiers are hidden + 1
    assert used_parameter_count(pretrained) - used_parameter_count(linear) == hidden * hidden + hidden


def test_the_runs_params_are_the_same_for_layer_null_and_the_full_depth(tiny_bert, synthetic_data_dir):
    """End to end: what a cross-encoder (linear head) and a fine-tuned bi-encoder run logs as `params`."""
    from trainables.models.encoder import encoder_depth, load_config

    depth = encoder_depth(load_config(tiny_bert))
    common = {"model": tiny_bert, "task": "stsb", "data_dir": str(synthetic_data_dir), "epochs": 1,
              "batch_size": 32, "max_seq_length": 24, "max_train_samples": 32, "max_eval_samples": 32,
              "num_threads": 1, "precision": "fp32"}
    for kind, extra in ((cross_encoder, {"head": "linear"}), (get_kind("finetune"), {})):
        params = [kind.run({**common, **extra, "layer": layer}, collect([]))["params"] for layer in (None, depth)]
        assert params[0] == params[1], (kind, params)


def test_a_pretrained_head_pools_the_first_token_only(tiny_bert, config):
    with pytest.raises(UserInputError, match=re.escape("pooling: 'mean' is not valid; head: pretrained reads the "
                                                       "first token")):
        CrossEncoder(tiny_bert, 2, pooling="mean")
    kind_config = cross_encoder.parse({"model": tiny_bert, "pooling": "mean"})
    with pytest.raises(UserInputError, match=re.escape("pooling: 'mean' is not valid; head: pretrained")):
        cross_encoder.check(kind_config)
    cross_encoder.check(cross_encoder.parse({"model": tiny_bert, "pooling": "mean", "head": "linear"}))
    with pytest.raises(UserInputError, match=re.escape("cross_pooling: 'max' is not valid; cross_head: pretrained "
                                                       "reads the first token through the model's pooler: use "
                                                       "cross_pooling: cls, or cross_head: linear")):
        distill.check(distill.parse({**config, "cross_pooling": "max"}))


def test_encoders_without_segment_embeddings_get_no_segment_ids(tiny_bert):
    from transformers import BertConfig, RobertaConfig

    from trainables.models.encoder import pair_separator

    tokenizer = load_tokenizer(tiny_bert)
    assert pair_separator(tokenizer, RobertaConfig(type_vocab_size=1)) is None  # RoBERTa, MPNet: one segment
    assert pair_separator(tokenizer, BertConfig(type_vocab_size=2)) == tokenizer.sep_token_id


def test_targets_are_clipped_to_zero_one_before_bce():
    logits = torch.tensor([0.0, 2.0])
    assert cross_loss("bce", logits, torch.tensor([-0.4, 1.3])).item() == pytest.approx(
        cross_loss("bce", logits, torch.tensor([0.0, 1.0])).item())
    assert cross_loss("mse", torch.tensor([100.0]), torch.tensor([1.0])).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("head", ["linear", "pretrained"])
def test_cross_encoder_trainable_fits_its_training_pairs(tiny_bert, tmp_path, head):
    """A tiny random cross-encoder cannot generalize word overlap from 240 pairs, but it must fit
    the pairs it trains on: here dev and test are the training pairs. (The pretrained head starts at
    logit ~0, BCE 0.693, behind dropout: it fits more slowly in 10 epochs.)"""
    from tests.conftest import _synthetic_pairs

    (tmp_path / "stsb").mkdir()
    lines = [f"c\ts\t2024\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(_synthetic_pairs(64, 1))]
    for split in ("train", "dev", "test"):
        (tmp_path / "stsb" / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
    reports = []
    final = cross_encoder.run({"model": tiny_bert, "task": "stsb", "data_dir": str(tmp_path), "layer": 2,
                               "epochs": 10, "lr": 3e-3, "batch_size": 8, "max_seq_length": 48, "num_threads": 1,
                               "head": head}, collect(reports))
    assert [r["epoch"] for r in reports] == list(range(1, 11))
    assert reports[-1]["train_loss"] < reports[0]["train_loss"] - (0.1 if head == "linear" else 0.05)
    assert reports[0]["dev_spearman"] < 40 and final["best_dev_spearman"] > 70
    assert final["test_epoch"] == final["best_epoch"] and "test_spearman" in final
    assert all("test_spearman" not in r for r in reports[:-1])


def spy_fits(monkeypatch) -> list:
    seen = []
    original_cross, original_bi = distill_module.fit_cross_encoder, distill_module.fit_bi_encoder

    def cross(model, tokens, frame, *args, **kwargs):
        seen.append(("cross", frame.copy()))
        return original_cross(model, tokens, frame, *args, **kwargs)

    def bi(model, tokens, frame, *args, **kwargs):
        seen.append(("bi", frame.copy()))
        return original_bi(model, tokens, frame, *args, **kwargs)

    monkeypatch.setattr(distill_module, "fit_cross_encoder", cross)
    monkeypatch.setattr(distill_module, "fit_bi_encoder", bi)
    return seen


def test_self_distillation_moves_labels_between_the_encoders(config, monkeypatch):
    seen = spy_fits(monkeypatch)
    splits = []
    original_evaluate = distill_module.DistillLearner.evaluate
    monkeypatch.setattr(distill_module.DistillLearner, "evaluate",
                        lambda self, split: splits.append(split) or original_evaluate(self, split))
    reports = []
    final = distill.run(config, collect(reports))
    assert [kind for kind, _ in seen] == ["cross", "bi", "cross", "bi"]
    assert all(frame.score.min() >= 0 and frame.score.max() <= 1 for _, frame in seen)  # cosines clipped, sigmoids
    assert not np.allclose(seen[0][1].score, seen[2][1].score)  # the second cycle's bi-encoder labels differ
    assert [r["cycle"] for r in reports] == [1, 2]
    assert {"dev_spearman", "cross_dev_spearman", "bi_train_loss", "cross_train_loss"} <= set(reports[0])
    assert final["test_epoch"] == final["best_epoch"]
    assert final["best_dev_spearman"] == max(r["dev_spearman"] for r in reports)  # chosen on dev
    assert {"cycle1_dev_spearman", "cycle2_cross_dev_spearman"} <= set(final)
    assert splits.count("test") == 1 and not any(k.startswith("cycle") and "test" in k for k in final)


def test_the_cross_encoder_learns_both_orders_of_every_pair_with_one_label(config, monkeypatch):
    seen = spy_fits(monkeypatch)
    distill.run({**config, "cycles": 1, "bi_epochs": 1, "cross_epochs": 1}, collect([]))
    frame = seen[0][1]
    n = len(frame) // 2
    assert n == 160 and len(frame) == 2 * n
    forward, backward = frame.iloc[:n].reset_index(drop=True), frame.iloc[n:].reset_index(drop=True)
    assert (forward.sentence1 == backward.sentence2).all() and (forward.sentence2 == backward.sentence1).all()
    assert np.array_equal(forward.score.to_numpy(), backward.score.to_numpy())


def test_per_cycle_test_is_an_opt_in_diagnostic(config):
    final = distill.run({**config, "test_every_round": True, "bi_epochs": 1, "cross_epochs": 1}, collect([]))
    assert {"cycle1_test_spearman", "cycle2_cross_test_spearman"} <= set(final)
    assert final["test_spearman"] == pytest.approx(final[f"cycle{final['best_epoch']}_test_spearman"])


def test_pseudo_labels_of_every_cycle_are_in_the_checkpoint_and_resume_continues(config, tmp_path):
    saved = {}

    def keep(metrics, checkpoint_dir=None):
        import shutil

        saved[metrics["cycle"]] = shutil.copytree(checkpoint_dir, tmp_path / f"ckpt{metrics['cycle']}")

    uninterrupted = []
    distill.run(config, lambda m, checkpoint_dir=None: (uninterrupted.append(m), keep(m, checkpoint_dir)))
    labels = pd.read_csv(saved[2] / "pseudo_labels.csv")
    assert labels.groupby(["cycle", "step"]).size().to_dict() == {(1, "bi_to_cross"): 160, (1, "cross_to_bi"): 160,
                                                                  (2, "bi_to_cross"): 160, (2, "cross_to_bi"): 160}
    resumed = []
    distill.run(config, collect(resumed), checkpoint_dir=str(saved[1]))
    assert [r["cycle"] for r in resumed] == [2]
    assert resumed[0]["dev_spearman"] == pytest.approx(uninterrupted[1]["dev_spearman"], abs=1e-6)
    assert resumed[0]["test_spearman"] == pytest.approx(uninterrupted[1]["test_spearman"], abs=1e-6)


def test_restart_each_cycle_labels_with_the_previous_cycles_models_then_starts_fresh(config, monkeypatch):
    """Trans-Encoder: cycle 2's labels come from the bi-encoder cycle 1 trained; only then do the
    encoders restart. Restarting first would make every cycle repeat cycle 1 exactly."""
    seen = spy_fits(monkeypatch)
    events = []
    for name in ("restart_bi", "restart_cross"):
        original = getattr(distill_module, name)
        monkeypatch.setattr(distill_module, name, lambda side, cfg, _n=name, _o=original: (events.append(_n),
                                                                                            _o(side, cfg)))
    distill.run({**config, "restart_each_cycle": True, "cycles": 2, "bi_epochs": 2, "cross_epochs": 1},
                collect([]))
    cross_labels = [frame.score.to_numpy() for kind, frame in seen if kind == "cross"]
    assert not np.allclose(cross_labels[0], cross_labels[1])  # cycle 2 is labelled by the trained bi-encoder
    assert events == ["restart_cross", "restart_bi"]  # cycle 2 only, each right before its encoder learns


def test_a_restart_brings_back_the_initial_weights_of_both_encoders(config):
    cfg = DistillConfig(**config)
    side = distill_module.build_side(cfg, "", config["model"], 2, config["model"], torch.device("cpu"))
    initial = {**side.bi.state_dict(), **{f"cross.{k}": v.clone() for k, v in side.cross.state_dict().items()}}
    initial = {k: v.clone() for k, v in initial.items()}
    with torch.no_grad():
        for p in [*side.bi.parameters(), *side.cross.backbone().parameters()]:
            p.add_(1.0)
    distill_module.restart_bi(side, cfg)
    distill_module.restart_cross(side, cfg)
    after = {**side.bi.state_dict(), **{f"cross.{k}": v for k, v in side.cross.state_dict().items()}}
    # a fresh head (a linear layer, or the classifier behind the pretrained pooler) is drawn anew
    encoder_keys = [k for k in initial if not k.startswith(("cross.head", "cross.classifier.classifier"))]
    assert len(encoder_keys) > len(side.bi.state_dict())  # the cross-encoder's backbone (and pooler) included
    assert all(torch.equal(initial[k], after[k]) for k in encoder_keys)


def test_mutual_distillation_trains_both_on_the_averaged_labels(config, monkeypatch):
    seen = []
    original = distill_module.fit_bi_encoder

    def spy(model, tokens, frame, *args, **kwargs):
        seen.append((id(model), frame["score"].to_numpy().copy()))
        return original(model, tokens, frame, *args, **kwargs)

    monkeypatch.setattr(distill_module, "fit_bi_encoder", spy)
    scores = []
    original_cross = distill_module.cross_scores
    monkeypatch.setattr(distill_module, "cross_scores", lambda side, frame, d, t: scores.append(
        original_cross(side, frame, d, t)) or scores[-1])
    final = distill.run({**config, "mode": "mutual", "partner_layer": 1, "cycles": 1}, collect([]))
    (first, labels_a), (second, labels_b) = seen
    assert first != second and np.array_equal(labels_a, labels_b)
    assert np.allclose(labels_a, (scores[0] + scores[1]) / 2)
    assert {"partner_dev_spearman", "partner_cross_dev_spearman", "partner_test_spearman"} <= set(final)


def test_teacher_mode_trains_a_teacher_per_seed_or_one_shared_teacher(config):
    first, second, third = [], [], []
    distill.run({**config, "mode": "teacher"}, collect(first))
    distill.run({**config, "mode": "teacher", "seed": 1}, collect(second))
    assert len(first) == 1 and first[0]["teacher_cache_hit"] == 0 and second[0]["teacher_cache_hit"] == 0
    assert first[0]["teacher_cache_key"] != second[0]["teacher_cache_key"]  # its own seed in its key
    assert first[0]["cross_dev_spearman"] != second[0]["cross_dev_spearman"]
    distill.run({**config, "mode": "teacher", "seed": 2, "stage_seed": "shared"}, collect(third))
    assert third[0]["teacher_cache_hit"] == 1 and third[0]["stage_seed"] == 0  # the seed-0 teacher, reused
    assert third[0]["cross_dev_spearman"] == pytest.approx(first[0]["cross_dev_spearman"])


@pytest.mark.parametrize(("changes", "message"), [
    ({"pairs": "task+test"}, "pairs: 'task+test' is not valid; test pairs train only with transductive: true"),
    ({"mode": "both"}, "mode: 'both' is not valid; use one of: mutual, self, teacher"),
    ({"pairs": "nowhere.tsv"}, "pairs: 'nowhere.tsv' is not valid; use task, task+dev"),
    ({"task": "mrpc"}, "task: 'mrpc' is not valid; distillation selects on an STS dev split"),
])
def test_bad_settings_are_one_clear_error(config, changes, message):
    with pytest.raises(UserInputError, match=re.escape(message)):
        distill.run({**config, **changes}, collect([]))


def test_pairs_from_a_file_and_test_pairs_only_when_transductive(config, tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text('a "quoted" man\ta woman\nx\ty\na "quoted" man\ta woman\n\t\n')
    frame = unlabeled_pairs(str(path), "stsb", None, config["data_dir"], False)
    assert frame.values.tolist() == [['a "quoted" man', "a woman"], ["x", "y"]]
    with_test = unlabeled_pairs("task+test", "stsb", None, config["data_dir"], transductive=True)
    assert len(with_test) == 240 + 80 + 80  # train, dev and test pairs (Trans-Encoder's transductive set)
    assert list(with_test.columns) == ["sentence1", "sentence2"]


@pytest.mark.slow
def test_minilm_one_self_distillation_cycle_on_1000_unlabeled_stsb_pairs(data_dir, minilm_path):
    reports = []
    final = distill.run({"model": "sentence-transformers/all-MiniLM-L6-v2", "task": "stsb", "pairs": "task",
                         "cycles": 1, "bi_epochs": 1, "bi_batch_size": 64, "cross_epochs": 1, "cross_lr": 5e-5,
                         "cross_batch_size": 16, "max_train_samples": 1000,
                         "max_eval_samples": 500, "data_dir": str(data_dir),
                         "num_threads": 1}, collect(reports))  # 1: the suite runs three test processes on 2 cores
    assert len(reports) == 1 and final["pairs"] == 1000
    assert final["dev_spearman"] > 75  # the bi-encoder stays good on its own pseudo-labels
    assert np.isfinite(final["cross_dev_spearman"]) and final["cross_dev_spearman"] > 20  # the cross-encoder learned


def test_distillation_starts_both_encoders_from_a_cached_simcse_stage(config, tmp_path):
    from safetensors.torch import load_file

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"sentence number {i} about a {w}" for i, w in enumerate(["cat", "dog"] * 40)))
    common = {**config, "cycles": 1, "bi_epochs": 1, "cross_epochs": 1, "pretrain": "simcse",
              "pretrain_corpus": str(corpus), "pretrain_steps": 4, "pretrain_batch_size": 16, "stage_seed": "shared"}
    first, second = [], []
    distill.run(common, collect(first))
    distill.run({**common, "seed": 1}, collect(second))
    assert first[0]["dapt_cache_hit"] == 0 and second[0]["dapt_cache_hit"] == 1
    stages = list((tmp_path / "stages").glob("dapt-*/model.safetensors"))
    assert len(stages) == 1 and first[0]["dapt_stage_dir"] == str(stages[0].parent)
    learner = distill_module.DistillLearner(DistillConfig(**common), torch.device("cpu"), torch.float32)
    adapted = load_file(stages[0])
    name = "embeddings.word_embeddings.weight"
    assert torch.equal(learner.sides[0].cross.backbone().state_dict()[name], adapted[name])  # the cross-encoder too
    assert torch.equal(learner.sides[0].bi.encoder.state_dict()[name], adapted[name])
    with pytest.raises(UserInputError,
                       match="pretrain: 'bert' is not valid; use one of: micse, mlm, mntp, rtd, simcse"):
        distill.run({**common, "pretrain": "bert"}, collect([]))
