"""Fused AdamW that steps only the rows of a word-embedding table that have ever had a gradient.

A table's row that no lookup has touched yet has a zero gradient and zero moments, so fused AdamW does
one thing to it: the decoupled weight decay, `param * (1 - lr * weight_decay)`; its moments stay zero and
`0 / (sqrt(0) + eps)` moves nothing. Yet the fused kernel reads and writes the row, its gradient and its two
moments every step: 28 bytes a parameter, for a table that is most of a model with a large vocabulary
(250,037 rows of paraphrase-multilingual-MiniLM-L12-v2's 118 M parameters, 96 M) while a data set's
sentences touch a few per cent of its rows. `RowAdamW` leaves such a table out of torch's step when the
rows touched so far are at most `ROW_SHARE` of it, multiplies the whole table by the decay (8 bytes a
parameter, nothing at all without decay) and runs torch's own fused kernel on the touched rows alone,
gathered and written back. The numbers are torch's to the bit, weights and moments (a test, against
`torch.optim.AdamW(fused=True)` over steps that touch new rows, with and without decay); the moments stay
full-size, so the optimizer's state dict, and every checkpoint, is what torch's would be. To the bit
because the touched rows go through the very kernel torch's step runs, with the same decay, and on the
same code path: the kernel works in vectors of up to 16 floats and leaves a tensor's last few elements to
scalar code, which rounds differently here; a table whose rows are a whole number of 16 floats (hidden
sizes 384, 768, 1024) has no such tail, whole or gathered. Other tables take torch's step.

It knows a table's rows from its gradient: a RowGradEmbedding's buffer, which names the rows the step's
lookups wrote (`nonzero_rows`, what the clipping reads too). Any other parameter, a table that got a dense
gradient (a tied use), or a group that is not plain fused AdamW on a CPU takes torch's step. The rows
touched so far are noted step by step; after a restored state dict or a dense gradient they are read
again from the moments (a row with any non-zero moment)."""

from __future__ import annotations

import torch
from torch.optim.adam import adam

from trainables.models.embedding_grad import nonzero_rows

# The row step gathers and writes back every touched row of the table, its gradient and moments, so it
# pays off only while few rows are touched: at 5 % touched it took 3.06 ms against torch's 7.17 for
# MiniLM's table (30,522 x 384) and 39.6 against 57.9 for a 250,037-row one; at 10 % 4.8 against 7.2
# but 86 against 58 (benchmarks/row_adamw.py, 2-core Xeon, 2026-11-27)
ROW_SHARE = 0.05
VECTOR = 16  # floats in the fused kernel's widest vector (AVX-512); a row of a multiple of it leaves no scalar tail


class RowAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (fused) whose step leaves a row-wise embedding gradient's untouched rows to the
    decay alone; the same numbers as torch's."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self._seen: dict[torch.Tensor, torch.Tensor] = {}  # a table -> its rows touched so far

    def __setstate__(self, state) -> None:  # a copy or an unpickled optimizer: the rows are read again
        super().__setstate__(state)
        self._seen = {}

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._seen.clear()  # new moments: the rows touched are read from them again

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:  # the closure recomputes the gradients: torch's step, whole, and the rows
            self._seen.clear()  # it touches are read from the moments next time
            return super().step(closure)
        deferred = []
        for group in self.param_groups:
            for param in group["params"]:
                rows = self._rows_to_step(param, group)
                if rows is not None:
                    deferred.append((param, group, rows, param.grad))
                    param.grad = None  # torch's step skips a parameter without a gradient
        try:
            loss = super().step(closure)
        finally:
            for param, _, _, grad in deferred:
                param.grad = grad
        for param, group, rows, grad in deferred:
            self._step_rows(param, group, rows, grad)
        return loss

    def _rows_to_step(self, param: torch.Tensor, group: dict) -> torch.Tensor | None:
        """The rows to step alone (every row touched so far), or None for torch's step of the whole."""
        grad = param.grad
        written = nonzero_rows(grad) if grad is not None else None
        if written is None:
            self._seen.pop(param, None)  # a dense gradient may have reached every row
            return None
        state = self.state.get(param)
        seen = self._seen.get(param)
        if seen is None:
            seen = torch.zeros(param.shape[0], dtype=torch.bool, device=param.device)
            if state:
                seen |= (state["exp_avg"] != 0).any(1) | (state["exp_avg_sq"] != 0).any(1)
            self._seen[param] = seen
        seen[written] = True
        if (not state or not group.get("fused") or group.get("amsgrad") or group.get("maximize")
                or group.get("capturable") or group.get("differentiable") or group["eps"] <= 0
                or param.device.type != "cpu" or param.dtype != torch.float32 or grad.dtype != param.dtype
                or param.ndim != 2 or param.shape[1] % VECTOR):
            return None  # the first step (torch makes the state), or what the row step does not cover
        rows = seen.nonzero().squeeze(1)
        return rows if rows.numel() <= ROW_SHARE * param.shape[0] else None

    def _step_rows(self, param: torch.Tensor, group: dict, rows: torch.Tensor, grad: torch.Tensor) -> None:
        state = self.state[param]
        lr, decay = group["lr"], group["weight_decay"]
        picked = [tensor.index_select(0, rows) for tensor in (param, grad, state["exp_avg"], state["exp_avg_sq"])]
        if decay != 0:  # all the kernel does to a row without moments (the touched ones are written over below)
            param.mul_(1 - lr * decay)
        beta1, beta2 = group["betas"]
        adam([picked[0]], [picked[1]], [picked[2]], [picked[3]], [], [state["step"]], fused=True,
             decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=lr, weight_decay=decay,
             eps=group["eps"], maximize=False)
        for tensor, rows_now in zip((param, state["exp_avg"], state["exp_avg_sq"]), (picked[0], picked[2], picked[3]),
                                    strict=True):
            tensor.index_copy_(0, rows, rows_now)
