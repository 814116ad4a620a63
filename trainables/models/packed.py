"""Evaluation's linear layers on a CPU: oneDNN's packed weights, the feed-forward's GELU fused in.

A plain `nn.Linear` on a CPU hands its weight to oneDNN in torch's row-major layout on every call
(and under bf16 autocast casts it to bf16 first, on every call). Here, for the length of one
encoding, each weight is cast and reordered once into oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's freezing does for a CPU), and every call
runs `torch.ops.mkldnn._linear_pointwise` on it: at the shapes of an evaluation chunk (4,096 tokens,
384 <-> 1,536) the fp32 matmul ran 1.17x and the bf16 one 1.05-1.10x faster on the 2-core EPYC
(benchmarks/profile_step.py splits an evaluation). A transformer block's feed-forward (`dense`
then an exact GELU, BERT's and MPNet's `*Intermediate`) runs as one call with GELU as the matmul's
post-op, so its 4,096 x 1,536 activation is written once, not twice. An attention module's query, key
and value layers (in the transformers classes of FUSED_ATTENTIONS, whose forward calls them back to
back on one tensor) run as one packed matmul on their stacked weights: one conversion of the block's
fp32 input to bf16 instead of three, and their outputs are slices of one tensor that evaluation's
attention lays out for its matmuls in one copy (trainables.models.attention.fused).

Same numbers: in fp32 the packed matmul is torch's result (the same oneDNN kernel, 0 difference in
a test) and the fused GELU within 3e-6 of the separate one; under bf16 autocast the input and
weight are rounded to bf16 as autocast rounds them, the GELU is applied to the fp32 accumulator
before the one rounding (autocast rounds twice). Only in inference (no autograd through these
ops), only on a CPU with oneDNN, only for exact `nn.Linear` modules in fp32 or bf16; anything
else (an ARM CPU included), and any torch without these ops, runs unchanged. The modules are
restored on leaving. Cost: one copy of the linear weights while an encoding runs (MiniLM 43 MB in
fp32, MPNet 342 MB).
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator

import torch
from torch import nn

PACK_HINT = 4096  # the rows a packed weight expects (an evaluation chunk's tokens); any other count works


def available(dtype: torch.dtype) -> bool:
    """Whether this torch has oneDNN's packed linear for `dtype` (fp32; bf16 where oneDNN supports it)
    on an x86-64 CPU (oneDNN's own kernels; on ARM torch's matmul goes through other libraries, and
    this path is neither measured nor meant there)."""
    ops = getattr(torch.ops, "mkldnn", None)
    if (platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available()
            or ops is None):
        return False
    try:
        ops._reorder_linear_weight, ops._linear_pointwise  # noqa: B018 (looked up: absent ops raise)
    except (AttributeError, RuntimeError):
        return False
    if dtype == torch.bfloat16:
        return bool(getattr(ops, "_is_mkldnn_bf16_supported", lambda: False)())
    return dtype == torch.float32


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype `F.linear` would compute this weight's matmul in: autocast's where it is on, else the weight's."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return weight.dtype


def is_exact_gelu(module: nn.Module) -> bool:
    """erf GELU as `nn.GELU()` or transformers' GELUActivation compute it (not the tanh approximation)."""
    if isinstance(module, nn.GELU):
        return module.approximate == "none"
    return type(module).__name__ == "GELUActivation" and getattr(module, "act", None) is nn.functional.gelu


