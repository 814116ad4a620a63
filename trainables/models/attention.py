"""Evaluation's attention on a CPU: two matmuls around an fp32 softmax instead of SDPA's fused kernel.

On a CPU, torch's fused attention kernel (flash attention for CPUs) is built for long sequences;
on sentences (MiniLM: head size 32, STS-B test's sentences 5-46 tokens, median 12) it took 25 %
of an evaluation for 0.9 % of its FLOPs, as benchmarks/profile_step.py splits it. Here the scores
are one batched matmul, the softmax and the weighted sum a second one, all in fp32 from the inputs
as they come (under bf16 autocast, bf16 values: their products are exact in fp32), the output
rounded once to the inputs' dtype. In fp32 that is the kernel's result to rounding (about 1e-6);
in bf16 it is the exact result rounded once, closer to it than the kernel (which rounds its
probabilities to bf16 on the way). Attention is about 1 % of an encoder's FLOPs on sentences, so
fp32 there costs little. Used only in evaluation (no dropout, no attention probabilities asked
for) and only on a CPU: CUDA's fused kernels are fast on short sequences, so there SDPA runs.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainables.models import padding_free

INFERENCE = "sdpa_cpu_inference"


def runs_unfused(module: nn.Module, query: torch.Tensor, key: torch.Tensor, dropout: float, kwargs: dict) -> bool:
    """Whether this call is evaluation attention on a CPU of an encoder (not causal, one key head per
    query head, no probabilities returned)."""
    return (query.device.type == "cpu" and not module.training and dropout == 0.0
            and not kwargs.get("output_attentions") and not kwargs.get("is_causal")
            and not getattr(module, "is_causal", False) and key.shape[1] == query.shape[1])


SHORT_ROW = 16  # keys per row below which torch's CPU softmax left its vectorized path (measured: 15 slow, 16 fast)


def softmax_(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension, in place when no gradient is asked for. torch's CPU softmax
    vectorizes along a row; on rows shorter than 16 (a chunk of sentences under 16 tokens, most of STS-B)
    it ran 6-9x slower than three passes over the whole tensor (max, exp, divide by the sum) on the 2-core
    Intel Xeon with AVX-512 and AMX: at 4,096 tokens x 12 heads, 4.3 ms against 0.64 ms for rows of 12,
    0.36 ms against 0.63 for rows of 16 (where torch's is kept). The same formula, exp(x - max) / sum, to an
    fp32 rounding."""
    if scores.shape[-1] >= SHORT_ROW or scores.device.type != "cpu" or (torch.is_grad_enabled()
                                                                       and scores.requires_grad):
        return torch.softmax(scores, dim=-1)
    scores = scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


def fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
    """q, k and v as one (3, batch, heads, tokens, head size) fp32 tensor from one copy, when they are the
    head-split slices of one (batch, tokens, 3 x width) output (evaluation's fused projections,
    trainables.models.packed); None otherwise."""
    if query.dim() != 4 or not (query.shape == key.shape == value.shape):
        return None
    batch, heads, tokens, size = query.shape
    width = heads * size
    strides, start = (tokens * 3 * width, size, 3 * width, 1), query.storage_offset()

    def laid_out(t: torch.Tensor, offset: int) -> bool:  # a size-1 dimension's stride is anything
        return (t.dtype == query.dtype and t.storage_offset() == start + offset
                and t.untyped_storage().data_ptr() == query.untyped_storage().data_ptr()
                and all(n == 1 or got == want for n, got, want in zip(t.shape, t.stride(), strides, strict=True)))

    if not all(laid_out(t, i * width) for i, t in enumerate((query, key, value))):
        return None
    rows = query.as_strided((batch, tokens, 3, heads, size), (tokens * 3 * width, 3 * width, width, size, 1))
    # `.contiguous()`: in fp32 `.to` may hand back the permuted view itself (a size-1 dimension's stride)
    return rows.permute(2, 0, 3, 1, 4).to(torch.float32, memory_format=torch.contiguous_format).contiguous()


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
           scaling: float | None = None, position_bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v as (batch, heads, queries, head size) in fp32. The inputs are
    converted and laid out for the matmuls in one copy each, or one for all three when they are slices
    of one fused projection (q, k, v come as transposed views)."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    with torch.autocast(query.device.type, enabled=False):
        if (together := fused(query, key, value)) is not None:
            query, key, value = together.unbind(0)
        else:
            query, key, value = (t.to(torch.float32, memory_format=torch.contiguous_format)
                                 for t in (query, key, value))
        scores = torch.matmul(query, key.transpose(-2, -1)).mul_(scale)
        if position_bias is not None:
            scores = scores.add_(position_bias.float())
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                # a finite floor, not -inf: a row with no key left (none in an encoder's padding mask) stays finite
                scores = scores.masked_fill_(~attention_mask, torch.finfo(torch.float32).min)
            else:
                scores = scores.add_(attention_mask[..., : key.shape[-2]].float())
        return torch.matmul(softmax_(scores), value)


