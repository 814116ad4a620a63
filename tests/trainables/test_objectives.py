from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainables.errors import UserInputError
from trainables.objectives import OBJECTIVES, build_loss


def _vectors():
    torch.manual_seed(0)
    return torch.randn(6, 8), torch.randn(6, 8)


def _brute_force_cosent(similarity, target, scale=20.0):
    terms = [math.exp(scale * (similarity[i] - similarity[j]))
             for i in range(len(target)) for j in range(len(target)) if target[i] < target[j]]
    return math.log(1 + sum(terms))


def test_cosine_mse_is_the_mse_of_cosines():
    u, v = _vectors()
    target = torch.linspace(0, 1, 6)
    expected = ((F.cosine_similarity(u, v) - target) ** 2).mean()
    torch.testing.assert_close(build_loss("cosine_mse", "sts", 8)(u, v, target), expected)


def test_cosent_matches_its_definition_and_rewards_the_right_order():
    u, v = _vectors()
    target = torch.tensor([0.1, 0.9, 0.4, 0.4, 0.7, 0.0])
    loss = build_loss("cosent", "sts", 8)(u, v, target)
    expected = _brute_force_cosent(F.cosine_similarity(u, v).tolist(), target.tolist())
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    ordered = build_loss("cosent", "sts", 8)(u, v, F.cosine_similarity(u, v))
    assert ordered.item() < loss.item()


def test_angle_uses_the_same_ranking_on_angle_similarity():
    from sentence_transformers.util import pairwise_angle_sim

    u, v = _vectors()
    target = torch.tensor([0.1, 0.9, 0.4, 0.3, 0.7, 0.0])
    expected = _brute_force_cosent(pairwise_angle_sim(u, v).tolist(), target.tolist())
    assert build_loss("angle", "sts", 8)(u, v, target).item() == pytest.approx(expected, rel=1e-5)


def test_classification_objectives_train_their_own_parameters():
    u, v = _vectors()
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    softmax = build_loss("softmax", "classification", 8)
    assert sum(p.numel() for p in softmax.parameters()) == 3 * 8 * 2 + 2
    logits = softmax.classifier(torch.cat([u, v, (u - v).abs()], dim=-1))
    torch.testing.assert_close(softmax(u, v, labels), F.cross_entropy(logits, labels))
    bce = build_loss("cosine_bce", "classification", 8)  # the paper's: the raw cosine is the logit
    assert list(bce.parameters()) == []
    expected = F.binary_cross_entropy_with_logits(F.cosine_similarity(u, v), labels.float())
    torch.testing.assert_close(bce(u, v, labels), expected)
    affine = build_loss("cosine_bce_affine", "classification", 8)
    expected = F.binary_cross_entropy_with_logits(20 * F.cosine_similarity(u, v) - 10, labels.float())
    torch.testing.assert_close(affine(u, v, labels), expected)
    affine(u, v, labels).backward()
    assert affine.weight.grad is not None and affine.bias.grad is not None


def test_loss_must_suit_the_task_and_exist():
    assert set(OBJECTIVES) == {"cosine_mse", "cosent", "angle", "softmax", "cosine_bce", "cosine_bce_affine", "mnrl",
                               "mnrl_symmetric", "gte", "cached_mnrl", "gist", "softmax_nli"}
    with pytest.raises(UserInputError, match="train.loss: 'cosine_mse' is not valid; it trains sts tasks; "
                                             "for a classification task use one of: softmax, cosine_bce, "
                                             "cosine_bce_affine"):
        build_loss("cosine_mse", "classification", 8)
    with pytest.raises(UserInputError, match="use one of: angle, cached_mnrl, cosent, cosine_bce, cosine_bce_affine, "
                                             "cosine_mse, gist, gte, mnrl, mnrl_symmetric, softmax, softmax_nli"):
        build_loss("mse", "sts", 8)
