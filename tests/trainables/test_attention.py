"""Evaluation's unfused attention on a CPU (trainables.models.attention): SDPA's numbers, its
rounding in bf16, only where it is meant to run, and the same scores as the fused kernel."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from trainables.data.tasks import load_task
from trainables.evaluation.evaluators import Embedder, STSEvaluator
from trainables.models.attention import INFERENCE, attend, attention, fused, softmax_, unfused_attention
from trainables.models.batching import TokenCache
from trainables.models.dropout import ATTENTION
from trainables.models.encoder import build_sentence_encoder, load_encoder, load_tokenizer


def module(training: bool = False) -> nn.Module:
    block = nn.Module()
    block.train(training)
    block.is_causal = False
    return block


def inputs(batch: int, heads: int, length: int, size: int, lengths: list[int], dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, size, generator=generator).to(dtype) for _ in range(3))
    keys = torch.arange(length)[None, :] < torch.as_tensor(lengths)[:, None]
    return q, k, v, keys[:, None, None, :].expand(batch, 1, length, length)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 5), heads=st.integers(1, 4), length=st.integers(1, 24), size=st.sampled_from([8, 32, 64]),
       data=st.data(), additive=st.booleans(), bias=st.booleans())
def test_in_fp32_it_is_sdpa_to_rounding(batch, heads, length, size, data, additive, bias):
    """Any padding (each sentence keeps at least one token), a boolean or additive mask, with or
    without a position bias (MPNet's kind): the fused kernel's output to 2e-6."""
    lengths = data.draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch))
    q, k, v, mask = inputs(batch, heads, length, size, lengths)
    position = torch.randn(1, heads, length, length) if bias else None
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    fused_mask = mask if position is None else (
        torch.where(mask, position, torch.finfo(torch.float32).min) if mask.dtype == torch.bool else mask + position)
    fused = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=fused_mask)
    ours = unfused_attention(q, k, v, mask, position_bias=position)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, fused, atol=2e-6, rtol=0)


def test_in_bf16_it_is_the_exact_result_rounded_once():
    """Against the exact result of the same bf16 inputs (float64), on sentence shapes (64 sentences
    of 5-32 tokens, 12 heads of 32): the unfused output is that result rounded to bf16 once (the
    same mean error), closer than the fused kernel's; rounding the scores to bf16 before the
    softmax (the obvious two-bf16-matmul version) would be worse than both."""
    lengths = [5 + (7 * i) % 28 for i in range(64)]
    q, k, v, mask = inputs(64, 12, 32, 32, lengths, torch.bfloat16)
    exact = torch.softmax((q.double() @ k.double().transpose(-2, -1) / 32 ** 0.5).masked_fill(~mask, -torch.inf),
                          -1) @ v.double()
    fused = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ours = unfused_attention(q, k, v, mask)
    bf16_scores = torch.softmax((q @ k.transpose(-2, -1) * 32 ** -0.5).float().masked_fill(~mask, -torch.inf),
                                -1).bfloat16() @ v
    valid = mask[:, 0, 0, :, None].expand(64, 32, 32)[:, None].expand(64, 12, 32, 32)  # the real query rows
    error = {name: (out.double() - exact)[valid].abs().mean().item() for name, out in (
        ("rounded once", exact.bfloat16()), ("fused", fused), ("ours", ours), ("bf16 scores", bf16_scores))}
    assert ours.dtype == torch.bfloat16
    assert error["ours"] == pytest.approx(error["rounded once"], rel=1e-3), error
    assert error["ours"] < 0.9 * error["fused"] < 0.9 * error["bf16 scores"], error


def test_it_runs_only_in_evaluation_on_a_cpu():
    """Training (torch's dropout), a causal module and returned probabilities go to SDPA unchanged:
    with a rate of 1 SDPA's dropout zeroes everything, which the unfused path never does."""
    q, k, v, mask = inputs(2, 2, 5, 8, [5, 3])
    evaluated, _ = attention(module(False), q, k, v, mask, dropout=0.0)
    assert evaluated.abs().sum() > 0
    trained, _ = attention(module(True), q, k, v, mask, dropout=1.0)
    assert torch.count_nonzero(trained) == 0
    causal = module(False)
    causal.is_causal = True
    with pytest.MonkeyPatch.context() as patch:
        calls = []
        patch.setattr("trainables.models.attention.attend",
                      lambda *args, **kw: calls.append(args) or attend(*args, **kw))
        attention(causal, q, k, v, None)
        attention(module(False), q, k, v, mask, output_attentions=True)
        attention(module(False), q, k[:, :1], v[:, :1], mask)  # grouped-query heads
        assert calls == []
        attention(module(False), q, k, v, mask)
        assert len(calls) == 1


def test_on_cuda_sdpa_chooses_among_every_backend_but_cudnns():
    """cuDNN's SDPA plans anew for every shape (103 ms a new sentence batch shape on an H200, 0.84 ms a seen
    one): on CUDA the choice is flash, memory-efficient and math. The CUDA choice entered here (the CPU's
    SDPA runs inside it) gives SDPA's own result and leaves torch's settings as they were afterwards."""
    from torch.nn.attention import SDPBackend

    from trainables.models.attention import NO_CUDNN, backends

    assert SDPBackend.CUDNN_ATTENTION not in NO_CUDNN
    assert set(NO_CUDNN) == {SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH}
    q, k, v, mask = inputs(2, 2, 5, 8, [5, 3])
    before = torch.backends.cuda.cudnn_sdp_enabled()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with backends("cuda"):
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with backends("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_a_trial_on_cuda_turns_cudnns_attention_off_for_its_whole_process():
    """What does not call SDPA through `sdpa` (a model in another attention, a plugin's module) is covered
    by the trial's process setting: a CUDA trial turns cuDNN's SDPA off; a CPU trial leaves it as it was."""
    from trainables.runtime import without_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        without_cudnn_attention(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        without_cudnn_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_an_encoder_evaluates_as_with_sdpa_and_trains_through_it(tiny_bert):
    ours = load_encoder(tiny_bert)
    sdpa = load_encoder(tiny_bert)
    sdpa.set_attn_implementation("sdpa")
    assert ours.config._attn_implementation == INFERENCE
    ids = torch.tensor([[101, 2023, 2003, 102, 0, 0], [101, 2178, 6251, 2182, 1012, 102]])
    mask = (ids != 0).long()
    with torch.no_grad():
        ours.eval(), sdpa.eval()
        torch.testing.assert_close(ours(ids, mask).last_hidden_state, sdpa(ids, mask).last_hidden_state,
                                   atol=1e-5, rtol=0)
        ours.train(), sdpa.train()
        torch.manual_seed(4)
        trained = ours(ids, mask).last_hidden_state
        torch.manual_seed(4)
        assert torch.equal(trained, sdpa(ids, mask).last_hidden_state)  # training: SDPA itself, its masks


def scores_by_kernel(model_name: str, splits: dict, dropout_masks: str, max_length: int) -> dict[str, dict]:
    """Every metric of every split, scored in fp32 (scoring's default) with our kernel and with SDPA's fused one."""
    tokens = TokenCache(load_tokenizer(model_name), max_length)
    scores = {}
    for kernel in ("ours", "sdpa"):
        model = build_sentence_encoder(model_name, dropout_masks=dropout_masks)
        assert model.encoder.config._attn_implementation in (INFERENCE, ATTENTION)
        if kernel == "sdpa":
            model.encoder.set_attn_implementation("sdpa")
        embed = Embedder(model, tokens, torch.device("cpu"), torch.float32)
        evaluator = STSEvaluator(splits)
        scores[kernel] = {k: v for split in splits for k, v in evaluator.evaluate(embed, split).items()}
    return scores


@pytest.mark.parametrize("dropout_masks", ["fast", "torch"])
def test_scores_equal_the_fused_kernels_in_fp32(tiny_bert, data_dir, dropout_masks):
    """Dev and test Spearman and Pearson (300 STS-B pairs each) of an encoder scored in fp32 with the
    unfused kernel equal the fused kernel's to 1e-4 (as fractions), whichever dropout masks it trains with."""
    data = load_task("stsb", data_folder=str(data_dir), max_eval_samples=300)
    scores = scores_by_kernel(tiny_bert, {"dev": data.dev, "test": data.test}, dropout_masks, 64)
    assert len(scores["ours"]) == 4 and all(0 < abs(v) < 100 for v in scores["sdpa"].values())
    for metric, value in scores["sdpa"].items():
        assert abs(scores["ours"][metric] - value) / 100 <= 1e-4, metric


@pytest.mark.slow
def test_minilm_scores_stsb_as_the_fused_kernel_and_sentence_transformers_do(data_dir, minilm_path):
    """all-MiniLM-L6-v2 on the whole of STS-B dev and test, fp32: dev and test Spearman and Pearson
    with our kernel equal the fused kernel's and sentence-transformers' (fp32) to 1e-4. ~30 s."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from tests.conftest import MINILM

    data = load_task("stsb", data_folder=str(data_dir))
    splits = {"dev": data.dev, "test": data.test}
    scores = scores_by_kernel(MINILM, splits, "fast", 128)
    peer = SentenceTransformer(str(minilm_path), device="cpu")
    peer.max_seq_length = 128
    for split, frame in splits.items():
        theirs = EmbeddingSimilarityEvaluator(list(frame.sentence1), list(frame.sentence2), list(frame.score))(peer)
        for metric in ("spearman", "pearson"):
            ours = scores["ours"][f"{split}_{metric}"] / 100
            assert ours == pytest.approx(scores["sdpa"][f"{split}_{metric}"] / 100, abs=1e-4)
            assert ours == pytest.approx(theirs[f"{metric}_cosine"], abs=1e-4)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 4), heads=st.integers(1, 4), length=st.integers(1, 12), size=st.sampled_from([1, 8, 32]),
       bf16=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_slices_of_one_fused_projection_are_converted_in_one_copy_to_the_same_numbers(batch, heads, length, size,
                                                                                     bf16, seed):
    """q, k and v as BERT's attention makes them from one fused (batch, tokens, 3 x width) projection: one copy
    lays out all three (the copy bit for bit), and the output is that of three copies to fp32 rounding (not bit
    for bit: which kernel a CPU picks for each layout is its own choice; an AMD EPYC with AVX512-BF16 and one
    without AVX-512 differed in the last bits); q, k, v from separate tensors, or slices in another order, take
    three copies."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    generator = torch.Generator().manual_seed(seed)
    width = heads * size
    output = torch.randn(batch, length, 3 * width, generator=generator).to(dtype)
    q, k, v = (part.view(batch, length, heads, size).transpose(1, 2) for part in output.split(width, dim=-1))
    mask = (torch.arange(length)[None, :] < torch.randint(1, length + 1, (batch, 1), generator=generator))
    mask = mask[:, None, None, :]
    together = fused(q, k, v)
    assert together is not None and together.dtype == torch.float32 and together.is_contiguous()
    assert all(torch.equal(t, x.float()) for t, x in zip(together.unbind(0), (q, k, v), strict=True))
    apart = [x.clone() for x in (q, k, v)]
    assert fused(*apart) is None and fused(k, q, v) is None and fused(q, k, q) is None
    torch.testing.assert_close(attend(q, k, v, mask), attend(*apart, mask), rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 30), keys=st.integers(1, 40), spread=st.sampled_from([1e-3, 1.0, 30.0]),
       masked=st.sampled_from(["none", "min", "-inf"]), seed=st.integers(0, 2 ** 16))
def test_softmax_on_short_rows_is_torchs_to_rounding(rows, keys, spread, masked, seed):
    """Rows of any length (the short ones computed apart, in place), masked keys as evaluation masks them
    (fp32's minimum) or as training does (-inf), each row keeping one key: torch's softmax to 1e-6."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, 3, keys, generator=generator) * spread
    if masked != "none":
        drop = torch.rand(rows, 3, keys, generator=generator) < 0.4
        drop[..., 0] = False
        scores = scores.masked_fill(drop, torch.finfo(torch.float32).min if masked == "min" else float("-inf"))
    expected = torch.softmax(scores, dim=-1)
    with torch.inference_mode():
        given_in = scores.clone()
        got = softmax_(given_in)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert (got.data_ptr() == given_in.data_ptr()) == (keys < 16)  # short rows: in place, no new tensor


def test_softmax_with_a_gradient_asked_for_is_torchs():
    """With a gradient asked for, short rows take torch's softmax (not the in-place passes): the input left
    as it was, torch's probabilities bit for bit, and its gradient."""
    scores = torch.randn(4, 2, 12, requires_grad=True)
    given = scores * 1.0
    probs = softmax_(given)
    assert torch.equal(given, scores.detach()) and probs.data_ptr() != given.data_ptr()
    assert torch.equal(probs, torch.softmax(scores.detach(), dim=-1))
    (probs * torch.arange(12.0)).sum().backward()
    reference = scores.detach().clone().requires_grad_()
    (torch.softmax(reference, dim=-1) * torch.arange(12.0)).sum().backward()
    torch.testing.assert_close(scores.grad, reference.grad)