def unfused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None,
                      position_bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v as (batch, heads, queries, head size), in fp32, rounded once to q's dtype."""
    return attend(query, key, value, attention_mask, scaling, position_bias).to(query.dtype)


# SDPA's backends on CUDA without cuDNN's: cuDNN's kernel (torch's first choice on an H200 with a mask) plans anew
# for every shape it has not seen, and a sentence batch's padded length changes from batch to batch. Measured on
# an H200 (benchmarks/sdpa_training.py, torch 2.11, bf16, 64 sentences of 8-60 tokens, forward and backward):
# 103 ms a batch the first time its shape came, 0.84 ms the second; a decoder's causal 64-512 tokens 264 ms
# against 0.84. A MiniLM `finetune` step without dropout (benchmarks/fused.py --dropout none) ran 379 pairs/s at
# batch 32 with torch's choice and 1,058 without cuDNN (1,855 and 4,318 at batch 128). A list: sdpa_kernel
# refuses a tuple.
NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def backends(device_type: str) -> contextlib.AbstractContextManager:
    """The backends SDPA may choose on `device_type`: NO_CUDNN's on CUDA, torch's choice elsewhere."""
    return sdpa_kernel(NO_CUDNN) if device_type == "cuda" else contextlib.nullcontext()


def sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attention_mask: torch.Tensor | None, **kwargs):
    """transformers' SDPA attention; on CUDA among NO_CUDNN's backends."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with backends(query.device.type):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              position_bias: torch.Tensor | None = None, **kwargs):
    """transformers' SDPA attention, unfused in evaluation on a CPU (as above); training, CUDA and
    anything else (dropout with torch's masks, a decoder, grouped-query heads) call SDPA (`sdpa`: on CUDA
    without cuDNN's backend). A packed row (trainables.models.padding_free) goes through its groups here."""
    if (plan := kwargs.get(padding_free.PLAN)) is not None:
        return padding_free.attention(module, query, key, value, plan, attention, dropout, scaling, **kwargs)
    if runs_unfused(module, query, key, dropout, kwargs):
        output = attend(query, key, value, attention_mask, scaling, position_bias)  # rounded once, laid out once:
        return output.transpose(1, 2).to(query.dtype, memory_format=torch.contiguous_format), None
    return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                position_bias=position_bias, **kwargs)


def use_inference_attention(model: nn.Module) -> bool:
    """Route an encoder's SDPA attention through `attention` (evaluation unfused on a CPU, training as
    before); True when it did (the model runs SDPA through transformers' attention interface)."""
    config = getattr(model, "config", None)
    if (config is None or getattr(config, "_attn_implementation", None) != "sdpa"
            or not getattr(model, "_supports_attention_backend", False)):
        return False
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(INFERENCE, attention)
    AttentionMaskInterface.register(INFERENCE, sdpa_mask)
    model.set_attn_implementation(INFERENCE)
    return True
