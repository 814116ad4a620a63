"""The plugin authors' kit checks objectives and poolings: every built-in one passes, and one broken
in each way the kit names fails with that name (a kit that passes everything would check nothing)."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from orchestrator.testing.components import check_objective, check_pooling
from trainables.objectives import BUILTIN as BUILTIN_OBJECTIVES
from trainables.objectives import Objective
from trainables.poolings import BUILTIN as BUILTIN_POOLINGS
from trainables.poolings import Pooling


@pytest.mark.parametrize("name", list(BUILTIN_OBJECTIVES))
def test_every_built_in_objective_passes_the_kit(name):
    check_objective(name)


@pytest.mark.parametrize("name", list(BUILTIN_POOLINGS))
def test_every_built_in_pooling_passes_the_kit(name):
    check_pooling(name)


class DetachedLoss(nn.Module):
    """Trains nothing: the vectors are detached before the loss."""

    def __init__(self, dim: int):
        super().__init__()

    def forward(self, u, v, target):
        return (nn.functional.cosine_similarity(u.detach(), v.detach()) - target).square().mean()


class UnseededLoss(nn.Module):
    """Draws its head from a generator of its own, not torch's seeded one."""

    def __init__(self, dim: int):
        super().__init__()
        generator = torch.Generator().manual_seed(random.randrange(2**31))
        self.scale = nn.Parameter(torch.randn(1, generator=generator))

    def forward(self, u, v, target):
        return (self.scale * nn.functional.cosine_similarity(u, v) - target).square().mean()


class TargetBlindLoss(nn.Module):
    """Ignores the target: it pulls every pair together."""

    def __init__(self, dim: int):
        super().__init__()

    def forward(self, u, v, target):
        return (1 - nn.functional.cosine_similarity(u, v)).mean()


class PaddedMeanPooling(nn.Module):
    """Averages every position, padding included."""

    def __init__(self, dim: int):
        super().__init__()

    def forward(self, hidden, mask):
        return hidden.mean(dim=1)


class TokenPooling(nn.Module):
    """Returns the token states unpooled."""

    def __init__(self, dim: int):
        super().__init__()

    def forward(self, hidden, mask):
        return hidden * mask.unsqueeze(-1)


@pytest.mark.parametrize(("broken", "message"), [
    (Objective("sts", "tests.orchestrator.test_kit:DetachedLoss"), "no gradient reaches u or v"),
    (Objective("sts", "tests.orchestrator.test_kit:UnseededLoss"),
     "built twice under one seed, its parameter scale differs"),
    (Objective("pair_classification", "tests.orchestrator.test_kit:TargetBlindLoss"),
     "another target gave the same loss"),
])
def test_the_kit_fails_a_broken_objective_naming_what_broke(broken, message):
    with pytest.raises(AssertionError, match=message):
        check_objective(broken)


@pytest.mark.parametrize(("broken", "message"), [
    (Pooling("tests.orchestrator.test_kit:PaddedMeanPooling"), "states under the padding changed the pooled vectors"),
    (Pooling("tests.orchestrator.test_kit:TokenPooling"), r"expected shape \(4, 16\), got \(4, 7, 16\)"),
])
def test_the_kit_fails_a_broken_pooling_naming_what_broke(broken, message):
    with pytest.raises(AssertionError, match=message):
        check_pooling(broken)
