"""Multi-layer pooling (`pooling_layers`): several layers' token states averaged before the pooling, against
`hidden_states` as SimCSE computes `avg_first_last` and `avg_top2`, ELMo's scalar mix as AllenNLP defines it,
the probe's one pass against the fine-tuned encoder at every cut, and each mistake in one line."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.trainables.test_architectures import FAMILIES, build, inputs
from trainables.contract import collect
from trainables.evaluation.probe import AllLayers
from trainables.kinds import get_kind
from trainables.models.architectures import layer_states
from trainables.models.encoder import SentenceEncoder, pool, truncate_encoder
from trainables.models.layer_mix import build_mix
from trainables.models.pooling_layers import mixed_layers
from trainables.training.bi_encoder import layer_lr_scales

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SimCSE's pooling line: (states * mask).sum(1) / mask.sum(-1)."""
    return (states * mask.unsqueeze(-1)).sum(1) / mask.sum(-1).unsqueeze(-1)


def encoder_at(full: torch.nn.Module, k: int, spec, pooling: str = "mean") -> SentenceEncoder:
    cut = truncate_encoder(copy.deepcopy(full), k)
    return SentenceEncoder(cut, pooling, mix=build_mix(spec, k)).eval()


@pytest.mark.parametrize("k", [4, 2])
def test_first_last_and_top2_are_simcses_averages_of_hidden_states(k):
    """A post-norm BERT, whose hidden_states[j] is layer j: SimCSE's formulas on the uncut model's hidden
    states (hidden_states[1] and [k]; [k-1] and [k]), and on the model cut at k (hidden_states[-1] is then k)."""
    full, batch = build("bert"), inputs()
    mask = batch["attention_mask"].float()
    with torch.no_grad():
        hidden = full(**batch, output_hidden_states=True).hidden_states
        first_last = masked_mean((hidden[1] + hidden[k]) / 2.0, mask)
        top2 = masked_mean((hidden[k - 1] + hidden[k]) / 2.0, mask)
        every = masked_mean(torch.stack(hidden[: k + 1]).mean(0), mask)
        chosen = masked_mean((hidden[0] + hidden[1] + hidden[k]) / 3.0, mask)
        torch.testing.assert_close(encoder_at(full, k, "first_last")(**batch), first_last, atol=1e-5, rtol=0)
        torch.testing.assert_close(encoder_at(full, k, "top2")(**batch), top2, atol=1e-5, rtol=0)
        torch.testing.assert_close(encoder_at(full, k, "all")(**batch), every, atol=1e-5, rtol=0)
        torch.testing.assert_close(encoder_at(full, k, [0, 1, k])(**batch), chosen, atol=1e-5, rtol=0)
        torch.testing.assert_close(encoder_at(full, k, "last")(**batch), masked_mean(hidden[k], mask), atol=1e-5,
                                   rtol=0)
        # the mix is per token, before the pooling (SimCSE's order): with max pooling that is not the mean of
        # the layers' max-pooled vectors
        averaged = pool((hidden[1] + hidden[k]) / 2.0, batch["attention_mask"], "max")
        torch.testing.assert_close(encoder_at(full, k, "first_last", "max")(**batch), averaged, atol=1e-5, rtol=0)
        apart = (pool(hidden[1], batch["attention_mask"], "max") + pool(hidden[k], batch["attention_mask"], "max")) / 2
        assert not torch.allclose(averaged, apart, atol=1e-3)
    assert encoder_at(full, k, "last").mix is None and encoder_at(full, k, [k]).mix is None  # today's encoder


def test_the_names_follow_the_cut_down_to_the_embeddings():
    assert mixed_layers("first_last", 6) == [1, 6] and mixed_layers("first_last", 1) == [1]
    assert mixed_layers("first_last", 0) == [0] and mixed_layers("top2", 0) == [0]
    assert mixed_layers("top2", 6) == [5, 6] and mixed_layers("all", 2) == [0, 1, 2]
    assert mixed_layers("scalar_mix", 2) == [0, 1, 2] and mixed_layers([6, 2], 6) == [2, 6]


