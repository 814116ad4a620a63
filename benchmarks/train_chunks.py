"""How a CPU training step's chunking moves its time: the same STS-B batches, the same model and
optimizer, the step timed under each chunking in turn, in one process.

A chunking is `BUDGET` (length_chunks: each chunk filled longest first up to BUDGET padded tokens,
training's chunking until this benchmark's run) or `BUDGET/COST` (padding_chunks: cut where padded
tokens plus COST per chunk are fewest, each chunk under BUDGET). The variants take turns, in the
given order on even turns and reversed on odd ones, each turn timing `--steps` steps (after two
warm-up steps at the start); per variant it prints the ms per step of every turn and the best, the
best's ratio to the first variant's, the padded tokens over the real ones and the chunks per step.
First, the step's fixed cost: a step on 64 sentences of three tokens (so nearly no matmul work),
the best of three passes of 20, and what it is made of: torch.profiler over ten more such steps, the
top operators by self time in ms a step (with the profiler's own overhead in their sum).
Last, unless `--no-evened-lengths`, one more variant in the same turns: the same steps under training's
chunking with each batch's real tokens spread evenly over its 64 sentences (their lengths differ by
one token at most, so a chunk pads less than a token a sentence), and the share of a step that took
off: about what a step that ran its token-wise layers on the real tokens alone could save, before the
gathers such a step needs around the attention, which still pads.

    python benchmarks/train_chunks.py --data-dir ../shared/data [--model mpnet] [--variants 768 2048/300]
"""

from __future__ import annotations

import argparse
import time

import torch
from profile_step import stsb_steps, turns_model, turns_parser  # benchmarks/, the script's own folder
from torch.profiler import ProfilerActivity, profile

import trainables.models.batching as batching
from trainables.training.bi_encoder import train_step