def packed_matmul(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, post_op: str = "none"):
    """hidden @ weightᵀ + bias as a forward, on `weight` cast to `dtype` and packed once; `post_op` "gelu"
    fuses erf GELU."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), PACK_HINT)
    bias = None if bias is None else bias.detach().to(dtype)
    algorithm = "none" if post_op == "gelu" else ""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden.to(dtype), packed, bias, post_op, [], algorithm)

    return forward


def packed_forward(linear: nn.Linear, dtype: torch.dtype, post_op: str = "none"):
    """A forward for `linear` on its weight cast to `dtype` and packed once; `post_op` "gelu" fuses erf GELU."""
    return packed_matmul(linear.weight, linear.bias, dtype, post_op)


PROJECTIONS = (("query", "key", "value"), ("q", "k", "v"))  # BERT-family and MPNet attention's linear layers
# transformers' attention modules whose forward calls its query, key and value layers one after the other on
# the same hidden states, writing nothing in between (a test reads each forward): there a projection may take
# its slice of a matmul made for the same tensor a call before, which no version counter could vouch for (an
# inference tensor has none)
FUSED_ATTENTIONS = frozenset({"BertSelfAttention", "RobertaSelfAttention", "XLMRobertaSelfAttention",
                              "ElectraSelfAttention", "CamembertSelfAttention", "MPNetSelfAttention"})


def projections(module: nn.Module) -> list[nn.Linear] | None:
    """An attention module's query, key and value linear layers, when the module is one of FUSED_ATTENTIONS
    and they are plain `nn.Linear`s of one input width with biases alike (what one packed weight can compute
    together); else None."""
    if type(module).__name__ not in FUSED_ATTENTIONS:
        return None
    for names in PROJECTIONS:
        linears = [getattr(module, name, None) for name in names]
        if (all(type(linear) is nn.Linear for linear in linears)
                and len({linear.in_features for linear in linears}) == 1
                and len({linear.bias is None for linear in linears}) == 1):
            return linears
    return None


def fused_projections(linears: list[nn.Linear], dtype: torch.dtype) -> list:
    """Forwards for an attention's query, key and value layers on one packed weight (theirs stacked): the
    first call with an input computes all three in one matmul, and a call of another with that same input
    (the same tensor object, as an attention module passes it to each) takes its slice. A call with any
    other input computes again, so any order of calls is right; only the three calls on one input cost one."""
    matmul = packed_matmul(torch.cat([m.weight.detach() for m in linears]),
                           None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears]), dtype)
    sizes = [m.out_features for m in linears]
    computed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def projection(index: int):
        def forward(hidden: torch.Tensor) -> torch.Tensor:
            entry = computed.get(index)
            if entry is None or entry[0] is not hidden:
                for i, part in enumerate(matmul(hidden).split(sizes, dim=-1)):
                    computed[i] = (hidden, part)
            return computed.pop(index)[1]

        return forward

    return [projection(i) for i in range(len(linears))]


@contextlib.contextmanager
def packed_linears(model: nn.Module, device: torch.device) -> Iterator[bool]:
    """Within: `model`'s linear layers run on packed weights (see the module's docstring); yields
    whether they do. Call it inside `torch.inference_mode()` and the autocast the encoding runs under."""
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    if (device.type != "cpu" or torch.is_grad_enabled() or not linears
            or any(m.weight.device.type != "cpu" for m in linears)):
        yield False
        return
    dtype = compute_dtype(linears[0].weight)
    if not available(dtype) or any(compute_dtype(m.weight) != dtype for m in linears):
        yield False
        return
    replaced: list[nn.Module] = []
    try:
        fused = set()
        for module in model.modules():
            dense, act = getattr(module, "dense", None), getattr(module, "intermediate_act_fn", None)
            if (type(dense) is nn.Linear and act is not None and is_exact_gelu(act)
                    and {id(c) for c in module.children()} == {id(dense), id(act)}):
                module.forward = packed_forward(dense, dtype, "gelu")  # act(dense(h)) in one call
                replaced.append(module)
                fused.add(id(dense))
            if (together := projections(module)) is not None:  # no attention module is also a feed-forward
                for linear, forward in zip(together, fused_projections(together, dtype), strict=True):
                    linear.forward = forward
                    replaced.append(linear)
                    fused.add(id(linear))
        for linear in linears:
            if id(linear) not in fused:
                linear.forward = packed_forward(linear, dtype)
                replaced.append(linear)
        yield True
    finally:
        for module in replaced:
            del module.forward  # the class's forward again
