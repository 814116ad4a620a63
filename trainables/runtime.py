"""Device, precision and seeding: the few hardware decisions every trainable shares."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import random
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from trainables.errors import one_of
from trainables.models.embedding_grad import nonzero_rows
from trainables.names import EVAL_PRECISIONS, PRECISIONS

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` is the first CUDA device when there is one, else the CPU."""
    if name not in DEVICES and not name.startswith("cuda:"):
        raise one_of("device", name, DEVICES)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@lru_cache(maxsize=1)
def _cpu_has_fast_bf16() -> bool:
    """True on CPUs with native bf16 matrix units (AMX or AVX512-BF16); elsewhere bf16 is emulated."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


BF16_CUDA_CAPABILITY = (8, 0)  # Ampere: the first GPUs with bf16 tensor cores


def bf16_is_fast(device: torch.device) -> bool:
    """Native bf16 matmuls: a GPU of compute capability 8.0 or later (A100, L4, H100; earlier ones,
    P100, V100, T4, emulate bf16, which `torch.cuda.is_bf16_supported()` counts as support), or a CPU
    with AMX or AVX512-BF16."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= BF16_CUDA_CAPABILITY
    return device.type == "cpu" and _cpu_has_fast_bf16()


def resolve_precision(name: str, device: torch.device) -> torch.dtype:
    """`auto` picks bf16 autocast where the hardware runs it fast, fp32 elsewhere."""
    if name not in PRECISIONS:
        raise one_of("precision", name, PRECISIONS)
    if name == "bf16" or (name == "auto" and bf16_is_fast(device)):
        return torch.bfloat16
    return torch.float32


def scoring_dtype(eval_precision: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype dev and test are scored in. `fp32` (the default) whatever the training precision:
    the saved model, loaded in sentence-transformers (fp32), then reproduces the run's test number;
    scored under bf16 autocast it differed by 0.1-0.3 Spearman points on a tiny model. `same`
    scores in the training precision (a little faster on bf16 hardware)."""
    if eval_precision not in EVAL_PRECISIONS:
        raise one_of("eval_precision", eval_precision, EVAL_PRECISIONS)
    return dtype if eval_precision == "same" else torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """bf16 autocast when asked for; a no-op context for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def linear_schedule(optimizer, warmup_steps: int, total_steps: int):
    """transformers' linear warmup-then-decay schedule, imported when a trial builds its optimizer
    (transformers' optimization module costs ~1 s that `validate` and `status` need not pay)."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """torch's `get_total_norm` on a CPU (the 2-norm of each gradient, then of those norms), except that
    a word-embedding gradient kept row by row (trainables.models.embedding_grad) is read only on the
    rows its lookups wrote, every other row being zero: the same norm to an fp32 rounding, without
    reading the whole table (MiniLM: 30,522 x 384, of which a step of 32 pairs writes a few hundred rows)."""
    norms = []
    for grad in grads:
        rows = nonzero_rows(grad)
        norms.append(torch.linalg.vector_norm(grad if rows is None else grad.index_select(0, rows), 2.0))
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """torch's `clip_grad_norm_` (the same total norm, the same clipped gradients, through `total_norm`
    above and torch's own `clip_grads_with_norm_`), without its multiply of every gradient by 1.0 when
    the norm is within `max_norm`: torch multiplies unconditionally so that a GPU never waits for the
    comparison; on a CPU the comparison costs nothing and the pass it saves does (MiniLM: 3.3 ms of a
    278-ms step; STS-B fine-tuning's norms, 0.2-0.4, never reach 1.0). A non-finite norm clips as
    torch's does (an infinite one by 0, a NaN one by NaN); torch before 2.6 (without the two functions)
    and any device but a CPU: torch's `clip_grad_norm_` itself. Returns the total norm."""
    utils = torch.nn.utils
    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        return torch.tensor(0.0)
    if (any(p.grad.device.type != "cpu" for p in parameters)
            or not hasattr(utils, "get_total_norm") or not hasattr(utils, "clip_grads_with_norm_")):
        return utils.clip_grad_norm_(parameters, max_norm)
    total = total_norm([p.grad for p in parameters])
    if not float(max_norm / (total + 1e-6)) >= 1.0:  # torch's coefficient, clamped to 1.0: a multiply by it
        utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def optimizer_step(parameters, optimizer, scheduler, max_grad_norm: float | None) -> None:
    """After `backward`: clip the gradients to `max_grad_norm` (none when 0 or None), step the optimizer
    and its schedule, and drop the gradients; the one step every training loop of the project takes."""
    if max_grad_norm:
        clip_gradients(parameters, max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def release_memory() -> None:
    """After a trial in a reused worker: collect its objects and hand freed heap pages back to the
    system (each trial runs in a thread of its own, and glibc keeps what a finished thread's arena
    freed; a worker training base-size models grew by gigabytes over a study without this)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def without_cudnn_attention(device: torch.device) -> None:
    """On CUDA, SDPA never chooses cuDNN's attention in this process: cuDNN plans anew for every batch shape
    it has not seen (102.7 ms against 0.84 ms a batch on an H200, docs/benchmarks/speed.md), and a sentence
    batch's padded length changes nearly every step. `trainables.models.attention.sdpa` already calls SDPA
    without it; this covers what does not run through it (a model in eager or another attention, a plugin's
    module). Elsewhere nothing changes."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def prepare(device: str, precision: str, num_threads: int | None) -> tuple[torch.device, torch.dtype]:
    """A trial's torch threads (the CPUs Ray granted), device and autocast dtype; on CUDA, no cuDNN attention."""
    if num_threads:
        torch.set_num_threads(num_threads)
    resolved = resolve_device(device)
    without_cudnn_attention(resolved)
    return resolved, resolve_precision(precision, resolved)
