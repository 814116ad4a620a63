"""The example plugin passes the orchestrator's kit, and computes what sentence-transformers does:
its loss equals `ContrastiveLoss` on the same batch and embeddings, its pooling equals
`Pooling(pooling_mode="weightedmean")` on the same token states, to 1e-6."""

from __future__ import annotations

import pytest
import torch
from orchestrator_plugin_example import CONTRASTIVE, WEIGHTED_MEAN

from orchestrator.testing.components import check_objective, check_pooling


def test_the_objective_passes_the_kit():
    check_objective(CONTRASTIVE)


def test_the_pooling_passes_the_kit():
    check_pooling(WEIGHTED_MEAN)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_loss_equals_sentence_transformers_contrastive_loss(seed):
    from sentence_transformers.sentence_transformer.losses import ContrastiveLoss, SiameseDistanceMetric

    generator = torch.Generator().manual_seed(seed)
    u, v = torch.randn(32, 24, generator=generator), torch.randn(32, 24, generator=generator)
    v[:8] = u[:8] + 0.05 * torch.randn(8, 24, generator=generator)  # some pairs within the margin
    labels = torch.randint(0, 2, (32,), generator=generator)
    reference = ContrastiveLoss(model=None, distance_metric=SiameseDistanceMetric.COSINE_DISTANCE, margin=0.5)
    expected = reference.compute_loss_from_embeddings([u, v], labels)
    ours = CONTRASTIVE.build(24)(u, v, labels)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    assert expected.item() > 0


def test_the_pooling_equals_sentence_transformers_weighted_mean():
    from sentence_transformers.sentence_transformer.modules import Pooling

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 9, 16, generator=generator)
    right = torch.tensor([[1] * n + [0] * (9 - n) for n in (9, 4, 6, 1, 7)])
    left = torch.tensor([[0] * (9 - n) + [1] * n for n in (9, 4, 6, 1, 7)])
    reference = Pooling(16, pooling_mode="weightedmean")
    ours = WEIGHTED_MEAN.build(16)
    for mask in (right, left):
        expected = reference({"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
        torch.testing.assert_close(ours(hidden, mask), expected, atol=1e-6, rtol=0)
    assert not torch.allclose(ours(hidden, right), hidden[:, :1].mean(dim=1))  # it is not the first token either
