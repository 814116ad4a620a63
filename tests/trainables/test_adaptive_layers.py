"""`adaptive_layers: true`: sentence-transformers' AdaptiveLayerLoss in `finetune`. Its loss equals
sentence-transformers' own on the same model, batch and layers; a trial draws its layers reproducibly and
scores every layer of the one model it trains; its settings are refused in one line where they cannot apply."""

from __future__ import annotations

import math

import pytest
import torch

from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.finetune import FinetuneConfig, check_adaptive_layers
from trainables.kinds.finetune.learner import FinetuneLearner
from trainables.models.batching import pad
from trainables.models.encoder import build_sentence_encoder, load_tokenizer
from trainables.models.layer_vectors import LayerVectors
from trainables.objectives.adaptive_layers import AdaptiveLayerLoss
from trainables.objectives.sts import CosineMSELoss

FIRST = ["a man plays the guitar", "a dog runs in the park", "the child reads a book", "a red car"]
SECOND = ["a man plays a guitar", "a cat sits on the table", "a woman sings", "the blue car on the street"]
SCORES = torch.tensor([0.9, 0.2, 0.1, 0.5])


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


@pytest.mark.parametrize(("temperature", "kl_weight", "prior_weight"),
                         [(0.3, 1.0, 1.0), (0.5, 2.0, 0.5), (0.0, 1.0, 1.0)])
def test_the_loss_is_sentence_transformers_adaptive_layer_loss_over_every_layer(tiny_bert, temperature, kl_weight,
                                                                                prior_weight):
    """Every earlier layer (n_layers_per_step=-1 there, all of them here), so neither side draws at random."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import AdaptiveLayerLoss as Theirs
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    st = SentenceTransformer(modules=[Transformer(tiny_bert, max_seq_length=32), Pooling(32, pooling_mode="mean")],
                             device="cpu").eval()
    theirs = Theirs(st, CosineSimilarityLoss(st), n_layers_per_step=-1, prior_layers_weight=prior_weight,
                    kl_div_weight=kl_weight, kl_temperature=temperature)
    features = [st.tokenize(FIRST), st.tokenize(SECOND)]
    with torch.no_grad():
        expected = theirs(features, SCORES)

    model = build_sentence_encoder(tiny_bert, None, "mean").eval()
    tokenizer = load_tokenizer(tiny_bert)
    ids, mask = pad([tokenizer(s)["input_ids"] for s in FIRST + SECOND], tokenizer.pad_token_id, torch.device("cpu"))
    depth = model.encoder.config.num_hidden_layers
    with torch.no_grad():
        vectors = LayerVectors(model, [*range(depth), depth])(ids, mask)
        ours = AdaptiveLayerLoss(CosineMSELoss(), prior_weight, kl_weight, temperature)(vectors[:4], vectors[4:],
                                                                                         SCORES)
        last = CosineMSELoss()(vectors[:4, -1], vectors[4:, -1], SCORES)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert float(ours - last) > 1e-3  # the earlier layers count


def test_layer_j_of_the_model_is_a_model_cut_at_j_with_its_head(tiny_bert):
    full = build_sentence_encoder(tiny_bert, None, "mean", projection_dim=8, seed=0).eval()
    cut = build_sentence_encoder(tiny_bert, 2, "mean", projection_dim=8, seed=0).eval()
    cut.projection.load_state_dict(full.projection.state_dict())
    tokenizer = load_tokenizer(tiny_bert)
    ids, mask = pad([tokenizer(s)["input_ids"] for s in FIRST], tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        both = LayerVectors(full, [2, 3])(ids, mask)
        torch.testing.assert_close(both[:, 0], cut(ids, mask), atol=1e-5, rtol=0)
        torch.testing.assert_close(both[:, 1], full(ids, mask), atol=1e-5, rtol=0)


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir):
    return {"model": tiny_bert, "task": "stsb", "epochs": 2, "lr": 1e-3, "batch_size": 16, "max_train_samples": 96,
            "max_eval_samples": 40, "data_dir": str(synthetic_data_dir), "device": "cpu", "adaptive_layers": True}


def test_a_step_draws_its_earlier_layers_from_seed_epoch_and_step_then_the_last(config):
    learner = FinetuneLearner(FinetuneConfig(**config), torch.device("cpu"), torch.float32)
    assert learner.depth == 3
    drawn = [learner.drawn(1, step) for step in range(1, 40)]
    assert all(len(d) == 2 and d[-1] == 3 and 0 <= d[0] < 3 for d in drawn)
    assert {d[0] for d in drawn} == {0, 1, 2}  # every earlier layer, the embeddings' output included
    again = FinetuneLearner(FinetuneConfig(**config), torch.device("cpu"), torch.float32)
    assert [again.drawn(1, step) for step in range(1, 40)] == drawn  # a resumed trial draws the same
    other = FinetuneLearner(FinetuneConfig(**{**config, "seed": 1}), torch.device("cpu"), torch.float32)
    assert [other.drawn(1, step) for step in range(1, 40)] != drawn
    every = FinetuneLearner(FinetuneConfig(**{**config, "adaptive_layers_per_step": None}), torch.device("cpu"),
                            torch.float32)
    assert every.drawn(1, 1) == [0, 1, 2, 3]


def test_a_trial_scores_every_layer_of_the_one_model_it_trains(config):
    final = get_kind("finetune").run(config, collect([]))
    for layer in range(4):
        for split in ("dev", "test"):
            assert math.isfinite(final[f"layer{layer}_{split}_spearman"]), (layer, split)
    assert final["layer3_test_spearman"] == pytest.approx(final["test_spearman"], abs=1e-9)  # the cut's own
    assert final["layer3_dev_spearman"] == pytest.approx(final["best_dev_spearman"], abs=1e-9)
    plain = get_kind("finetune").run({**config, "adaptive_layers": False}, collect([]))
    assert not any(key.startswith("layer") for key in plain)
    assert plain["dev_spearman"] != pytest.approx(final["dev_spearman"], abs=1e-6)  # the last epoch: trained apart


def test_what_cannot_apply_is_one_line(config):
    key_of = lambda key: f"train.{key}"  # noqa: E731
    with pytest.raises(UserInputError, match="train.adaptive_layers: True is not valid; it trains and scores one "
                                             "layer at a time: use train.pooling_layers: last"):
        check_adaptive_layers(FinetuneConfig(**{**config, "pooling_layers": "first_last"}), key_of)
    with pytest.raises(UserInputError, match="use train.postprocess: none with it"):
        check_adaptive_layers(FinetuneConfig(**{**config, "postprocess": "whiten"}), key_of)
    with pytest.raises(UserInputError, match="train.adaptive_kl_weight: 2.0 is not valid; adaptive_kl_weight is "
                                             "read only with train.adaptive_layers: true"):
        check_adaptive_layers(FinetuneConfig(**{**config, "adaptive_layers": False, "adaptive_kl_weight": 2.0}),
                              key_of)
    check_adaptive_layers(FinetuneConfig(**{**config, "adaptive_layers": False, "adaptive_kl_weight": 2.0}),
                          lambda key: f"ablate.{key}")  # ablated: the cells that have it read it
