"""Padding-free batches (`padding: packed`, issue 56): a batch's sentences as one row of tokens, no padding.

A padded batch computes every layer's linear maps, norms and dropout on `sentences x longest` tokens; a packed
one on the sentences' own tokens only, laid end to end in one row (1, T), each sentence's positions counted from
its start (`position_ids`, as transformers' DataCollatorWithFlattening does for decoders). Only attention needs to
know where a sentence ends. transformers hands the attention function every keyword the model's forward was
given, so the packing's plan travels with `cu_seq_lens_q`/`cu_seq_lens_k` (flash attention's variable-length
arguments, the names transformers uses) to this module's `attention`, which each of the project's attention
functions calls first (trainables.models.attention, trainables.models.dropout):

- on CUDA, with nothing to drop (evaluation, or `attention_probs_dropout_prob` 0) and half-precision inputs:
  torch's `varlen_attn` (flash attention's variable-length kernel), the whole row in one call;
- otherwise (a CPU, fp32, or attention dropout: the varlen kernel has none): the sentences' queries, keys and
  values gathered into padded groups of similar length, the same attention the padded path computes on them
  (the same function, the same dropout masks' arithmetic), and the outputs put back in the row. Only attention,
  about 1 % of an encoder's arithmetic on sentences, sees padding.

After the encoder the token states are laid out padded again (`Packed.padded`) and pooled as a padded batch's,
so every pooling, prompt and special-token rule is the padded path's own. Packed and padded give the same token
states to rounding; training draws other dropout masks (a row of T tokens instead of a padded grid), so a
packed training is an equally valid draw, not the same one. `packing_refusal` checks a model by running both
ways on three sentences: a family whose forward does not take `position_ids` per token, or whose attention does
not go through transformers' interface, is refused there (`auto` then pads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

PLAN = "padding_free_plan"  # the keyword the plan travels under, beside cu_seq_lens_q/k and max_length_q/k
PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", PLAN, "position_ids")
CHECK_TOLERANCE = 1e-4  # packed against padded token states, relative to their scale, in fp32 evaluation
HALF_TOLERANCE = 3e-2  # the same under bf16 autocast on CUDA (8 bits of mantissa, rounded along other paths)


@dataclass(frozen=True)
class Group:
    """Sentences whose attention runs as one padded batch: `index` (sentences, longest) gathers their tokens from
    the row (a padded position repeats its sentence's first token), `valid` marks the real ones."""

    index: torch.Tensor
    valid: torch.Tensor


@dataclass(frozen=True)
class Packed:
    """One row of tokens: `input_ids` and `position_ids` (1, T), each sentence's `lengths`, `cu_seqlens` (int32,
    sentences + 1), the attention `groups`, `inverse` (a row position's place in the groups' outputs), and
    `index`/`valid` (sentences, longest): the padded layout the pooling reads."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    lengths: tuple[int, ...]
    cu_seqlens: torch.Tensor
    groups: tuple[Group, ...]
    inverse: torch.Tensor
    index: torch.Tensor
    valid: torch.Tensor

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    def kwargs(self) -> dict:
        """What the model's forward is given beside `input_ids`."""
        return {"position_ids": self.position_ids, "cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_length, "max_length_k": self.max_length, PLAN: self}

    def padded(self, row: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) token states as (sentences, longest, ...), zeros at padding (the padded path's layout)."""
        states = row[0][self.index]
        shape = self.valid.shape + (1,) * (states.dim() - 2)
        return states * self.valid.view(shape).to(states.dtype)

    def attention_mask(self) -> torch.Tensor:
        """The padded layout's attention mask (sentences, longest), as trainables.models.batching.pad makes it."""
        return self.valid.long()

    def padded_ids(self, pad_id: int) -> torch.Tensor:
        return self.input_ids[0][self.index].masked_fill(~self.valid, pad_id)


def layout(lengths: Sequence[int], starts: Sequence[int], members: Sequence[int],
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (len(members), longest) gather index into the row and its mask, for the sentences `members`."""
    longest = max(lengths[i] for i in members)
    offsets = torch.arange(longest)
    counts = torch.tensor([lengths[i] for i in members])
    valid = offsets[None, :] < counts[:, None]
    index = torch.tensor([starts[i] for i in members])[:, None] + torch.where(valid, offsets[None, :], 0)
    return index.to(device), valid.to(device)


def pack(token_lists: Sequence[Sequence[int]], device: torch.device | str, position_offset: int = 0,
         attention_groups: Sequence[Sequence[int]] | None = None) -> Packed:
    """`token_lists` as one row; `attention_groups`: the sentences whose attention runs as one padded batch
    (by default all of them); `position_offset`: the first position's id (RoBERTa's: padding_idx + 1)."""
    device = torch.device(device)
    lengths = tuple(len(ids) for ids in token_lists)
    if not lengths or min(lengths) < 1:
        raise ValueError("pack needs at least one sentence and one token per sentence")
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    ids = torch.tensor([token for tokens in token_lists for token in tokens], dtype=torch.long)
    positions = torch.cat([torch.arange(n) for n in lengths]) + position_offset
    cu = torch.tensor([*starts, starts[-1] + lengths[-1]], dtype=torch.int32)
    plans = [list(g) for g in attention_groups] if attention_groups is not None else [list(range(len(lengths)))]
    if sorted(i for g in plans for i in g) != list(range(len(lengths))):
        raise ValueError("attention_groups must hold every sentence once")
    groups, order = [], []
    for members in plans:
        index, valid = layout(lengths, starts, members, device)
        groups.append(Group(index, valid))
        order.extend(start for i in members for start in range(starts[i], starts[i] + lengths[i]))
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    index, valid = layout(lengths, starts, range(len(lengths)), device)
    return Packed(ids[None].to(device), positions[None].to(device), lengths, cu.to(device), tuple(groups),
                  inverse.to(device), index, valid)


def varlen_usable(query: torch.Tensor, dropout: float, kwargs: dict) -> bool:
    """Whether torch's flash varlen kernel computes this call: CUDA, bf16/fp16, nothing dropped, no probabilities
    asked for."""
    if query.device.type != "cuda" or query.dtype not in (torch.bfloat16, torch.float16) or dropout > 0.0:
        return False
    if kwargs.get("output_attentions") or kwargs.get("position_bias") is not None:
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401 (torch >= 2.10)
    except ImportError:
        return False
    return True


def causal(module: nn.Module, kwargs: dict) -> bool:
    return bool(kwargs.get("is_causal", getattr(module, "is_causal", False)))


def within(longest: int, is_causal: bool, window: int | None, device: torch.device) -> torch.Tensor:
    """(longest, longest): which keys a query sees inside its sentence: all of them, the earlier ones (causal),
    and those fewer than `window` positions away (a sliding window, transformers' `sliding_window` keyword:
    a causal one looks back, a bidirectional one both ways)."""
    query = torch.arange(longest, device=device)[:, None]
    key = torch.arange(longest, device=device)[None, :]
    seen = key <= query if is_causal else torch.ones(longest, longest, dtype=torch.bool, device=device)
    if window is not None:
        seen = seen & ((query - key).abs() < int(window))
    return seen


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: Packed,
              padded: Callable, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """Attention over a packed row, (1, heads, T, head size) in, (1, T, heads, head size) out (transformers'
    interface): varlen on CUDA where it can (`varlen_usable`), else each group padded through `padded` (the
    caller's own attention function: its arithmetic and its dropout masks) with the sentences' key mask (and
    `within`'s causal and sliding-window limits)."""
    rest = {k: v for k, v in kwargs.items() if k not in PACKED_KEYS and k not in ("is_causal", "sliding_window")}
    is_causal, window = causal(module, kwargs), kwargs.get("sliding_window")
    if varlen_usable(query, dropout, kwargs):
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # (T, heads, head size)
        out = varlen_attn(q, k, v, plan.cu_seqlens, plan.cu_seqlens, plan.max_length, plan.max_length,
                          scale=scaling, window_size=(reach := -1 if window is None else int(window) - 1,
                                                      0 if is_causal else reach),
                          enable_gqa=k.shape[1] != q.shape[1])
        return out.unsqueeze(0), None
    outputs = []
    for group in plan.groups:
        q, k, v = (t[0][:, group.index].transpose(0, 1) for t in (query, key, value))  # (sentences, heads, L, d)
        mask = group.valid[:, None, None, :] & within(group.valid.shape[1], is_causal, window, query.device)
        out, _ = padded(module, q, k, v, mask, dropout=dropout, scaling=scaling, **rest)
        outputs.append(out[group.valid])  # (tokens, heads, head size), the group's sentences in turn
    return torch.cat(outputs)[plan.inverse].unsqueeze(0), None


def position_offset(model: nn.Module) -> int:
    """The position id of a sentence's first token: RoBERTa's family counts from its padding index + 1 (its
    embeddings keep `padding_idx`), the others from 0."""
    embeddings = getattr(model, "embeddings", None)
    index = getattr(embeddings, "padding_idx", None)
    return int(index) + 1 if isinstance(index, int) and getattr(embeddings, "position_embeddings", None) else 0


def run_packed(model: nn.Module, plan: Packed) -> torch.Tensor:
    """The (cut) encoder's last token states over a packed row, (1, T, hidden)."""
    return model(input_ids=plan.input_ids, **plan.kwargs()).last_hidden_state


def packing_refusal(model: nn.Module, vocab_floor: int = 5) -> str | None:
    """Why this (cut) encoder cannot run packed, or None: three sentences (7, 3 and 5 tokens) through it padded
    and packed in evaluation must give the same token states, in fp32 (relative difference under
    CHECK_TOLERANCE) and, on CUDA, under bf16 autocast too (HALF_TOLERANCE: there torch's varlen kernel runs)."""
    from trainables.models.architectures import architecture_of, stack_depth

    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if config is None or not getattr(model, "_supports_attention_backend", False) or implementation in (
            None, "eager"):
        return "its attention does not run through transformers' attention interface"
    try:
        if architecture_of(model).embeddings_only is not None and stack_depth(model) == 0:
            return "layer 0 of this family is its embedding output, computed padded"
    except Exception:  # noqa: BLE001 (an architecture the table does not know: the check below decides)
        pass
    device = next(model.parameters()).device
    top = max(vocab_floor + 1, min(int(getattr(config, "vocab_size", 100)), 1000))
    generator = torch.Generator().manual_seed(0)
    lists = [torch.randint(vocab_floor, top, (n,), generator=generator).tolist() for n in (7, 3, 5)]
    passes = [(None, CHECK_TOLERANCE)] + ([(torch.bfloat16, HALF_TOLERANCE)] if device.type == "cuda" else [])
    was_training = model.training
    model.eval()
    try:
        for dtype, tolerance in passes:
            gap = packed_gap(model, lists, device, dtype)
            if not gap <= tolerance:
                return (f"packed it gives other token states than padded (relative difference {gap:.1e}"
                        f"{' in bf16' if dtype is not None else ''}): its positions or attention are not counted "
                        "per sentence")
    except Exception as exc:  # noqa: BLE001 (any failure is a refusal, said in one line)
        return f"its forward refused a packed row ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    finally:
        model.train(was_training)
    return None


def packed_gap(model: nn.Module, lists: list[list[int]], device: torch.device, dtype: torch.dtype | None) -> float:
    """The largest difference between padded and packed token states, relative to the largest state, in
    evaluation (`dtype`: under its autocast; None: fp32)."""
    from trainables.models.architectures import token_states

    plan = pack(lists, device, position_offset(model))
    ids, mask = plan.padded_ids(0), plan.attention_mask()  # right-padded, as trainables.models.batching.pad
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        padded = token_states(model, ids, mask).float()
        packed = plan.padded(run_packed(model, plan)).float()
    valid = mask.bool()
    scale = padded[valid].abs().max().clamp_min(1e-6)
    return float((padded[valid] - packed[valid]).abs().max() / scale)

def choose_packing(padding: str, model: nn.Module, device: torch.device | str) -> tuple[bool, str]:
    """Whether a trial's training batches go packed, and why: `padded` never; `packed` always, its model checked
    (`packing_refusal`: a model that fails is one line, before any step); `auto` packed on CUDA for a
    SentenceEncoder of one layer's states whose model passes the check, padded elsewhere (on a CPU neither path
    measured faster: benchmarks/padding_free.py, docs/concepts/padding-free.md)."""
    from trainables.errors import UserInputError
    from trainables.names import PACKED_FAMILIES

    if padding == "padded":
        return False, "padding: padded"
    encoder = getattr(model, "encoder", None)
    if padding == "auto":
        if torch.device(device).type != "cuda":
            return False, "auto: padded on a CPU, where packed rows measured no faster"
        if encoder is None or getattr(model, "mix", None) is not None:
            return False, "auto: padded (the vectors mix several layers' states)"
        family = getattr(getattr(encoder, "config", None), "model_type", None)
        if family not in PACKED_FAMILIES:
            return False, f"auto: padded (a {family} model does not run packed rows)"
    refusal = packing_refusal(encoder) if encoder is not None else "it is not one sentence encoder"
    if refusal is None:
        return True, f"padding: {padding}" + (" (on a GPU, the model checked)" if padding == "auto" else "")
    if padding == "packed":
        raise UserInputError("padding", "packed", f"{refusal}: use padding: auto or padded")
    return False, f"auto: padded ({refusal})"