def parse_variant(text: str) -> tuple[int, int | None]:
    budget, _, cost = text.partition("/")
    try:
        parsed = int(budget), (int(cost) if cost else None)
    except ValueError:
        parsed = (0, None)
    if parsed[0] < 1 or (parsed[1] is not None and parsed[1] < 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give BUDGET (tokens, 1 or more) or BUDGET/COST, e.g. 2048/300")
    return parsed


class Recorder(torch.nn.Module):
    """The encoder, noting each forward's padded and real tokens."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.padded, self.real, self.forwards = model, 0, 0, 0

    def forward(self, input_ids, mask):
        self.padded += input_ids.numel()
        self.real += int(mask.sum())
        self.forwards += 1
        return self.model(input_ids, mask)


def main() -> None:
    parser = turns_parser(__doc__, 3)
    parser.add_argument("--variants", nargs="+", type=parse_variant, default=[(768, None), (2048, 300)],
                        help="chunkings: BUDGET (filled in turn) or BUDGET/COST (fewest padded plus COST a chunk)")
    parser.add_argument("--evened-lengths", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the same steps with each batch's real tokens spread evenly over its sentences "
                             "(lengths evened)")
    args = parser.parse_args()
    setup = turns_model(parser, args)
    name, device, dtype, model = setup.name, setup.device, setup.dtype, setup.model
    recorder = Recorder(model).train()
    run = stsb_steps(name, args.data_dir, model, args.steps)
    batches, pairs = run.batches, run.batch

    def step(token_lists, y):
        train_step(recorder, run.loss_fn, run.optimizer, run.scheduler, token_lists, y, run.tokens.pad_id, device,
                   dtype, 1.0)

    saved = batching.TRAIN_TOKENS_PER_CHUNK, batching.TRAIN_CHUNK_COST
    print(f"torch {torch.__version__}, {args.threads} threads, precision auto -> {str(dtype).split('.')[-1]}; "
          f"{name.split('/')[-1]}, STS-B train batches of 32 pairs; training's chunking now "
          f"{label(saved)}")
    tiny = [[run.tokens.pad_id + 1 + (i % 50)] * 3 for i in range(64)]
    tiny_targets = torch.rand(32)
    for _ in range(3):
        step(tiny, tiny_targets)
    fixed = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(20):
            step(tiny, tiny_targets)
        fixed = min(fixed, (time.perf_counter() - started) / 20)
    print(f"a step on 64 sentences of 3 tokens (the step's fixed cost): {1000 * fixed:.1f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step(tiny, tiny_targets)
    print("  " + operator_split(prof.key_averages(), 10))

    real_steps = [pairs(rows) for rows in batches[2:]]
    steps_of = dict.fromkeys(args.variants, real_steps)
    variants: list[tuple] = list(args.variants)
    if args.evened_lengths:
        variants.append(EVEN)
        steps_of[EVEN] = [(evened(token_lists), y) for token_lists, y in real_steps]
    for rows in batches[:2]:  # warm-up: allocator, oneDNN kernels
        token_lists, y = pairs(rows)
        step(token_lists, y)
        if args.evened_lengths:
            step(evened(token_lists), y)
    times: dict[tuple, list[float]] = {v: [] for v in variants}
    counts: dict[tuple, list[int]] = {v: [0, 0, 0] for v in variants}
    try:
        for turn in range(args.turns):
            for variant in variants if turn % 2 == 0 else variants[::-1]:
                batching.TRAIN_TOKENS_PER_CHUNK, batching.TRAIN_CHUNK_COST = saved if variant == EVEN else variant
                recorder.padded = recorder.real = recorder.forwards = 0
                started = time.perf_counter()
                for token_lists, y in steps_of[variant]:
                    step(token_lists, y)
                times[variant].append(1000 * (time.perf_counter() - started) / len(batches[2:]))
                counts[variant] = [recorder.padded, recorder.real, recorder.forwards]
    finally:
        batching.TRAIN_TOKENS_PER_CHUNK, batching.TRAIN_CHUNK_COST = saved
    base = min(times[args.variants[0]])
    steps = len(batches[2:])
    for variant in variants:
        padded, real, forwards = counts[variant]
        print(f"{label(variant):>24}: " + " ".join(f"{t:.1f}" for t in times[variant])
              + f" ms/step, best {min(times[variant]):.1f} ({base / min(times[variant]):.2f}x the first); "
              f"padding {100 * (padded / real - 1):.1f} % over the real tokens, {forwards / steps:.2f} chunks/step, "
              f"{real / steps:.0f} real tokens a step")
    if args.evened_lengths:
        if saved in times:
            before, after = (100 * (counts[v][0] / counts[v][1] - 1) for v in (saved, EVEN))
            print(f"with the lengths evened (padding {before:.1f} % -> {after:.1f} % over the real tokens) a step took "
                  f"{100 * (1 - min(times[EVEN]) / min(times[saved])):.1f} % less than under training's chunking "
                  f"({label(saved)})")
        else:
            print(f"(training's chunking, {label(saved)}, is not among --variants: no saving to print)")


def operator_split(events, steps: int, top: int = 8) -> str:
    """The `top` operators (aten and custom autograd functions, not autograd's bookkeeping) by self time,
    in ms a step over `steps` steps, and what all of them add to."""
    ops = [e for e in events if not e.key.startswith("autograd::")]
    total = sum(e.self_cpu_time_total for e in ops) / 1000 / steps
    ranked = sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]
    return ("its operators by self time, ms a step: " + ", ".join(
        f"{e.key} {e.self_cpu_time_total / 1000 / steps:.2f}" for e in ranked)
        + f" (all operators {total:.1f} ms a step under the profiler)")


EVEN = (0, None)  # the evened lengths' key among the variants (no chunking parses to it)


def evened(token_lists: list[list[int]]) -> list[list[int]]:
    """The same real tokens spread evenly over the same sentences: lengths that differ by one at most,
    each sentence's own ids (one at least: its special tokens) repeated to its new length (what the step
    computes on them is not looked at, only how long it takes)."""
    total, count = sum(len(ids) for ids in token_lists), len(token_lists)
    base, extra = divmod(total, count)
    return [(ids * (base // len(ids) + 2))[: base + (i < extra)] for i, ids in enumerate(token_lists)]


def label(variant: tuple[int, int | None]) -> str:
    if variant == EVEN:
        return "lengths evened"
    budget, cost = variant
    return f"{budget} filled in turn" if cost is None else f"{budget}, {cost} a chunk"


if __name__ == "__main__":
    main()
