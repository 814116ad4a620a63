"""`matryoshka_dims`: sentence-transformers' MatryoshkaLoss around any loss, and with `adaptive_layers` its
Matryoshka2dLoss, equal to theirs on the same batch; a trial scores every size (and every (layer, size) pair)
of the one model it trains; what cannot apply is one line."""

from __future__ import annotations

import math

import pytest
import torch

from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.finetune import FinetuneConfig, check_matryoshka
from trainables.models.batching import pad
from trainables.models.encoder import build_sentence_encoder, load_tokenizer
from trainables.models.layer_vectors import LayerVectors
from trainables.objectives import build_loss
from trainables.objectives.adaptive_layers import AdaptiveLayerLoss
from trainables.objectives.matryoshka import MatryoshkaLoss
from trainables.objectives.sts import CoSENTLoss, CosineMSELoss

losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

FIRST = ["a man plays the guitar", "a dog runs in the park", "the child reads a book", "a red car"]
SECOND = ["a man plays a guitar", "a cat sits on the table", "a woman sings", "the blue car on the street"]
SCORES = torch.tensor([0.9, 0.2, 0.1, 0.5])


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


class Given(torch.nn.Module):
    """A stand-in for a SentenceTransformer whose 'features' are already its embeddings."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, features):
        return {"sentence_embedding": features["embedding"]}

    def get_embedding_dimension(self) -> int:
        return self.dim


@pytest.mark.parametrize(("dims", "weights"), [([24, 12, 6], None), ([6, 24, 12], [1.0, 0.5, 2.0]), ([8], None)])
def test_around_cosent_and_mnrl_it_equals_sentence_transformers_matryoshka_loss(dims, weights):
    generator = torch.Generator().manual_seed(0)
    u, v, w = (torch.randn(6, 24, generator=generator, dtype=torch.float64) for _ in range(3))
    scores = torch.rand(6, generator=generator, dtype=torch.float64)
    given = Given(24)
    theirs = losses.MatryoshkaLoss(given, losses.CoSENTLoss(given), dims, weights)
    expected = theirs([{"embedding": u}, {"embedding": v}], scores)
    ours = MatryoshkaLoss(CoSENTLoss(24), dims, weights)(u, v, scores)
    assert abs(ours.item() - expected.item()) < 1e-6
    ranking = losses.MatryoshkaLoss(given, losses.MultipleNegativesRankingLoss(given), dims, weights)
    expected = ranking([{"embedding": u}, {"embedding": v}, {"embedding": w}], torch.zeros(6))
    ours = MatryoshkaLoss(build_loss("mnrl", "pairs", 24), dims, weights)(u, torch.cat([v, w]), torch.arange(6))
    assert abs(ours.item() - expected.item()) < 1e-6


def test_inside_adaptive_layers_it_is_sentence_transformers_matryoshka_2d_loss(tiny_bert):
    """Every layer and every size (n_layers_per_step and n_dims_per_step -1 there), so neither side draws."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    st = SentenceTransformer(modules=[Transformer(tiny_bert, max_seq_length=32), Pooling(32, pooling_mode="mean")],
                             device="cpu").eval()
    theirs = losses.Matryoshka2dLoss(st, losses.CosineSimilarityLoss(st), [32, 16, 8], n_layers_per_step=-1,
                                     n_dims_per_step=-1)
    with torch.no_grad():
        expected = theirs([st.tokenize(FIRST), st.tokenize(SECOND)], SCORES)
    model = build_sentence_encoder(tiny_bert, None, "mean").eval()
    tokenizer = load_tokenizer(tiny_bert)
    ids, mask = pad([tokenizer(s)["input_ids"] for s in FIRST + SECOND], tokenizer.pad_token_id, torch.device("cpu"))
    depth = model.encoder.config.num_hidden_layers
    with torch.no_grad():
        vectors = LayerVectors(model, [*range(depth), depth])(ids, mask)
        ours = AdaptiveLayerLoss(MatryoshkaLoss(CosineMSELoss(), [32, 16, 8]))(vectors[:4], vectors[4:], SCORES)
        whole = AdaptiveLayerLoss(CosineMSELoss())(vectors[:4], vectors[4:], SCORES)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert float(ours - whole) > 1e-3  # the smaller sizes count