def test_the_scalar_mix_is_elmos_and_starts_as_the_equal_mix():
    """AllenNLP's ScalarMix: gamma * sum_j softmax(s)_j h_j; s = 0 and gamma = 1 at the start, so the first
    step's vectors are `all`'s; set weights give the formula's vectors, and a step trains s and gamma at
    the head's full learning rate (layer_lr_scales gives them 1)."""
    full, batch = build("bert"), inputs()
    mask = batch["attention_mask"].float()
    learned = encoder_at(full, 3, "scalar_mix")
    with torch.no_grad():
        torch.testing.assert_close(learned(**batch), encoder_at(full, 3, "all")(**batch), atol=1e-5, rtol=0)
        learned.mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
        learned.mix.gamma.fill_(1.7)
        hidden = full(**batch, output_hidden_states=True).hidden_states
        weights = torch.softmax(torch.tensor([0.5, -1.0, 2.0, 0.0]), 0)
        expected = masked_mean(1.7 * sum(w * h for w, h in zip(weights, hidden[:4], strict=True)), mask)
        torch.testing.assert_close(learned(**batch), expected, atol=1e-5, rtol=0)
    learned.train()
    learned(**batch).pow(2).sum().backward()
    assert learned.mix.scalars.grad is not None and learned.mix.scalars.grad.abs().sum() > 0
    assert learned.mix.gamma.grad is not None
    scales = layer_lr_scales(learned, 0.5)
    assert scales["mix.scalars"] == scales["mix.gamma"] == 1.0 and min(scales.values()) < 1.0


@pytest.mark.parametrize("family", ["bert", "megatron-bert", "llama"])
@pytest.mark.parametrize("spec", ["first_last", "top2", "all"])
def test_the_probes_one_pass_gives_the_fine_tuned_encoders_vectors_at_every_cut(family, spec):
    """The probe scores every layer from one forward pass of the model; row k must be what fine-tuning's
    encoder cut at k gives, pre-norm stacks included (each layer as the model cut there returns it)."""
    full, batch = build(family), inputs()
    pooling = "last_token" if family == "llama" else "mean"
    with torch.no_grad():
        probed = AllLayers(full, range(5), pooling, pooling_layers=spec)(**batch)
        for k in range(5):
            torch.testing.assert_close(encoder_at(full, k, spec, pooling)(**batch), probed[:, k], atol=1e-5, rtol=0)
        states = layer_states(full, batch, list(range(5)))
    if family == "megatron-bert":  # the layers are the cut's (final norm on h_j), not raw hidden states
        raw = full(**batch, output_hidden_states=True).hidden_states
        assert not torch.allclose(states[1], raw[1], atol=1e-3)


@pytest.mark.parametrize(("train", "message"), [
    ({"layer": 2, "pooling_layers": "firstlast"},
     "train.pooling_layers: 'firstlast' is not valid; use one of: last, first_last, top2, all, scalar_mix, or a list "
     "of layers such as [4, 6]"),
    ({"layer": 2, "pooling_layers": [1, 3]},
     "train.pooling_layers: [1, 3] is not valid; the model is cut at the deepest layer it pools, which must be "
     "train.layer (2): include 2 and nothing deeper"),
    ({"pooling_layers": [1, 2]},
     "train.pooling_layers: [1, 2] is not valid; the model is cut at the deepest layer it pools, which must be the "
     "model's last layer (3)"),
    ({"layer": 2, "pooling_layers": [2, 2]}, "train.pooling_layers: [2, 2] is not valid; name each layer once"),
    ({"layer": 2, "pooling_layers": []}, "train.pooling_layers: [] is not valid; use one of"),
])
def test_a_bad_pooling_layers_is_one_line_exit_2(tmp_path, tiny_bert, synthetic_data_dir, monkeypatch, train, message):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["validate", str(study_file(tmp_path, tiny_bert, synthetic_data_dir, train=train))])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "studies").exists()


