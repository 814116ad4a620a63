"""Gradient clipping: torch's clip_grad_norm_ to the bit, without its multiply by 1.0 when nothing is clipped;
a word-embedding gradient kept row by row normed on its written rows only, torch's to an fp32 rounding.

Bit equality is the feature here and holds on any CPU: on a CPU torch's get_total_norm takes each gradient's
torch.linalg.vector_norm and then the norm of those (foreach is for accelerators), and clip_grads_with_norm_
is torch's own; ours calls the same kernels on the same tensors in the same order."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainables import runtime
from trainables.runtime import clip_gradients


def parameters_with_gradients(shapes: list[tuple[int, ...]], scale: float, seed: int, none_at: int | None):
    generator = torch.Generator().manual_seed(seed)
    params = []
    for index, shape in enumerate(shapes):
        p = torch.nn.Parameter(torch.zeros(shape))
        if index != none_at:
            p.grad = torch.randn(shape, generator=generator) * scale
        params.append(p)
    return params


def copies(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple), min_size=1, max_size=5),
       scale=st.sampled_from([1e-4, 0.05, 0.3, 1.0, 3.0, 50.0]), max_norm=st.sampled_from([0.1, 1.0, 5.0]),
       seed=st.integers(0, 1000), none_at=st.one_of(st.none(), st.integers(0, 4)))
def test_clipping_is_torchs_to_the_bit(shapes, scale, max_norm, seed, none_at):
    ours = parameters_with_gradients(shapes, scale, seed, none_at)
    theirs = copies(ours)
    total = clip_gradients(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    if all(p.grad is None for p in theirs):
        assert float(total) == 0.0
        return
    assert torch.equal(total, expected)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)
    if float(expected) > max_norm * 1.001:  # clipped: the norm after is max_norm
        after = torch.nn.utils.get_total_norm([p.grad for p in ours if p.grad is not None])
        assert float(after) == pytest.approx(max_norm, rel=1e-4)


def test_within_the_norm_no_gradient_is_touched(monkeypatch):
    params = parameters_with_gradients([(30, 8), (8,)], 0.01, 0, None)
    before = [p.grad.clone() for p in params]
    calls = []
    monkeypatch.setattr(runtime.torch.nn.utils, "clip_grads_with_norm_", lambda *a, **k: calls.append(a))
    total = clip_gradients(params, 1.0)
    assert calls == []
    assert 0 < float(total) < 1.0
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before, strict=True))
    clip_gradients(parameters_with_gradients([(30, 8)], 10.0, 0, None), 1.0)
    assert len(calls) == 1  # beyond the norm: torch's clipping runs


def test_a_non_finite_norm_clips_as_torchs_does():
    ours = parameters_with_gradients([(4, 3), (5,)], 1.0, 1, None)
    ours[0].grad[0, 0] = math.inf
    theirs = copies(ours)
    total = clip_gradients(ours, 1.0)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isinf(float(total)) and math.isinf(float(expected))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(ours[1].grad, torch.zeros(5))  # an infinite norm: coefficient 0
    ours = parameters_with_gradients([(4, 3)], 1.0, 2, None)
    ours[0].grad[1, 1] = math.nan
    theirs = copies(ours)
    clip_gradients(ours, 1.0), torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.isnan(ours[0].grad).all() and torch.isnan(theirs[0].grad).all()  # a NaN norm: NaN everywhere


def test_a_torch_without_the_two_functions_clips_with_clip_grad_norm(monkeypatch):
    """torch 2.4 and 2.5 (the requirement allows them) have neither get_total_norm nor clip_grads_with_norm_."""
    ours = parameters_with_gradients([(6, 5), (5,)], 10.0, 3, None)
    theirs = copies(ours)
    monkeypatch.delattr(runtime.torch.nn.utils, "get_total_norm")
    monkeypatch.delattr(runtime.torch.nn.utils, "clip_grads_with_norm_")
    total = clip_gradients(ours, 1.0)
    assert torch.equal(total, torch.nn.utils.clip_grad_norm_(theirs, 1.0)) and float(total) > 1.0
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs, strict=True))


def test_a_row_wise_embedding_gradient_is_normed_on_the_rows_its_lookups_wrote(monkeypatch):
    """The word-embedding gradient kept row by row (trainables.models.embedding_grad) is zero outside
    the rows its lookups wrote, so its norm reads only those: the total norm and the clipped gradients
    are torch's to an fp32 rounding, step after step (a step's rows reset at the next), within the norm
    and beyond it; the norm never reads the whole table. A dense gradient from another use of the table
    (a tied output layer) puts every row in play: then the whole table is read, torch's to the bit."""
    from torch import nn

    from trainables.models.embedding_grad import RowGradEmbedding

    torch.manual_seed(0)
    embedding = RowGradEmbedding.replacing(nn.Embedding(1000, 16, padding_idx=0))
    head = nn.Linear(16, 4)
    read = []
    vector_norm = torch.linalg.vector_norm
    monkeypatch.setattr(torch.linalg, "vector_norm", lambda t, *a, **k: read.append(tuple(t.shape))
                        or vector_norm(t, *a, **k))
    steps = [(torch.tensor([[5, 7, 7, 0], [999, 3, 0, 0]]), 0.1, False), (torch.tensor([[8, 5, 2]]), 10.0, False),
             (torch.tensor([[4, 4]]), 0.1, True), (torch.tensor([[6, 1, 0]]), 0.1, False)]
    for ids, scale, tied in steps:
        hidden = embedding(ids)
        loss = (head(hidden) * scale).pow(2).sum()
        if tied:  # logits against the table itself: a dense gradient on every row
            loss = loss + (hidden @ embedding.weight.t()).sum()
        loss.backward()
        params = [embedding.weight, *head.parameters()]
        theirs = copies(params)
        read.clear()
        total = clip_gradients(params, 1.0)
        expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        written = len(set(ids.flatten().tolist()) - {0})
        if tied:
            assert torch.equal(total, expected) and (1000, 16) in read
        else:
            assert float(total) == pytest.approx(float(expected), rel=1e-6)
            assert (written, 16) in read and (1000, 16) not in read
        assert (float(expected) > 1.0) == (scale > 1.0 or tied)  # the tied logits' sum alone is beyond 1.0
        for ours, torchs in zip(params, theirs, strict=True):
            torch.testing.assert_close(ours.grad, torchs.grad, rtol=1e-6, atol=1e-9)
        for p in params:
            p.grad = None
