"""Evaluation's packed linear layers on a CPU (trainables.models.packed): torch's numbers in fp32,
autocast's rounding in bf16, the feed-forward's GELU fused, only in inference, modules restored."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from trainables.evaluation import evaluators
from trainables.evaluation.evaluators import Embedder
from trainables.models import attention
from trainables.models.batching import TokenCache
from trainables.models.encoder import build_sentence_encoder, load_tokenizer
from trainables.models.packed import available, packed_linears

CPU = torch.device("cpu")
real_fused = attention.fused
pytestmark = pytest.mark.skipif(not available(torch.float32), reason="this torch has no oneDNN packed linear")


def overridden(model: nn.Module) -> set[str]:
    """Names of the modules whose forward is an instance attribute (replaced) now."""
    return {name for name, m in model.named_modules() if "forward" in vars(m)}


class Intermediate(nn.Module):
    """A transformer block's feed-forward as BERT's and MPNet's *Intermediate modules write it."""

    def __init__(self, dense: nn.Linear, act: nn.Module):
        super().__init__()
        self.dense, self.intermediate_act_fn = dense, act

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden))


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 70), width=st.integers(1, 48), out=st.integers(1, 48), bias=st.booleans(),
       three_d=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_in_fp32_a_packed_linear_is_torchs(rows, width, out, bias, three_d, seed):
    """Any shape, with or without bias, 2-d or 3-d input: F.linear's result to 1e-5."""
    generator = torch.Generator().manual_seed(seed)
    layer = nn.Linear(width, out, bias=bias)
    x = torch.randn(*((rows, 3) if three_d else (rows,)), width, generator=generator)
    with torch.inference_mode():
        expected = layer(x)
        with packed_linears(layer, CPU) as packed:
            got = layer(x)
    assert packed and overridden(layer) == set()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not available(torch.bfloat16), reason="oneDNN has no bf16 on this CPU")
def test_under_bf16_autocast_it_rounds_as_autocast_and_fuses_gelu_before_the_one_rounding():
    """A linear: autocast's bf16 output to one bf16 rounding (oneDNN's packed and plain kernels may sum
    in another order on another CPU, so bit equality is the CPU's, not the code's). The feed-forward
    (dense then erf GELU): GELU on the fp32 accumulator, rounded once, so its mean error against float64
    is below autocast's (rounded twice)."""
    torch.manual_seed(0)
    layer = nn.Linear(384, 1536)
    x = torch.randn(512, 384)
    block = Intermediate(layer, nn.GELU())
    exact = nn.functional.gelu(nn.functional.linear(x.bfloat16().double(), layer.weight.bfloat16().double(),
                                                    layer.bias.bfloat16().double()))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain_linear, plain_block = layer(x), block(x)
        with packed_linears(layer, CPU):
            packed_linear = layer(x)
        with packed_linears(block, CPU) as packed:
            assert packed and overridden(block) == {""}  # the block as one call, its dense not apart
            packed_block = block(x)
    assert packed_linear.dtype == packed_block.dtype == torch.bfloat16
    # within one bf16 unit in the last place of autocast's output (2**-7 of its size): a result rounded
    # twice or computed in bf16 would be off by several
    torch.testing.assert_close(packed_linear.float(), plain_linear.float(), rtol=2**-7, atol=1e-6)
    errors = {name: (out.double() - exact).abs().mean().item() for name, out in
              (("packed", packed_block), ("autocast", plain_block), ("rounded once", exact.bfloat16()))}
    assert errors["packed"] == pytest.approx(errors["rounded once"], rel=0.05), errors
    assert errors["packed"] < 0.9 * errors["autocast"], errors


def test_it_leaves_alone_what_it_cannot_run():
    """Gradients on, a Linear subclass, a tanh GELU (the linear packed, the activation apart): unchanged."""

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Linear(4, 4), Scaled(4, 4))
    with packed_linears(model, CPU) as packed:  # gradients enabled: training
        assert not packed and overridden(model) == set()
    with torch.inference_mode(), packed_linears(model, CPU) as packed:
        assert packed and overridden(model) == {"0"}
    block = Intermediate(nn.Linear(4, 4), nn.GELU(approximate="tanh"))
    with torch.inference_mode(), packed_linears(block, CPU):
        assert overridden(block) == {"dense"}
    with torch.inference_mode(), packed_linears(nn.Sequential(nn.ReLU()), CPU) as packed:
        assert not packed


def test_an_error_inside_restores_every_module(tiny_bert):
    model = build_sentence_encoder(tiny_bert)
    with pytest.raises(RuntimeError, match="boom"), torch.inference_mode(), packed_linears(model, CPU):
        assert len(overridden(model)) > 4
        raise RuntimeError("boom")
    assert overridden(model) == set()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_encoder_embeds_as_without_packing(tiny_bert, dtype, monkeypatch):
    """A BERT encoder through the evaluator's Embedder, packed against plain: fp32 to 1e-5, bf16 within
    its rounding; every feed-forward fused (one override per block, none on its dense)."""
    if dtype == torch.bfloat16 and not available(dtype):
        pytest.skip("oneDNN has no bf16 on this CPU")
    model = build_sentence_encoder(tiny_bert).eval()
    tokens = TokenCache(load_tokenizer(tiny_bert), 32)
    sentences = ["a man plays a guitar", "two dogs run on the beach", "a man plays a guitar", "it rains"]
    embed = Embedder(model, tokens, CPU, dtype)
    seen = []
    real = evaluators.packed_linears

    @contextlib.contextmanager
    def spying(module, device):
        with real(module, device) as packed:
            seen.append((packed, overridden(module)))
            yield packed

    monkeypatch.setattr(evaluators, "packed_linears", spying)
    one_copy = []
    monkeypatch.setattr(attention, "fused", lambda *qkv: one_copy.append(real_fused(*qkv)) or one_copy[-1])
    packed = embed(sentences)
    # every layer's attention laid out its query, key and value in one copy from the fused projection
    assert len(one_copy) == model.encoder.config.num_hidden_layers and all(t is not None for t in one_copy)
    # a block's matmuls: query, key and value as one, the attention's output, the feed-forward (GELU fused), its
    # output; then BERT's pooler (on the first token); the three distinct sentences are one chunk
    assert linear_calls(lambda: embed(sentences)) == 4 * model.encoder.config.num_hidden_layers + 1
    monkeypatch.setattr(evaluators, "packed_linears", lambda module, device: contextlib.nullcontext(False))
    plain = embed(sentences)
    (used, names), *_ = seen
    layers = model.encoder.config.num_hidden_layers
    assert used and sum(n.endswith("intermediate") for n in names) == layers
    assert not any(n.endswith("intermediate.dense") for n in names) and overridden(model) == set()
    torch.testing.assert_close(packed, plain, atol=1e-5 if dtype == torch.float32 else 3e-2, rtol=0)
    assert torch.equal(packed[0], packed[2])


