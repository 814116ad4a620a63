"""Fused trial arrays (trainables.training.fused) against one `finetune` trial alone: aggregate training
pairs/s of K = 1, 2, 4, 8, 16 members trained as one stacked model, beside one trial's own step.

"alone" is the trial's step as a `finetune` trial takes it (build_sentence_encoder with `dropout_masks:
fast`, build_optimizer's RowAdamW, the linear schedule, train_step's length-sorted chunks, clipping at
1.0, `loss.item()` after each step); K trials run one after another on the same cores have its pairs/s
as their aggregate, so "x alone" is the fused array's gain over running them separately. "fused K" is
FusedArray with K members that differ in seed (each its own length-grouped data order, as the trial of
that seed draws it, and its own dropout masks; "aligned": the same batches in the array's order,
`aligned_epoch_batches`). Every side is built afresh, runs `--warmup` untimed steps, then `--steps`
timed steps from the same start to the same end (the device synchronized); `--repeats` measures the
sides in turns, each keeping its best. Per side: pairs/s by the wall clock and by this process's CPU
time (what a CPU shared with other work still measures fairly), the share of padded tokens its forwards
computed, on CUDA the mean GPU utilization (NVML, sampled every 0.1 s) and the peak memory.
`--interleave` takes the sides' steps in turns instead, one step each, each timed alone, so that a
load that comes and goes on a shared CPU falls on every side alike.

Reads STS-B train from the data folder (trainables.data.tasks) or, where that cannot be imported (a
GPU machine without pydantic), from `--pairs-file`, a TSV written here by `--export-pairs`:

    python benchmarks/fused.py --device cpu --members 1,2,4 --batch 8 --steps 5
    python benchmarks/fused.py --export-pairs .gpu/fused/stsb-train.tsv
    python benchmarks/fused.py --device cuda --model /tmp/minilm --pairs-file .gpu/fused/stsb-train.tsv
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import json
import sys
import time
from pathlib import Path

import torch
from utilization import Utilization

import trainables.models.dropout as dropout_module
from trainables.models.batching import TokenCache
from trainables.models.encoder import build_sentence_encoder, encoder_depth, load_config, load_tokenizer
from trainables.objectives.sts import CosineMSELoss
from trainables.runtime import linear_schedule
from trainables.training.bi_encoder import build_optimizer, epoch_batches, pair_lengths, train_step
from trainables.training.fused import FusedArray, MemberSettings, aligned_epoch_batches

MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}
LR, WARMUP_RATIO, WEIGHT_DECAY, MAX_GRAD_NORM, MAX_LENGTH = 2e-5, 0.1, 0.01, 1.0, 128


class Pairs:
    """Tokenized train pairs: each sentence's ids, the pairs' lengths and scores (scaled to [0, 1])."""

    def __init__(self, first: list[str], second: list[str], scores: list[float], tokenizer):
        self.tokens = TokenCache(tokenizer, MAX_LENGTH)
        self.first, self.second = first, second
        self.tokens.add(first + second)
        self.scores = torch.tensor(scores, dtype=torch.float32)
        self.lengths = pair_lengths(self.tokens, first, second)

    def order(self, seed: int, batch: int, steps: int, aligned: bool = False) -> list[list[int]]:
        """`steps` full batches in the length-grouped order a trial of `seed` draws, epoch after epoch;
        `aligned`: the same batches in the array's order (aligned_epoch_batches, the epoch as shared seed)."""
        batches, epoch = [], 1
        while len(batches) < steps:
            seed_of_epoch = seed * 1_000 + epoch
            drawn = (aligned_epoch_batches(self.lengths, batch, seed_of_epoch, epoch) if aligned
                     else epoch_batches(self.lengths, batch, seed_of_epoch, True))
            batches += [b for b in drawn if len(b) == batch]
            epoch += 1
        return batches[:steps]

    def token_lists(self, rows: list[int]) -> list[list[int]]:
        return [self.tokens[self.first[i]] for i in rows] + [self.tokens[self.second[i]] for i in rows]


