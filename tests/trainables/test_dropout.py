"""`dropout_masks: fast`: Bernoulli masks from 15-bit integer draws, the same rate and scale as
torch's dropout, reproducible from the seed, and the same attention math as SDPA's."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from trainables.models.attention import INFERENCE
from trainables.models.dropout import (
    ATTENTION,
    FastDropout,
    attention,
    effective_p,
    fast_dropout,
    keep_mask,
    use_fast_dropout,
)
from trainables.models.encoder import build_sentence_encoder, load_encoder


def test_the_rate_is_p_rounded_to_a_multiple_of_1_32768():
    assert effective_p(0.1) == 3277 / 32768 and abs(effective_p(0.1) - 0.1) < 1e-5
    assert effective_p(0.5) == 0.5 and effective_p(0.0) == 0.0


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_masks_keep_each_element_with_probability_one_minus_p_in_every_quarter_of_a_word(p):
    """Four elements share a 64-bit word; the top quarter has one random bit fewer (random_ on int64
    draws from [0, 2^63)). Without masking that bit off, three quarters would keep ~(1 - p) / 2."""
    torch.manual_seed(0)
    n = 4 * 250_000
    mask = keep_mask((n,), p)
    sigma = math.sqrt(p * (1 - p) / (n / 4))
    for quarter in range(4):
        kept = mask[quarter::4].double().mean().item()
        assert abs(kept - (1 - effective_p(p))) < 5 * sigma, (quarter, kept)
    # neighbours are independent: P(both kept) = (1 - p)^2
    both = (mask[0::2] & mask[1::2]).double().mean().item()
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / (n / 2))


@pytest.mark.parametrize("p", [1e-9, 1.5e-5])
def test_a_rate_that_rounds_to_zero_drops_nothing(p):
    """Below 1/65536 the threshold is 0: every element is kept (15 bits of 32767 plus one would
    wrap around in int16 and drop about one element in 32768)."""
    torch.manual_seed(0)
    assert effective_p(p) == 0.0 and bool(keep_mask((1_000_000,), p).all())


def test_the_seed_draws_the_masks():
    torch.manual_seed(7)
    first = keep_mask((64, 33, 384), 0.1)
    torch.manual_seed(7)
    again = keep_mask((64, 33, 384), 0.1)
    torch.manual_seed(8)
    other = keep_mask((64, 33, 384), 0.1)
    assert torch.equal(first, again) and not torch.equal(first, other)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), p=st.floats(0.0, 0.95),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_dropout_zeroes_or_scales_every_element_and_its_gradient_alike(shape, p, dtype):
    torch.manual_seed(0)
    x = (torch.rand(shape) + 0.5).to(dtype).requires_grad_()
    out = fast_dropout(x, p)
    assert out.shape == x.shape and out.dtype == dtype
    scale = 1 / (1 - effective_p(p)) if p > 0 else 1.0
    ratio = (out / x).detach().float()
    kept = ratio != 0
    rtol = 2e-2 if dtype == torch.bfloat16 else 1e-5  # bf16: the scale, the product and the ratio rounded
    assert torch.allclose(ratio[kept], torch.full_like(ratio[kept], scale), rtol=rtol)
    out.sum().backward()
    assert torch.allclose(x.grad.float(), ratio, rtol=rtol)
    assert torch.equal(fast_dropout(x, p, training=False), x)


def test_dropout_keeps_the_expected_activation():
    torch.manual_seed(0)
    out = fast_dropout(torch.ones(1_000_000), 0.1)
    assert abs(out.mean().item() - 1.0) < 5 * math.sqrt(0.1 / 0.9 / 1_000_000)
    assert abs((out == 0).double().mean().item() - 0.1) < 0.002


def test_dropout_runs_under_torch_compile_and_drops_at_its_rate():
    """benchmarks/profile_step.py --compile: a graph that handed back an int16 view of its int64 random
    words failed in AOT autograd's alias replay (torch 2.13); under compile the mask is a new tensor."""
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(16, 16), FastDropout(0.25)).train()
    compiled = torch.compile(layer, dynamic=True)
    for length in (8, 11):
        x = torch.randn(64, length, 16, requires_grad=True)
        out = compiled(x)
        out.sum().backward()
        kept = out != 0
        assert abs(kept.double().mean().item() - 0.75) < 5 * math.sqrt(0.25 * 0.75 / out.numel())
        dense = layer[0](x).detach()  # kept elements scaled by 1 / (1 - p), gradient where kept
        assert torch.allclose(out.detach()[kept], dense[kept] / 0.75, rtol=1e-5, atol=1e-6)
        expected = (kept.float() / 0.75) @ layer[0].weight.detach()  # the gradient flows only where kept
        assert torch.allclose(x.grad, expected, rtol=1e-4, atol=1e-5)


def fake_module(training: bool) -> nn.Module:
    module = nn.Module()
    module.train(training)
    module.is_causal = False
    return module


def padded_inputs(seed: int = 0):
    torch.manual_seed(seed)
    q, k, v = (torch.randn(3, 2, 6, 8) for _ in range(3))
    lengths = torch.tensor([6, 4, 2])
    keys = torch.arange(6)[None, :] < lengths[:, None]
    return q, k, v, keys[:, None, None, :].expand(3, 1, 6, 6)


