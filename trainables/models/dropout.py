"""Dropout whose masks cost a fraction of torch's on a CPU (`dropout_masks: fast`, the default).

torch's CPU dropout draws one Bernoulli variate per element (`bernoulli_`: 14 % of a MiniLM
training step on the 2-core benchmark machine, as benchmarks/profile_step.py splits it). Here one
64-bit random word gives four elements their 15 random bits each, and an element is kept when its
bits are at least round(p * 2^15): a Bernoulli(1 - p') mask with p' = round(p * 32768) / 32768
(0.1 -> 0.100006, exact for p = 0, 0.5 and every multiple of 1/32768), scaled by 1 / (1 - p') so
that the expected activation is unchanged, as torch's is by 1 / (1 - p). The masks come from torch's generator, so
the same seed draws the same masks (a different stream from `bernoulli_`'s: `dropout_masks: torch`
reproduces runs made before this existed).

Applied by swapping the encoder's `nn.Dropout` modules (embeddings, after attention and after the
feed-forward of every block; MPNet's attention probabilities too) and, for encoders whose attention
runs fused (BERT's SDPA, which applies its own `bernoulli_` dropout to the attention
probabilities), by an attention function that computes the same math with these masks in training
and evaluates as trainables.models.attention does (unfused on a CPU, the fused kernel elsewhere)."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainables.models import padding_free
from trainables.models.attention import attention as inference_attention
from trainables.models.attention import sdpa

BITS = 15
LEVELS = 1 << BITS  # 32768
ATTENTION = "sdpa_fast_dropout"
# Training attention that drops nothing, on CUDA: the explicit math below (True) or SDPA's kernel (False)
EXPLICIT_TRAINING_ON_CUDA = False


def explicit_without_dropout(module: nn.Module, query: torch.Tensor) -> bool:
    """Whether a training call that drops nothing takes the explicit math rather than SDPA's kernel."""
    return EXPLICIT_TRAINING_ON_CUDA and module.training and query.device.type == "cuda"


def keep_threshold(p: float) -> int:
    return round(p * LEVELS)


def effective_p(p: float) -> float:
    """The drop probability the masks have: p rounded to a multiple of 1/32768."""
    return keep_threshold(p) / LEVELS


def keep_indicator(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu",
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """int16 ones where an element is kept (probability 1 - effective_p(p)), zeros elsewhere."""
    n = 1
    for size in shape:
        n *= int(size)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(generator=generator)
    # random_() on int64 is uniform on [0, 2^63): the low 63 bits are uniform; each 16-bit quarter
    # keeps its low 15 bits (the top quarter's 16th bit is always 0)
    bits = words.view(torch.int16)[:n].view(shape)
    # in place in eager; under torch.compile a new tensor (a graph handing back an int16 view of its int64
    # input failed in AOT autograd's alias replay, torch 2.13)
    bits = bits & (LEVELS - 1) if torch.compiler.is_compiling() else bits.bitwise_and_(LEVELS - 1)
    threshold = keep_threshold(p)
    if threshold == 0:  # p below 1/65536 drops nothing (and 32767 - (0 - 1) would overflow int16)
        return bits.fill_(1)
    # bits >= t as 0/1 without a boolean tensor (bool -> float conversions are not vectorized on CPU)
    return bits.sub_(threshold - 1).clamp_(0, 1)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu",
              generator: torch.Generator | None = None) -> torch.Tensor:
    """A boolean mask, True where an element is kept (probability 1 - effective_p(p))."""
    return keep_indicator(shape, p, device, generator).bool()


def fast_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    mask = keep_indicator(x.shape, p, x.device).to(x.dtype).mul_(1.0 / (1.0 - effective_p(p)))
    return x * mask


class FastDropout(nn.Dropout):
    """nn.Dropout with the masks above; `.p` is the configured rate (attention code reads it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_dropout(x, self.p, self.training)


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              position_bias: torch.Tensor | None = None, **kwargs):
    """transformers' SDPA attention, with the attention probabilities' dropout drawn as above: in
    training, softmax(q · scale kᵀ + mask), dropped, times v, in fp32 (the math SDPA does, in the
    same order and precision); without dropout, the fused kernel itself. With `output_attentions`
    (miCSE) the probabilities are returned as eager attention returns them (after dropout), so a
    miCSE run draws the same masks as a SimCSE run of the same seed. A packed row
    (trainables.models.padding_free) goes through its groups here, each drawn as a padded batch."""
    dropout = dropout if module.training else 0.0
    if (plan := kwargs.get(padding_free.PLAN)) is not None:
        return padding_free.attention(module, query, key, value, plan, attention, dropout, scaling, **kwargs)
    if dropout == 0.0 and not kwargs.get("output_attentions") and not explicit_without_dropout(module, query):
        # evaluation: unfused on a CPU, else SDPA's kernel
        return inference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling,
                                   position_bias=position_bias, **kwargs)
    causal = kwargs.get("is_causal") or (attention_mask is None and getattr(module, "is_causal", False))
    if causal or key.shape[1] != query.shape[1]:  # a decoder, grouped-query heads: SDPA with torch's masks
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                    position_bias=position_bias, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    dtype = query.dtype
    # SDPA's math path (the one that applies dropout) computes half-precision inputs in fp32 and
    # rounds its output: the same here, with autocast off so the products stay fp32
    with torch.autocast(query.device.type, enabled=False):
        root = math.sqrt(scale)  # SDPA scales both sides by the square root
        # each input converted and laid out for the matmul in one copy (q, k, v come as transposed
        # views), q and k then scaled in place: the values SDPA's math path computes, in fewer passes
        query, key, value = (t.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
                             for t in (query, key, value))
        scores = torch.matmul(query.mul_(root), key.mul_(root).transpose(-2, -1))
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                floor = torch.zeros((), dtype=scores.dtype, device=scores.device)  # on the device: a CUDA mask
                scores = scores + floor.masked_fill(~attention_mask, float("-inf"))
            else:
                scores = scores + attention_mask[..., : key.shape[-2]].float()
        if position_bias is not None:
            scores = scores + position_bias.float()
        dropped = fast_dropout(torch.softmax(scores, dim=-1), dropout)
        output = torch.matmul(dropped, value)
    # rounded and laid out in one copy; the dropped probabilities only when asked for, as eager
    # attention returns them: what miCSE aligns (`output_attentions`; SDPA returns none)
    return (output.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format, copy=True),
            dropped.to(dtype) if kwargs.get("output_attentions") else None)


def use_fast_dropout(model: nn.Module) -> int:
    """Swap every `nn.Dropout` in `model` for a FastDropout of the same rate, and route fused SDPA
    attention through `attention`; returns how many dropouts were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                replacement = FastDropout(child.p, child.inplace)
                replacement.train(child.training)
                setattr(parent, name, replacement)
                swapped += 1
    config = getattr(model, "config", None)
    if (config is not None and getattr(config, "_attn_implementation", None) == "sdpa"
            and getattr(model, "_supports_attention_backend", False)):  # attention through transformers' interface
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(ATTENTION, attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        model.set_attn_implementation(ATTENTION)
    return swapped
