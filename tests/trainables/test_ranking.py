"""The in-batch-negatives objectives against sentence-transformers' own MultipleNegativesRankingLoss on the
same embeddings (the reference implementation, 6.2), with and without hard negatives, and their gradients."""

from __future__ import annotations

import pytest
import torch

from trainables.errors import UserInputError
from trainables.objectives import build_loss, check_loss

losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

VARIANTS = {  # ours -> sentence-transformers' settings
    "mnrl": {},
    "mnrl_symmetric": {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"},
    "gte": {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"), "partition_mode": "joint"},
}


def _columns(batch: int, negatives: int, dim: int = 24, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, dim, generator=generator, dtype=torch.float64) for _ in range(2 + negatives)]


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("negatives", [0, 1, 2])
@pytest.mark.parametrize("scale", [20.0, 7.5])
def test_each_variant_equals_sentence_transformers_loss_and_gradient(name, negatives, scale):
    columns = _columns(6, negatives)
    theirs = losses.MultipleNegativesRankingLoss(torch.nn.Identity(), scale=scale, **VARIANTS[name])
    mine = build_loss(name, "pairs", 24)
    mine.scale = scale
    ours_in = [c.clone().requires_grad_() for c in columns]
    their_in = [c.clone().requires_grad_() for c in columns]
    ours = mine(ours_in[0], torch.cat(ours_in[1:]), torch.arange(6))
    reference = theirs.compute_loss_from_embeddings(their_in, torch.zeros(6))
    assert abs(ours.item() - reference.item()) < 1e-6
    ours.backward()
    reference.backward()
    for a, b in zip(ours_in, their_in, strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-9)


def test_the_positive_is_what_lowers_the_loss():
    anchors, positives = _columns(5, 0)
    loss = build_loss("mnrl", "pairs", 24)
    assert loss(anchors, anchors.clone(), torch.arange(5)) < loss(anchors, positives, torch.arange(5))
    rolled = torch.arange(5).roll(1)  # each anchor's positive named one row off: a different, higher loss
    assert loss(anchors, anchors.clone(), rolled) > loss(anchors, anchors.clone(), torch.arange(5))


def test_a_pairs_loss_on_an_sts_task_names_train_data():
    with pytest.raises(UserInputError) as caught:
        check_loss("mnrl", "sts", "task stsb")
    assert caught.value.key == "train.loss" and "train_data" in caught.value.fix


def test_candidates_that_are_not_whole_columns_are_refused():
    anchors, positives = _columns(4, 0)
    with pytest.raises(ValueError, match="whole columns"):
        build_loss("mnrl", "pairs", 24)(anchors, positives[:3], torch.arange(4))


class _Columns(torch.nn.Module):
    """A stand-in SentenceTransformer whose 'features' carry its embeddings under `key` (the guide reads its own)."""

    def __init__(self, key: str, tokenizer):
        super().__init__()
        self.key, self.tokenizer, self.max_seq_length = key, tokenizer, 128

    def forward(self, features):
        return {"sentence_embedding": features[self.key]}


@pytest.mark.parametrize("negatives", [0, 1])
@pytest.mark.parametrize(("strategy", "margin"), [("absolute", 0.0), ("absolute", 0.1), ("relative", 0.05)])
def test_gist_equals_sentence_transformers_gist_embed_loss(tiny_bert, negatives, strategy, margin):
    from trainables.models.encoder import load_tokenizer

    tokenizer = load_tokenizer(tiny_bert)
    generator = torch.Generator().manual_seed(1)
    columns = [torch.randn(6, 24, generator=generator, dtype=torch.float64) for _ in range(2 + negatives)]
    guide = [c + 0.8 * torch.randn(6, 24, generator=generator, dtype=torch.float64) for c in columns]
    guide[1][2] = guide[0][4]  # the guide sees anchor 4's twin among the positives: a false negative to mask
    theirs = losses.GISTEmbedLoss(_Columns("embedding", tokenizer), _Columns("guide", tokenizer),
                                  margin_strategy=strategy, margin=margin)
    expected = theirs([{"embedding": c, "guide": g} for c, g in zip(columns, guide, strict=True)], torch.zeros(6))
    mine = build_loss("gist", "pairs", 24)
    mine.strategy, mine.margin = strategy, margin
    mine.guide = (guide[0], torch.cat(guide[1:]))
    ours = mine(columns[0], torch.cat(columns[1:]), torch.arange(6))
    assert abs(ours.item() - expected.item()) < 1e-6
    unguided = build_loss("gist", "pairs", 24)
    unguided.guide = (columns[0], torch.cat(columns[1:]))  # the model as its own guide: another loss
    assert abs(unguided(columns[0], torch.cat(columns[1:]), torch.arange(6)).item() - ours.item()) > 1e-3