@pytest.mark.parametrize("as_float", [False, True])
def test_training_attention_is_sdpa_math_with_these_masks(as_float):
    """With a rate that rounds to 0 the training path keeps everything: it must equal SDPA's own
    output, padding mask (boolean or additive) included; with p = 0.1 it is softmax, this
    dropout, times v."""
    q, k, v, mask = padded_inputs()
    if as_float:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    sdpa = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    ours, _ = attention(fake_module(True), q, k, v, mask, dropout=1e-9)
    assert torch.allclose(ours, sdpa, atol=1e-5)
    evaluated, _ = attention(fake_module(False), q, k, v, mask, dropout=0.1)
    assert torch.allclose(evaluated, sdpa, atol=1e-6)
    torch.manual_seed(3)
    dropped, _ = attention(fake_module(True), q, k, v, mask, dropout=0.1)
    torch.manual_seed(3)
    keep = keep_mask((3, 2, 6, 6), 0.1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    scores = scores.masked_fill(~padded_inputs()[3], float("-inf"))
    expected = ((scores.softmax(-1) * keep / (1 - effective_p(0.1))) @ v).transpose(1, 2)
    assert torch.allclose(dropped, expected, atol=1e-5)


def test_in_bf16_the_training_path_rounds_exactly_as_sdpa_math_does():
    """SDPA's math path (the one that drops) computes bf16 inputs in fp32 and rounds the output
    once; so does ours, under autocast too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, mask = (t.bfloat16() if t.is_floating_point() else t for t in padded_inputs(1))
    with sdpa_kernel(SDPBackend.MATH):
        sdpa = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = attention(fake_module(True), q, k, v, mask, dropout=1e-9)
    # the fp32 products may be summed in another order by another CPU's kernels, so an element near a
    # bf16 rounding boundary may round the other way: one bf16 step (2**-7 of its size) at most, and
    # nearly all equal; a second rounding (bf16 products, as autocast's matmul would make) is off by several
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), sdpa.float(), rtol=2**-7, atol=1e-6)
    assert (ours == sdpa).float().mean() > 0.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_attention_gradients_are_sdpa_maths(dtype):
    """Forward and backward through the training path (inputs as the transposed views an encoder
    passes, a padding mask, a rate that keeps everything) against SDPA's math path: the same output
    and the same gradients; the probabilities come back only when asked for, as SDPA's do not."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(2)
    leaves = [torch.randn(3, 6, 2, 8, dtype=dtype, requires_grad=True) for _ in range(3)]  # (batch, len, heads, d)
    mask = padded_inputs()[3]
    upstream = torch.randn(3, 6, 2, 8).to(dtype)
    results = []
    for ours in (True, False):
        for leaf in leaves:
            leaf.grad = None
        q, k, v = (leaf.transpose(1, 2) for leaf in leaves)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            if ours:
                output, probabilities = attention(fake_module(True), q, k, v, mask, dropout=1e-9)
                assert probabilities is None and output.is_contiguous()
            else:
                with sdpa_kernel(SDPBackend.MATH):
                    output = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
        output.backward(upstream)
        results.append((output.detach(), [leaf.grad for leaf in leaves]))
    (ours_out, ours_grads), (sdpa_out, sdpa_grads) = results
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert ours_out.dtype == dtype and torch.allclose(ours_out.float(), sdpa_out.float(), atol=tolerance)
    for mine, theirs in zip(ours_grads, sdpa_grads, strict=True):
        assert torch.allclose(mine.float(), theirs.float(), atol=tolerance), float((mine - theirs).abs().max())
    _, asked = attention(fake_module(True), *(leaf.transpose(1, 2) for leaf in leaves), mask, dropout=1e-9,
                         output_attentions=True)
    assert asked is not None and asked.shape == (3, 2, 6, 6)


def test_an_encoder_swaps_every_dropout_and_evaluates_exactly_as_before(tiny_bert):
    plain = load_encoder(tiny_bert).eval()
    fast = load_encoder(tiny_bert, dropout_masks="fast").eval()
    assert fast.config._attn_implementation == ATTENTION
    dropouts = [m for m in fast.modules() if isinstance(m, nn.Dropout)]
    assert len(dropouts) == 1 + 3 * 3 and all(type(m) is FastDropout for m in dropouts)  # embeddings + 3 per block
    ids = torch.tensor([[101, 2023, 2003, 102, 0, 0], [101, 2178, 6251, 2182, 1012, 102]])
    mask = (ids != 0).long()
    with torch.no_grad():  # in evaluation both run the same inference attention and no dropout: the same kernels
        assert torch.equal(plain(ids, mask).last_hidden_state, fast(ids, mask).last_hidden_state)
    fast.train()
    torch.manual_seed(1)
    first = fast(ids, mask).last_hidden_state
    torch.manual_seed(1)
    assert torch.equal(first, fast(ids, mask).last_hidden_state)  # the seed draws every mask
    assert not torch.allclose(first, plain(ids, mask).last_hidden_state)


def test_torch_masks_stay_available_and_a_wrong_name_is_one_line(tiny_bert):
    from trainables.errors import UserInputError

    model = build_sentence_encoder(tiny_bert, 2, dropout_masks="torch")
    assert not any(isinstance(m, FastDropout) for m in model.modules())
    assert model.encoder.config._attn_implementation == INFERENCE  # SDPA in training, unfused evaluation on a CPU
    with pytest.raises(UserInputError, match="dropout_masks"):
        load_encoder(tiny_bert, dropout_masks="fastest")
    count = use_fast_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.2)))
    assert count == 1