def read_pairs(args, split: str = "train", path: str | None = None) -> tuple[list[str], list[str], list[float]]:
    """STS-B's `split` from `path` (train: `--pairs-file`; a TSV as `--export-pairs` writes) or the data folder."""
    path = path if path is not None or split != "train" else args.pairs_file
    if path:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t"))[1:]
        return [r[0] for r in rows], [r[1] for r in rows], [float(r[2]) for r in rows]
    from trainables.data.tasks import load_task  # pydantic: not on a bare GPU machine

    frame = getattr(load_task("stsb", data_folder=args.data_dir), split)
    return list(frame.sentence1), list(frame.sentence2), [float(s) for s in frame.score]


def export_pairs(path: str, pairs: tuple[list[str], list[str], list[float]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["sentence1", "sentence2", "score"])
        writer.writerows(zip(*pairs, strict=True))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Alone:
    """One trial's step, as the `finetune` learner takes it."""

    def __init__(self, model: torch.nn.Module, pairs: Pairs, batch: int, total: int, device, dtype, seed: int = 0,
                 packed: bool = False):
        self.model, self.pairs, self.device, self.dtype, self.members = model, pairs, device, dtype, 1
        self.packed = packed  # padding-free rows (benchmarks/padding_free.py)
        self.loss_fn = CosineMSELoss()
        self.optimizer = build_optimizer(list(model.named_parameters()), LR, WEIGHT_DECAY)
        self.scheduler = linear_schedule(self.optimizer, round(WARMUP_RATIO * total), total)
        self.batches, self.done = pairs.order(seed, batch, total), 0
        self.model.train()

    def step(self) -> tuple[int, int]:
        """One step; (real tokens, padded tokens) of its forward (one chunk a batch on an accelerator; a CPU
        cuts chunks by length, so it pads less than counted here; packed: none)."""
        rows = self.batches[self.done]
        self.done += 1
        lists = self.pairs.token_lists(rows)
        loss = train_step(self.model, self.loss_fn, self.optimizer, self.scheduler, lists, self.pairs.scores[rows],
                          self.pairs.tokens.pad_id, self.device, self.dtype, MAX_GRAD_NORM, packed=self.packed)
        loss.item()  # the trial's check for a finite loss
        real = sum(map(len, lists))
        return real, real if self.packed else len(lists) * max(map(len, lists))


class Fused:
    """K members of one start, each its own seed: its own data order and dropout masks."""

    def __init__(self, model: torch.nn.Module, members: int, pairs: Pairs, batch: int, total: int, device, dtype,
                 aligned: bool = False, shared_dropout: bool = False):
        settings = [MemberSettings(lr=LR, total_steps=total, warmup_steps=round(WARMUP_RATIO * total),
                                   weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM, seed=seed)
                    for seed in range(members)]
        self.array = FusedArray([model] * members, settings, pairs.tokens.pad_id, dtype=dtype,
                                shared_dropout_seed=0 if shared_dropout else None)
        self.pairs, self.members, self.done = pairs, members, 0
        self.orders = [pairs.order(seed, batch, total, aligned) for seed in range(members)]

    def step(self) -> tuple[int, int]:
        rows = [order[self.done] for order in self.orders]
        self.done += 1
        batches = [(self.pairs.token_lists(r), self.pairs.scores[r]) for r in rows]
        self.array.step(batches)
        lists = [lst for b in batches for lst in b[0]]
        return sum(map(len, lists)), len(lists) * max(map(len, lists))


SDPA_BACKENDS = {"flash": torch.backends.cuda.enable_flash_sdp,
                 "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
                 "cudnn": torch.backends.cuda.enable_cudnn_sdp, "math": torch.backends.cuda.enable_math_sdp}


def without_dropout(model: torch.nn.Module) -> None:
    """Every dropout module of `model` (torch's, the `fast` masks', a fused array's) set to drop nothing."""
    for module in model.modules():
        if "Dropout" in type(module).__name__ and isinstance(getattr(module, "p", None), float):
            module.p = 0.0


def run(side, steps: int, warmup: int, batch: int, device: torch.device) -> dict:
    """`warmup` untimed steps, then `steps` timed ones: pairs/s (wall clock, and per second of this
    process's CPU time), padded share, utilization, peak memory."""
    for _ in range(warmup):
        side.step()
    gc.collect()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    real = padded = 0
    with Utilization(device, every=0.1) as use:
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            r, p = side.step()
            real, padded = real + r, padded + p
        synchronize(device)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    pairs = side.members * batch * steps
    return {"pairs_per_s": pairs / seconds, "pairs_per_cpu_s": pairs / cpu_seconds, "seconds": seconds,
            "padded_share": 1 - real / padded, "utilization": use.mean, "peak_mib": peak}


def run_interleaved(sides: dict, steps: int, warmup: int, batch: int, device: torch.device) -> dict[str, dict]:
    """The sides' steps taken in turns, one step each, each step timed alone: on a machine whose load
    changes, every side sees the same load (no utilization or peak memory in this mode)."""
    for side in sides.values():
        for _ in range(warmup):
            side.step()
    totals = {name: [0.0, 0.0, 0, 0] for name in sides}  # seconds, CPU seconds, real and padded tokens
    for _ in range(steps):
        for name, side in sides.items():
            gc.collect()
            synchronize(device)
            started, cpu = time.perf_counter(), time.process_time()
            real, padded = side.step()
            synchronize(device)
            total = totals[name]
            total[0] += time.perf_counter() - started
            total[1] += time.process_time() - cpu
            total[2], total[3] = total[2] + real, total[3] + padded
    return {name: {"pairs_per_s": side.members * batch * steps / totals[name][0],
                   "pairs_per_cpu_s": side.members * batch * steps / totals[name][1], "seconds": totals[name][0],
                   "padded_share": 1 - totals[name][2] / totals[name][3], "utilization": None, "peak_mib": None}
            for name, side in sides.items()}


def table(label: str, rows: dict[str, dict], baseline: str = "alone") -> str:
    """The sides' figures, each against the `baseline` side's."""
    alone, alone_cpu = rows[baseline]["pairs_per_s"], rows[baseline]["pairs_per_cpu_s"]
    times, by_cpu = f"x {baseline}", f"x {baseline} by CPU time"
    lines = [label, f"{'side':>18} {'pairs/s':>9} {times:>8} {by_cpu:>20} {'padded':>7} {'GPU util':>9} "
                    f"{'peak MiB':>9}"]
    for name, row in rows.items():
        use = f"{row['utilization']:.0f} %" if row["utilization"] is not None else "n/a"
        peak = f"{row['peak_mib']:.0f}" if row["peak_mib"] is not None else "n/a"
        lines.append(f"{name:>18} {row['pairs_per_s']:9.1f} {row['pairs_per_s'] / alone:7.2f}x "
                     f"{row['pairs_per_cpu_s'] / alone_cpu:19.2f}x {100 * row['padded_share']:6.1f}% "
                     f"{use:>9} {peak:>9}")
    return "\n".join(lines)


def summary(rows: dict[str, dict], batch: int) -> str:
    """The largest array's gain over one trial and its utilization: the issue's goal figures (>= 10x at
    16 members, >= 85 % busy, on a GPU)."""
    name = max((n for n in rows if n.startswith("fused")), key=lambda n: (int(n.split()[1]), rows[n]["pairs_per_s"]))
    row, use = rows[name], rows[name]["utilization"]
    return (f"batch {batch}: {name} trains {row['pairs_per_s'] / rows['alone']['pairs_per_s']:.2f}x the pairs/s of "
            f"one trial alone" + (f", the GPU {use:.0f} % busy (alone {rows['alone']['utilization']:.0f} %)"
                                  if use is not None and rows["alone"]["utilization"] is not None else ""))


def setup(args) -> tuple:
    """(device, dtype, model name, layer, tokenized pairs) of a run: the parent's and each separate process's."""
    device = torch.device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    name = MODELS.get(args.model, args.model)
    layer = args.layer if args.layer is not None else encoder_depth(load_config(name))
    first, second, scores = read_pairs(args)
    pairs = Pairs(first, second, scores, load_tokenizer(name))  # scores in [0, 1], as load_task gives them
    return device, dtype, name, layer, pairs


def configure(args) -> None:
    """The attention settings of every side, in this process (and in each separate one)."""
    dropout_module.EXPLICIT_TRAINING_ON_CUDA = args.train_attention == "explicit"
    if args.sdpa_backends:
        chosen = set(args.sdpa_backends.split(","))
        for name, enable in SDPA_BACKENDS.items():
            enable(name in chosen)


def starting_model(args, name: str, layer: int) -> torch.nn.Module:
    """Every side's start: the model cut at `layer`, mean pooling, the `fast` dropout masks (none: no dropout)."""
    start = build_sentence_encoder(name, layer, "mean", dropout_masks="fast")
    if args.dropout == "none":
        without_dropout(start)
    return start


def separate_process(argv: list[str], threads: int, batch: int, seed: int, barrier, results) -> None:
    """One of K trials run as separate processes: its own model, optimizer and data order (`seed`), `--warmup`
    untimed steps, then, once every process is ready (`barrier`), `--steps` timed ones; puts (start, end, CPU
    seconds, real tokens, padded tokens) on `results`."""
    args = parser_of().parse_args(argv)
    torch.set_num_threads(threads)
    configure(args)
    device, dtype, name, layer, pairs = setup(args)
    total = args.warmup + args.steps
    side = Alone(starting_model(args, name, layer).to(device), pairs, batch, total, device, dtype, seed)
    for _ in range(args.warmup):
        side.step()
    synchronize(device)
    barrier.wait()
    started, cpu = time.perf_counter(), time.process_time()  # CLOCK_MONOTONIC: comparable across processes
    real = padded = 0
    for _ in range(args.steps):
        r, p = side.step()
        real, padded = real + r, padded + p
    synchronize(device)
    results.put((started, time.perf_counter(), time.process_time() - cpu, real, padded))


def run_separate(argv: list[str], count: int, batch: int, steps: int, device: torch.device) -> dict:
    """K trials as K processes at once on the same device (each `threads // K` torch threads, at least 1: the
    same cores as one trial): aggregate pairs/s from the first process's start to the last one's end."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    barrier, results = context.Barrier(count + 1), context.Queue()
    threads = max(1, torch.get_num_threads() // count)
    workers = [context.Process(target=separate_process, args=(argv, threads, batch, seed, barrier, results))
               for seed in range(count)]
    for worker in workers:
        worker.start()
    barrier.wait(timeout=1800)
    with Utilization(device, every=0.1) as use:
        found = [results.get(timeout=3600) for _ in workers]
    for worker in workers:
        worker.join()
    seconds = max(end for _, end, *_ in found) - min(start for start, *_ in found)
    pairs = count * batch * steps
    return {"pairs_per_s": pairs / seconds, "pairs_per_cpu_s": pairs / sum(f[2] for f in found),
            "seconds": seconds, "padded_share": 1 - sum(f[3] for f in found) / sum(f[4] for f in found),
            "utilization": use.mean, "peak_mib": None}


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="minilm", help="minilm, mpnet, a hub id or a model folder")
    parser.add_argument("--layer", type=int, default=None, help="truncate to this many layers (default: all)")
    parser.add_argument("--members", default="1,2,4,8,16", help="fused array sizes, comma-separated")
    parser.add_argument("--batch", default="32,128", help="pairs per member per step, comma-separated")
    parser.add_argument("--order", default="trial,aligned",
                        help="the members' batch orders: trial (each its trial's own), aligned (the same batches in "
                             "the array's order: aligned_epoch_batches), or both, comma-separated")
    parser.add_argument("--dropout", choices=("member", "shared", "none"), default="member",
                        help="member: each member draws its own dropout masks (the default); shared: one draw for "
                             "the whole array (FusedArray's shared_dropout_seed); none: every side without dropout "
                             "(what the masks cost: attention then runs SDPA's kernel in training too)")
    parser.add_argument("--train-attention", choices=("sdpa", "explicit"), default="sdpa",
                        help="training attention that drops nothing on CUDA: SDPA's kernel (sdpa) or the fp32 "
                             "math the dropout path computes (explicit; trainables.models.dropout)")
    parser.add_argument("--sdpa-backends", default=None,
                        help="only these of SDPA's backends, comma-separated: flash, efficient, cudnn, math "
                             "(default: torch's choice among all)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--interleave", action="store_true",
                        help="the sides' steps in turns, each timed alone (a CPU shared with other work)")
    parser.add_argument("--repeats", type=int, default=1, help="turns per side; each side keeps its best")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                        help="bf16 autocast or fp32 (default: bf16 on CUDA, fp32 on a CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--data-dir", default=None, help="the data folder holding stsb/ (default: the project's)")
    parser.add_argument("--pairs-file", default=None, help="train pairs as the TSV --export-pairs writes")
    parser.add_argument("--export-pairs", default=None, metavar="PATH", help="write STS-B train as a TSV and exit")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    parser.add_argument("--separate", default="", help="also K trials as K processes at once, for each K here "
                                                       "(comma-separated; each process threads // K torch threads)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = parser_of()
    args = parser.parse_args(argv)
    if args.export_pairs:
        pairs = read_pairs(args)
        export_pairs(args.export_pairs, pairs)
        print(f"{len(pairs[0])} pairs written to {args.export_pairs}")
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sdpa_backends and (not set(args.sdpa_backends.split(",")) or
                               set(args.sdpa_backends.split(",")) - set(SDPA_BACKENDS)):
        parser.error(f"--sdpa-backends {args.sdpa_backends}: give some of {', '.join(SDPA_BACKENDS)}")
    configure(args)
    sizes, batches = [int(v) for v in args.members.split(",")], [int(v) for v in args.batch.split(",")]
    orders = args.order.split(",")
    if set(orders) - {"trial", "aligned"}:
        parser.error(f"--order {args.order}: give trial, aligned or both")
    separate = [int(v) for v in args.separate.split(",") if v.strip()]
    device, dtype, name, layer, pairs = setup(args)
    threads = f"CPU, {torch.get_num_threads()} threads"
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else threads
    print(f"{hardware}; torch {torch.__version__}; {Path(name).name} at layer {layer}; "
          f"{'bf16 autocast' if dtype == torch.bfloat16 else 'fp32'}; {args.steps} timed steps after {args.warmup}",
          flush=True)
    print(f"training attention without dropout: {args.train_attention}; SDPA's backends: "
          f"{args.sdpa_backends or 'all'}", flush=True)
    record = {"device": hardware, "torch": torch.__version__, "model": Path(name).name, "layer": layer,
              "train_attention": args.train_attention, "sdpa_backends": args.sdpa_backends,
              "precision": str(dtype).removeprefix("torch."), "steps": args.steps, "runs": []}
    start = starting_model(args, name, layer)
    total = args.warmup + args.steps
    specs = [("alone", 1, "trial")] + [(f"fused {k}" + (" aligned" if order == "aligned" else ""), k, order)
                                       for k in sizes for order in (orders if k > 1 else orders[:1])]
    shared = args.dropout == "shared"

    def build(label: str, k: int, order: str):
        model = copy.deepcopy(start).to(device)
        if label == "alone":
            return Alone(model, pairs, batch, total, device, dtype)
        return Fused(model, k, pairs, batch, total, device, dtype, order == "aligned", shared)

    for batch in batches:
        rows: dict[str, dict] = {}
        for _ in range(args.repeats):
            if args.interleave:
                measured = run_interleaved({label: build(label, k, order) for label, k, order in specs},
                                           args.steps, args.warmup, batch, device)
            else:
                measured = {}
                for label, k, order in specs:  # each side built afresh and freed after: its own peak memory
                    measured[label] = run(build(label, k, order), args.steps, args.warmup, batch, device)
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            for count in separate:  # K processes at once, the same cores
                measured[f"separate {count}"] = run_separate(argv if argv is not None else sys.argv[1:], count,
                                                             batch, args.steps, device)
            for label, row in measured.items():
                if label not in rows or row["pairs_per_s"] > rows[label]["pairs_per_s"]:
                    rows[label] = row
        print(table(f"batch {batch} (pairs per member per step), dropout masks: {args.dropout}", rows), flush=True)
        print(summary(rows, batch), flush=True)
        record["runs"].append({"batch": batch, "sides": rows})
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