def test_saving_a_model_that_pools_several_layers_is_refused_before_the_study_runs(tmp_path, tiny_bert,
                                                                                    synthetic_data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = study_file(tmp_path, tiny_bert, synthetic_data_dir, save="best_per_cell", train={"layer": 2},
                      ablate={"pooling_layers": ["last", "first_last"]})
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: ablate.pooling_layers: 'first_last' is not valid; save: best_per_cell writes sentence-transformers "
        "folders, which have no module that combines layers: use save: none, or pooling_layers: last"]
    plain = runner.invoke(app, ["validate", str(study_file(tmp_path, tiny_bert, synthetic_data_dir, train={"layer": 2},
                                                           ablate={"pooling_layers": ["last", "first_last", [0, 2]]}))])
    assert plain.exit_code == 0, plain.output


@pytest.mark.parametrize(("options", "message"), [
    (["--pooling-layers", "scalar_mix"], "error: --pooling-layers: 'scalar_mix' is not valid; scalar_mix learns its "
                                         "weights in training; the probe has none to learn: use all"),
    (["--layers", "2", "--pooling-layers", "1,3"], "error: --pooling-layers: [1, 3] is not valid; a list of layers "
                                                   "is one cut, at its deepest (3): score --layers: [3]"),
    (["--pooling-layers", "first-last"], "error: --pooling-layers: 'first-last' is not valid; use one of: last, "
                                         "first_last"),
])
def test_the_probe_refuses_what_it_cannot_score_in_one_line(tiny_bert, synthetic_data_dir, options, message):
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), *options])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_the_probe_verb_scores_several_layers_averaged(tiny_bert, synthetic_data_dir):
    """`--pooling-layers first_last` changes every layer's score but layer 1's (its first and last are one
    layer); a list is one row, at its deepest layer, the table saying what was averaged."""
    import json

    def rows(*options: str) -> list[dict]:
        result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir),
                                     "--split", "dev", "--max-eval-samples", "40", "--device", "cpu", "--json",
                                     *options])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.strip().splitlines()]

    plain, first_last = rows(), rows("--pooling-layers", "first_last")
    assert [r["layer"] for r in first_last] == [0, 1, 2, 3] and first_last[2]["pooling_layers"] == "first_last"
    assert first_last[1]["spearman"] == plain[1]["spearman"] and first_last[0]["spearman"] == plain[0]["spearman"]
    assert all(abs(first_last[k]["spearman"] - plain[k]["spearman"]) > 1e-6 for k in (2, 3))
    listed = rows("--pooling-layers", "1,3")
    assert [r["layer"] for r in listed] == [3] and listed[0]["spearman"] == first_last[3]["spearman"]
    table = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), "--split",
                                "dev", "--max-eval-samples", "40", "--pooling-layers", "top2"])
    assert table.exit_code == 0 and "layers top2 averaged" in table.stdout, table.output


def test_a_finetune_trial_trains_and_scores_with_several_layers(tiny_bert, synthetic_data_dir):
    """One short trial per mix: it trains (the loss is finite and the scalar mix's weights move) and its dev
    score is not the last layer's alone."""
    def trial(spec) -> dict:
        return get_kind("finetune").run({"model": tiny_bert, "data_dir": str(synthetic_data_dir), "layer": 3,
                                         "pooling_layers": spec, "epochs": 1, "batch_size": 16, "lr": 1e-3,
                                         "max_train_samples": 64, "max_eval_samples": 40, "device": "cpu",
                                         "seed": 0}, collect([]))

    last, first_last, learned = trial("last"), trial("first_last"), trial("scalar_mix")
    for metrics in (last, first_last, learned):
        assert torch.isfinite(torch.tensor(metrics["train_loss"])) and -100 <= metrics["dev_spearman"] <= 100
    assert first_last["dev_spearman"] != pytest.approx(last["dev_spearman"], abs=1e-6)
    assert learned["dev_spearman"] != pytest.approx(first_last["dev_spearman"], abs=1e-6)