def test_only_on_an_x86_64_cpu(monkeypatch):
    """oneDNN's packed path is measured on x86-64 only: an ARM machine keeps torch's linear layers."""
    monkeypatch.setattr("platform.machine", lambda: "arm64")
    assert not available(torch.float32)
    with torch.inference_mode(), packed_linears(nn.Linear(4, 4), CPU) as packed:
        assert not packed


class BertSelfAttention(nn.Module):
    """An attention module's projections as BERT names them, called in `order` on one input."""

    def __init__(self, width: int, outs: tuple[int, int, int] = (8, 8, 8), bias: bool = True):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(width, out, bias=bias) for out in outs)

    def forward(self, hidden: torch.Tensor, order: str = "qkv") -> list[torch.Tensor]:
        layers = {"q": self.query, "k": self.key, "v": self.value}
        return [layers[name](hidden) for name in order]


def linear_calls(run) -> int:
    """How many oneDNN packed matmuls `run()` makes (torch's profiler counts them)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return sum(e.count for e in profile.key_averages() if e.key == "mkldnn::_linear_pointwise")


@settings(max_examples=25, deadline=None)
@given(order=st.sampled_from(["qkv", "vkq", "kqv", "qqkv", "qk", "v"]), outs=st.tuples(*[st.integers(1, 24)] * 3),
       bias=st.booleans(), rows=st.integers(1, 40), seed=st.integers(0, 2 ** 16))
def test_query_key_and_value_on_one_input_are_one_matmul_with_each_ones_numbers(order, outs, bias, rows, seed):
    """In any order of calls, each projection gives F.linear's result (fp32, 1e-5); the calls on one input
    after the first take their slice of its one matmul (a second call of the same layer computes again)."""
    torch.manual_seed(seed)
    attention = BertSelfAttention(12, outs, bias)
    x = torch.randn(rows, 3, 12)
    with torch.inference_mode():
        expected = attention(x, order)
        with packed_linears(attention, CPU) as packed:
            got = attention(x, order)
            calls = linear_calls(lambda: attention(x, order))
    assert packed and overridden(attention) == set()
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    seen, expected_calls = set(), 0
    for name in order:  # a matmul whenever the layer's slice was taken already (or none was computed)
        if not seen or name in seen:
            expected_calls, seen = expected_calls + 1, set()
        seen.add(name)
    assert calls == expected_calls


def test_projections_on_different_inputs_or_widths_are_computed_apart():
    """A key called on another tensor (even an equal one) computes again; layers of different input widths
    are packed one by one."""
    torch.manual_seed(0)
    attention = BertSelfAttention(6)
    x, y = torch.randn(5, 6), torch.randn(5, 6)
    with torch.inference_mode():
        expected = [attention.query(x), attention.key(y), attention.value(x.clone())]
        with packed_linears(attention, CPU):
            got = [attention.query(x), attention.key(y), attention.value(x.clone())]
            calls = linear_calls(lambda: [attention.query(x), attention.key(y), attention.value(x.clone())])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert calls == 3
    mixed = BertSelfAttention(6)
    mixed.value = nn.Linear(7, 8)
    with torch.inference_mode(), packed_linears(mixed, CPU):
        assert linear_calls(lambda: [mixed.query(x), mixed.key(x)]) == 2


def test_only_attention_modules_read_to_call_their_projections_on_one_input_back_to_back_are_fused():
    """Each class in FUSED_ATTENTIONS (as this transformers writes it) calls query, key and value on
    `hidden_states` on three consecutive lines; a module of any other name keeps three matmuls."""
    import importlib
    import inspect
    import re

    from trainables.models.packed import FUSED_ATTENTIONS

    back_to_back = re.compile(r"self\.(query|q)\(hidden_states\)[^\n]*\n[^\n]*self\.(key|k)\(hidden_states\)"
                              r"[^\n]*\n[^\n]*self\.(value|v)\(hidden_states\)")
    families = {"Bert": "bert", "Roberta": "roberta", "XLMRoberta": "xlm_roberta", "Electra": "electra",
                "Camembert": "camembert", "MPNet": "mpnet"}
    assert {f"{family}SelfAttention" for family in families} == FUSED_ATTENTIONS
    for family, module in families.items():
        cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"),
                      f"{family}SelfAttention")
        assert back_to_back.search(inspect.getsource(cls.forward)), cls

    class OtherAttention(BertSelfAttention):
        pass

    x = torch.randn(5, 12)
    other = OtherAttention(12)
    with torch.inference_mode(), packed_linears(other, CPU):
        assert linear_calls(lambda: other(x)) == 3
