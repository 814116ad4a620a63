"""Attention in training without dropout: which way of computing softmax(q kᵀ · scale + mask) v, forward and
backward, is fastest on padded sentence batches, and do they agree.

A training step whose attention drops nothing (a model whose config has no attention dropout, as decoders,
ModernBERT and `dropout: 0` have) hands a padded batch with its boolean mask to torch's SDPA. On an H200 a
MiniLM `finetune` step at batch 32 ran 4.4x slower that way than with dropout, where
trainables.models.dropout computes the same attention as two fp32 matmuls around a softmax (benchmarks/fused.py
--dropout none, 2026-11-28). This times, over one sequence of batch shapes drawn like STS-B's sentences (every
length seen once, then the same shapes again: SDPA's backends may plan per shape):

- sdpa:            torch's choice of backend, as transformers calls it (the mask as (batch, 1, length, length))
- sdpa efficient:  SDPA held to its memory-efficient kernel;  sdpa cudnn: to cuDNN's;  sdpa math: to its math
- explicit fp32:   trainables.models.dropout's math (fp32 matmuls, softmax) with nothing dropped
- sdpa efficient, key mask: the efficient kernel given the padding as a (batch, 1, 1, length) mask

and the largest difference of each side's output and gradients from the explicit fp32 side's. Shapes:
`--heads` x `--head-dim` per layer, `--batch` sentences, lengths from `--lengths` (min,max); `--causal`
adds a causal mask (a decoder's).

    python benchmarks/sdpa_training.py --device cpu --steps 5 --batch 8
    python benchmarks/sdpa_training.py --device cuda --dtype bf16 --head-dim 32,64
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"sdpa efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa math": SDPBackend.MATH, "sdpa efficient, key mask": SDPBackend.EFFICIENT_ATTENTION}


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """trainables.models.dropout.attention's training math with nothing dropped."""
    root = math.sqrt(q.shape[-1] ** -0.5)
    with torch.autocast(q.device.type, enabled=False):
        q32, k32, v32 = (t.to(torch.float32, memory_format=torch.contiguous_format, copy=True) for t in (q, k, v))
        scores = torch.matmul(q32.mul_(root), k32.mul_(root).transpose(-2, -1))
        floor = torch.zeros((), dtype=scores.dtype, device=scores.device)
        scores = scores + floor.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v32).to(q.dtype)


def side(name: str, q, k, v, full: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    if name == "explicit fp32":
        return explicit(q, k, v, full)
    mask = keys if name.endswith("key mask") else full
    choice = sdpa_kernel(BACKENDS[name]) if name in BACKENDS else contextlib.nullcontext()
    with choice:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def shapes(args) -> list[list[int]]:
    """`--steps` batches of `--batch` lengths drawn from `--lengths`, the same for every side."""
    low, high = (int(v) for v in args.lengths.split(","))
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(low, high + 1, (args.batch,), generator=generator).tolist() for _ in range(args.steps)]


def inputs(lengths: list[int], heads: int, dim: int, dtype, device, causal: bool, seed: int):
    """q, k, v (batch, heads, longest, dim) needing gradients, the padding mask (batch, 1, longest, longest)
    (with the causal one where asked) and as (batch, 1, 1, longest)."""
    longest, batch = max(lengths), len(lengths)
    generator = torch.Generator(device).manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, longest, dim, generator=generator, device=device, dtype=dtype)
               .requires_grad_() for _ in range(3))
    valid = torch.arange(longest, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    keys = valid[:, None, None, :]
    full = keys.expand(batch, 1, longest, longest)
    if causal:
        full = full & torch.ones(longest, longest, dtype=torch.bool, device=device).tril()
        keys = full
    return q, k, v, full.contiguous(), keys


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(name: str, steps: list[list[int]], args, dim: int, dtype, device) -> float | None:
    """Seconds for forward and backward of every step, or None where the backend refuses the shapes."""
    synchronize(device)
    started = time.perf_counter()
    try:
        for i, lengths in enumerate(steps):
            q, k, v, full, keys = inputs(lengths, args.heads, dim, dtype, device, args.causal, i)
            side(name, q, k, v, full, keys).float().square().sum().backward()
    except RuntimeError as error:  # "No available kernel": this backend does not take these inputs
        print(f"  {name}: {str(error).splitlines()[0][:100]}", flush=True)
        return None
    synchronize(device)
    return time.perf_counter() - started


def agreement(name: str, lengths: list[int], args, dim: int, dtype, device) -> float | None:
    """The largest difference of `name`'s output and q, k, v gradients from the explicit side's, on the
    valid rows (padding queries attend to anything in SDPA; their outputs are not used)."""
    results = []
    for which in ("explicit fp32", name):
        q, k, v, full, keys = inputs(lengths, args.heads, dim, dtype, device, args.causal, 12345)
        try:
            out = side(which, q, k, v, full, keys)
        except RuntimeError:
            return None
        valid = torch.arange(max(lengths), device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
        weight = valid[:, None, :, None].to(out.dtype)
        (out.float() * weight).square().sum().backward()
        results.append([(out * weight).detach(), q.grad, k.grad, v.grad])
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(*results, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--batch", type=int, default=64, help="sentences a step (32 pairs: 64)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", default="32", help="head sizes, comma-separated (MiniLM 32, BERT-base 64)")
    parser.add_argument("--lengths", default="8,60", help="min,max tokens per sentence")
    parser.add_argument("--steps", type=int, default=60, help="batches a pass; each side runs two passes")
    parser.add_argument("--causal", action="store_true", help="a causal mask too (a decoder's)")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu")
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: give 1 or more")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = args.device
    hardware = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    names = ["sdpa", *BACKENDS, "explicit fp32"]
    record = {"device": hardware, "torch": torch.__version__, "args": vars(args), "runs": []}
    steps = shapes(args)
    for dim in (int(v) for v in args.head_dim.split(",")):
        print(f"{hardware}; torch {torch.__version__}; {args.dtype}; {args.batch} sentences of {args.lengths} tokens, "
              f"{args.heads} heads of {dim}{', causal' if args.causal else ''}; forward and backward, {args.steps} "
              f"batches a pass", flush=True)
        print(f"{'side':>26} {'first pass ms':>14} {'again ms':>9} {'x explicit':>11} {'max diff':>9}", flush=True)
        rows = {}
        for name in names:
            first = timed(name, steps, args, dim, dtype, device)
            again = timed(name, steps, args, dim, dtype, device) if first is not None else None
            rows[name] = {"first_ms": None if first is None else 1e3 * first / len(steps),
                          "again_ms": None if again is None else 1e3 * again / len(steps),
                          "max_difference": agreement(name, steps[0], args, dim, dtype, device)}
        base = rows["explicit fp32"]["again_ms"]
        for name, row in rows.items():
            if row["again_ms"] is None:
                print(f"{name:>26} {'refused':>14}", flush=True)
                continue
            diff = row["max_difference"]
            print(f"{name:>26} {row['first_ms']:14.3f} {row['again_ms']:9.3f} {row['again_ms'] / base:10.2f}x "
                  f"{'n/a' if diff is None else f'{diff:.1e}':>9}", flush=True)
        record["runs"].append({"head_dim": dim, "sides": rows})
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