def study_file(folder, model, data_dir, train=None, ablate=None, **top):
    path = folder / "mix.yaml"
    path.write_text(yaml.safe_dump({
        "name": "mix", "model": model, "trainable": "finetune", "ablate": ablate or {},
        "replicate": {"seeds": [0]}, "train": {"epochs": 1, **(train or {})}, "data_dir": str(data_dir),
        "data": {"max_train_samples": 32, "max_eval_samples": 16},
        "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}, **top}))
    return path


assert set(FAMILIES) >= {"bert", "megatron-bert", "llama"}


def test_contrastive_training_pools_the_mixed_layers_with_and_without_the_attention_term(tiny_bert, synthetic_data_dir,
                                                                                        tmp_path):
    """SimCSE's views go through the encoder's mix; miCSE's step, which reads the attentions from the same
    forward, pools the same mixed states (its vectors equal the encoder's own on the same rows)."""
    from trainables.models.encoder import build_sentence_encoder
    from trainables.objectives.contrastive import ContrastiveModel

    encoder = build_sentence_encoder(tiny_bert, 3, "mean", pooling_layers="first_last").eval()
    encoder.encoder.set_attn_implementation("eager")  # attention probabilities, as the learner sets for miCSE
    model = ContrastiveModel(encoder, False).eval()
    batch = inputs()
    batch["input_ids"] = batch["input_ids"].clamp(max=encoder.encoder.config.vocab_size - 1)
    with torch.no_grad():
        plain, _ = model.views(batch["input_ids"], batch["attention_mask"], None)
        with_attention, attentions = model.views(batch["input_ids"], batch["attention_mask"], [0, 2])
    torch.testing.assert_close(with_attention, plain, atol=1e-5, rtol=0)
    assert len(attentions) == 2
    from tests.trainables.test_contrastive import short_simcse

    config = short_simcse(tiny_bert, synthetic_data_dir, tmp_path, layer=3, lr=1e-3, max_eval_samples=40)
    kind = get_kind("contrastive")
    last = kind.run(config, collect([]))
    mixed = kind.run({**config, "pooling_layers": "first_last"}, collect([]))
    micse = kind.run({**config, "pooling_layers": "first_last", "method": "micse", "attention_layers": [1, 2]},
                     collect([]))
    assert mixed["dev_spearman"] != pytest.approx(last["dev_spearman"], abs=1e-6)
    assert torch.isfinite(torch.tensor([mixed["train_loss"], micse["train_loss"], micse["attention_loss"]])).all()


def test_distillation_pools_the_mixed_layers_and_a_restart_brings_the_mix_back(tiny_bert, synthetic_data_dir, tmp_path):
    """`distill`'s bi-encoder (and its partner's in mutual mode) pools the mixed layers; restarting it each cycle
    restores the scalar mix's weights too; a list the partner's cut cannot end at is one line."""
    config = {"model": tiny_bert, "task": "stsb", "data_dir": str(synthetic_data_dir), "layer": 2, "cycles": 2,
              "bi_epochs": 1, "bi_lr": 1e-3, "bi_batch_size": 32, "cross_epochs": 1, "cross_lr": 1e-3,
              "cross_batch_size": 32, "bi_max_seq_length": 24, "cross_max_seq_length": 48, "max_train_samples": 64,
              "max_eval_samples": 40, "num_threads": 1, "device": "cpu", "precision": "fp32",
              "cache_dir": str(tmp_path / "stages")}
    distill = get_kind("distill")
    last = distill.run(config, collect([]))
    mixed = distill.run({**config, "pooling_layers": "scalar_mix", "restart_each_cycle": True}, collect([]))
    assert mixed["dev_spearman"] != pytest.approx(last["dev_spearman"], abs=1e-6)
    from trainables.errors import UserInputError

    with pytest.raises(UserInputError, match=r"pooling_layers: \[1, 2\] is not valid; .* partner_layer \(1\)"):
        distill.check(distill.parse({**config, "mode": "mutual", "partner_layer": 1, "pooling_layers": [1, 2]}),
                      lambda key: key)
