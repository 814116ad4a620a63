"""Padding-free training (`padding: packed`, trainables.models.padding_free) against the padded path: one
`finetune` trial's step both ways, pairs/s side by side in one run, and, with `--score-epochs`, what each way's
training scores on STS-B test.

Both sides are benchmarks/fused.py's `Alone` (the trial's step: build_sentence_encoder with `dropout_masks:
fast`, RowAdamW, the linear schedule, clipping at 1.0, `loss.item()` after each step), built afresh from one
start, with the same data order; "padded" pads each chunk (a CPU: length-sorted chunks; an accelerator: the batch
in one forward), "packed" lays the batch's sentences in one row and pads only attention's groups (or none: torch's
varlen kernel on CUDA in bf16 when nothing is dropped). `--warmup` untimed steps, then `--steps` timed ones from
the same start to the same end; `--repeats` turns, each side keeping its best; `--interleave` alternates single
steps (a CPU whose load changes). The "padded" column is the share of the forward's tokens that were padding.

`--score-epochs N` then trains each side N epochs of STS-B train (the trial's length-grouped order, seed 0) and
scores STS-B test: Spearman x 100 of the cosines, both sides scored by the same padded evaluation, so the
difference is the training's alone (packed draws other dropout masks: a different draw, not a different method).

    python benchmarks/padding_free.py --device cpu --batch 32 --steps 10
    python benchmarks/padding_free.py --device cpu --batch 32 --score-epochs 1 --layer 3
    python benchmarks/padding_free.py --export-pairs .gpu/padding   # train.tsv and test.tsv for a GPU machine
    python benchmarks/padding_free.py --device cuda --model /tmp/minilm --pairs-file .gpu/padding/train.tsv \
        --test-file .gpu/padding/test.tsv --batch 128 --score-epochs 1
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
from pathlib import Path

import torch
from fused import Alone, configure, export_pairs, read_pairs, run, run_interleaved, setup, starting_model, table

from trainables.models.batching import encode_tokens
from trainables.models.padding_free import packing_refusal


def read_test(args) -> tuple[list[str], list[str], list[float]]:
    """STS-B test from `--test-file` (a TSV as --export-pairs writes) or the data folder."""
    return read_pairs(args, "test", args.test_file)


def spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def score(model: torch.nn.Module, test: tuple, tokens, device: torch.device) -> float:
    """STS-B test Spearman x 100 of the cosines, evaluated padded in fp32 (the trial's scoring)."""
    first, second, gold = test
    tokens.add(first + second)
    model.eval()
    with torch.inference_mode():
        vectors = encode_tokens(model, tokens.lookup(first + second), tokens.pad_id, device, fewest_padded=True)
    model.train()
    vectors = torch.nn.functional.normalize(vectors.double(), dim=-1)
    cosines = (vectors[: len(first)] * vectors[len(first):]).sum(-1).tolist()
    return 100 * spearman(cosines, gold)


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="minilm", help="minilm, mpnet, a hub id or a model folder")
    parser.add_argument("--layer", type=int, default=None, help="truncate to this many layers (default: all)")
    parser.add_argument("--batch", default="32,128", help="pairs per step, comma-separated")
    parser.add_argument("--dropout", choices=("member", "none"), default="member",
                        help="member: the trial's dropout (its fast masks); none: no dropout (packed attention "
                             "then runs torch's varlen kernel on CUDA in bf16)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--interleave", action="store_true", help="the sides' steps in turns, each timed alone")
    parser.add_argument("--repeats", type=int, default=1, help="turns per side; each side keeps its best")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                        help="bf16 autocast or fp32 (default: bf16 on CUDA, fp32 on a CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--score-epochs", type=int, default=0,
                        help="then train each side this many epochs and score STS-B test (0: speed only)")
    parser.add_argument("--data-dir", default=None, help="the data folder holding stsb/ (default: the project's)")
    parser.add_argument("--pairs-file", default=None, help="train pairs as the TSV --export-pairs writes")
    parser.add_argument("--test-file", default=None, help="test pairs as the TSV --export-pairs writes")
    parser.add_argument("--export-pairs", default=None, metavar="FOLDER",
                        help="write STS-B train.tsv and test.tsv into FOLDER and exit")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    # what fused.setup and fused.configure read
    parser.set_defaults(train_attention="sdpa", sdpa_backends=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = parser_of()
    args = parser.parse_args(argv)
    if args.export_pairs:
        for split, pairs in (("train", read_pairs(args)), ("test", read_test(args))):
            export_pairs(str(Path(args.export_pairs) / f"{split}.tsv"), pairs)
            print(f"{len(pairs[0])} {split} pairs written to {Path(args.export_pairs) / f'{split}.tsv'}")
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    configure(args)
    device, dtype, name, layer, pairs = setup(args)
    start = starting_model(args, name, layer)
    refusal = packing_refusal(start.encoder)
    if refusal:
        parser.error(f"--model {args.model}: cannot train packed: {refusal}")
    threads = f"CPU, {torch.get_num_threads()} threads"
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else threads
    print(f"{hardware}; torch {torch.__version__}; {Path(name).name} at layer {layer}; "
          f"{'bf16 autocast' if dtype == torch.bfloat16 else 'fp32'}; dropout: {args.dropout}; "
          f"{args.steps} timed steps after {args.warmup}", flush=True)
    record = {"device": hardware, "torch": torch.__version__, "model": Path(name).name, "layer": layer,
              "precision": str(dtype).removeprefix("torch."), "dropout": args.dropout, "steps": args.steps,
              "runs": []}
    total = args.warmup + args.steps

    def build(side: str, batch: int, steps: int) -> Alone:
        return Alone(copy.deepcopy(start).to(device), pairs, batch, steps, device, dtype, packed=side == "packed")

    for batch in [int(v) for v in args.batch.split(",")]:
        rows: dict[str, dict] = {}
        for _ in range(args.repeats):
            if args.interleave:
                measured = run_interleaved({side: build(side, batch, total) for side in ("padded", "packed")},
                                           args.steps, args.warmup, batch, device)
            else:
                measured = {}
                for side in ("padded", "packed"):
                    measured[side] = run(build(side, batch, total), args.steps, args.warmup, batch, device)
                    gc.collect()
            for side, row in measured.items():
                if side not in rows or row["pairs_per_s"] > rows[side]["pairs_per_s"]:
                    rows[side] = row
        print(table(f"batch {batch} (pairs per step)", rows, "padded"), flush=True)
        entry = {"batch": batch, "sides": rows}
        if args.score_epochs:
            test = read_test(args)
            steps = math.floor(len(pairs.lengths) / batch) * args.score_epochs  # full batches only
            scores = {}
            for side in ("padded", "packed"):
                trained = build(side, batch, steps)
                for _ in range(steps):
                    trained.step()
                scores[side] = score(trained.model, test, pairs.tokens, device)
                del trained
                gc.collect()
            print(f"batch {batch}: STS-B test Spearman x100 after {args.score_epochs} epoch(s) ({steps} steps): "
                  f"padded {scores['padded']:.2f}, packed {scores['packed']:.2f} "
                  f"(difference {scores['packed'] - scores['padded']:+.2f})", flush=True)
            entry["test_spearman"] = scores
        record["runs"].append(entry)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