def test_a_step_draws_its_sizes_from_its_seed_and_a_reseed_draws_the_same():
    calls = []

    def inner(u, v, target):
        calls.append(u.shape[-1])
        return u.sum() * 0

    loss = MatryoshkaLoss(inner, [8, 4, 2, 1], per_step=2)
    u = torch.randn(3, 8)
    drawn = []
    for step in range(30):
        loss.reseed(f"0/1/{step}")
        calls.clear()
        loss(u, u, torch.zeros(3))
        drawn.append(tuple(calls))
    assert all(len(d) == 2 and d[0] > d[1] for d in drawn) and len(set(drawn)) > 3
    loss.reseed("0/1/7")
    calls.clear()
    loss(u, u, torch.zeros(3))
    assert tuple(calls) == drawn[7]


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir):
    return {"model": tiny_bert, "task": "stsb", "epochs": 1, "lr": 1e-3, "batch_size": 16, "max_train_samples": 64,
            "max_eval_samples": 40, "data_dir": str(synthetic_data_dir), "device": "cpu",
            "matryoshka_dims": [32, 16, 4]}


def test_a_trial_scores_every_size_and_with_adaptive_layers_every_layer_and_size(config):
    final = get_kind("finetune").run(config, collect([]))
    assert final["dim32_test_spearman"] == pytest.approx(final["test_spearman"], abs=1e-9)  # the whole vector
    assert math.isfinite(final["dim4_test_spearman"]) and final["dim4_test_spearman"] != pytest.approx(
        final["dim32_test_spearman"], abs=1e-6)
    assert not any(key.startswith("layer") for key in final)
    both = get_kind("finetune").run({**config, "adaptive_layers": True}, collect([]))
    for layer in range(4):
        for dims in (32, 16, 4):
            assert math.isfinite(both[f"layer{layer}_dim{dims}_dev_spearman"]), (layer, dims)
    assert both["layer3_dim32_test_spearman"] == pytest.approx(both["test_spearman"], abs=1e-9)
    assert both["layer1_test_spearman"] == pytest.approx(both["layer1_dim32_test_spearman"], abs=1e-9)


@pytest.mark.parametrize(("change", "key", "message"), [
    ({"matryoshka_dims": [32, 32]}, "train.matryoshka_dims", "give distinct sizes of at least 1"),
    ({"matryoshka_dims": [64, 16]}, "train.matryoshka_dims", "the model's vectors have 32 dimensions"),
    ({"matryoshka_dims": [8, 4], "projection_dim": 8}, None, None),
    ({"matryoshka_weights": [1.0, 2.0]}, "train.matryoshka_weights", "give one weight per size of matryoshka_dims (3)"),
    ({"matryoshka_dims_per_step": 4}, "train.matryoshka_dims_per_step", "draw at most 3"),
    ({"postprocess": "whiten"}, "train.matryoshka_dims", "use train.postprocess: none with it"),
    ({"matryoshka_dims": None, "matryoshka_weights": [1.0]}, "train.matryoshka_weights", "is read only with "
                                                                                          "train.matryoshka_dims"),
])
def test_what_cannot_apply_is_one_line(config, change, key, message):
    cfg = FinetuneConfig(**{**config, **change})
    if key is None:
        check_matryoshka(cfg, lambda name: f"train.{name}")
        return
    with pytest.raises(UserInputError) as caught:
        check_matryoshka(cfg, lambda name: f"train.{name}")
    assert caught.value.key == key and message in caught.value.fix, str(caught.value)
