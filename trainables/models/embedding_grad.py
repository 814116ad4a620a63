"""The word-embedding gradient without a dense zero-fill per forward, on the CPU.

torch's embedding backward builds a dense (vocabulary x hidden) gradient, zero-filled, for every
forward pass that looked tokens up: 47 MB for MiniLM (30522 x 384), 94 MB for MPNet, per
length-sorted chunk, plus the add that accumulates the chunks' gradients, where a batch touches a
few hundred rows. That fill and add were 6 % of a MiniLM step and 11 % of an MPNet step here.

`RowGradEmbedding` keeps one gradient buffer per embedding and, in backward, adds each chunk's
rows into it (`index_add_`, the padding row left out as torch does); before a step's first
backward it zeroes only the rows the previous step touched, and hands the buffer to the
parameter as its `.grad`. The optimizer, clipping and `zero_grad(set_to_none=True)` see the same
dense gradient as before, with the same values (the rows' sums may round in a different order).
Off the CPU (where a fill is cheap and `index_add_` is not deterministic) the backward is torch's.
The rows written are known, so the clipping's norm reads only them (`nonzero_rows`,
trainables.runtime.total_norm): a MiniLM step of 32 pairs writes about 250 of 30,522.

A table that is also used outside the lookup (a tied output layer, a weight read by a loss) gets a
dense gradient from autograd, which lands in the buffer on rows no lookup touched; a hook on the
weight sees it arrive and the next step zeroes the whole buffer, as torch's fresh gradient would be."""

from __future__ import annotations

import weakref

import torch
from torch import nn


class _RowGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, owner: RowGradEmbedding) -> torch.Tensor:
        ctx.owner = owner
        ctx.save_for_backward(ids)
        return nn.functional.embedding(ids, weight, owner.padding_idx, owner.max_norm, owner.norm_type,
                                       owner.scale_grad_by_freq, owner.sparse)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        owner = ctx.owner
        if grad.device.type != "cpu":
            padding = -1 if owner.padding_idx is None else owner.padding_idx
            return None, torch.ops.aten.embedding_dense_backward(grad, ids, owner.num_embeddings, padding,
                                                                 owner.scale_grad_by_freq), None
        owner.accumulate(ids, grad)
        return None, None, None


class RowGradEmbedding(nn.Embedding):
    """nn.Embedding whose CPU gradient goes row by row into a buffer kept across steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._buffer: torch.Tensor | None = None
        self._touched: list[torch.Tensor] = []
        self._written: torch.Tensor | None = None  # the unique rows of _touched, once asked for
        self._dense_since_zeroed = False  # autograd added a dense gradient (a use outside the lookup)

    @classmethod
    def replacing(cls, embedding: nn.Embedding) -> RowGradEmbedding:
        """The same parameter behind a RowGradEmbedding (the optimizer and state dict see no change)."""
        module = cls.__new__(cls)
        module.__dict__.update(embedding.__dict__)
        module._buffer, module._touched, module._written, module._dense_since_zeroed = None, [], None, False
        return module

    def dense(self) -> nn.Embedding:
        """A plain nn.Embedding on the same parameter (torch's dense gradient; for comparisons)."""
        module = nn.Embedding.__new__(nn.Embedding)
        module.__dict__.update({k: v for k, v in self.__dict__.items()
                                if k not in ("_buffer", "_touched", "_written", "_dense_since_zeroed")})
        return module

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if (not torch.is_grad_enabled() or not self.weight.requires_grad or self.sparse or self.max_norm is not None
                or self.scale_grad_by_freq):
            return super().forward(ids)
        self._watch(self.weight)
        return _RowGrad.apply(ids, self.weight, self)

    def _watch(self, weight: torch.Tensor) -> None:
        """A hook on the weight (once; again after a copy, which drops tensor hooks) that notes a
        gradient autograd brings from another use of the table: the lookup's own brings none."""
        hooks = weight._backward_hooks or {}  # torch's own record of a tensor's hooks
        if not any(getattr(hook, "__self__", None) is self for hook in hooks.values()):
            weight.register_hook(self._note_dense)

    def _note_dense(self, grad: torch.Tensor | None) -> None:
        if grad is not None:
            self._dense_since_zeroed = True

    def accumulate(self, ids: torch.Tensor, grad: torch.Tensor) -> None:
        rows, values = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if self.padding_idx is not None:
            keep = rows != self.padding_idx
            rows, values = rows[keep], values[keep]
        weight = self.weight
        if weight.grad is None:
            buffer = self._buffer
            if buffer is None or buffer.shape != weight.shape or buffer.dtype != weight.dtype:
                buffer = self._buffer = torch.zeros_like(weight, memory_format=torch.contiguous_format)
                buffer._row_grad_owner = weakref.ref(self)  # type: ignore[attr-defined]  # for nonzero_rows
            elif self._dense_since_zeroed:  # autograd wrote every row last step
                buffer.zero_()
            elif self._touched:
                buffer.index_fill_(0, torch.cat(self._touched), 0.0)  # only what the last step wrote
            self._touched, self._dense_since_zeroed = [], False
            weight.grad = buffer
        if weight.grad is self._buffer:
            self._touched.append(rows)
        weight.grad.index_add_(0, rows, values.to(weight.grad.dtype))
        self._written = None

    def written_rows(self) -> torch.Tensor | None:
        """The rows of the weight's `.grad` that the lookups wrote since it was last reset, when every
        other row of it is zero (it is this module's buffer and no dense gradient reached it); None
        otherwise. What the clipping's norm and RowAdamW read instead of the whole table (not to be written to)."""
        grad = self.weight.grad
        if grad is None or grad is not self._buffer or self._dense_since_zeroed or not self._touched:
            return None
        if self._written is None:  # asked twice a step (the clipping, then RowAdamW): found once
            self._written = torch.unique(torch.cat(self._touched))
        return self._written


def nonzero_rows(grad: torch.Tensor) -> torch.Tensor | None:
    """The only rows of `grad` that can be non-zero, when it is a RowGradEmbedding's gradient buffer
    that holds nothing but its lookups' rows (`RowGradEmbedding.written_rows`); None for any other
    tensor."""
    owner = getattr(grad, "_row_grad_owner", None)
    module = owner() if owner is not None else None
    return module.written_rows() if module is not None and module._buffer is grad else None


def use_row_gradients(model: nn.Module) -> int:
    """Swap the model's input embeddings (when not tied to an output layer) for RowGradEmbedding;
    returns how many were swapped."""
    get_input = getattr(model, "get_input_embeddings", None)
    embedding = get_input() if get_input else None
    if type(embedding) is not nn.Embedding:
        return 0
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None and getattr(output, "weight", None) is embedding.weight:
        return 0
    model.set_input_embeddings(RowGradEmbedding.replacing(embedding))
    return 1
