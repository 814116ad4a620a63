"""One `finetune` training with 2D Matryoshka (`adaptive_layers` with `matryoshka_dims`: sentence-transformers'
Matryoshka2dLoss, Starbucks' training) against a separate training for each (layer, size) cell, side by side:
test Spearman x100 of the one model at layer j and its vectors' first d dimensions (scored with its head and
best-dev weights), and of a model cut at layer j trained on its first d dimensions alone (`matryoshka_dims: [d]`),
with the same data, epochs, lr and seed; and the seconds each took. Quality, not speed: the question the method
answers is whether one training serves every cell (Starbucks, arXiv 2410.13230: STS average 0.7837 against
0.7644 for separately trained models, on BERT-base with full STS training).

    python benchmarks/matryoshka_2d.py --data-dir ../shared/data [--layers 2,4,6] [--dims 384,128,32]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trainables.contract import collect
from trainables.kinds import get_kind

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--layers", default="2,4,6", help="the layers compared; the deepest is the 2D training's cut")
    parser.add_argument("--dims", default="384,128,32", help="the sizes compared (the largest: the whole vector)")
    parser.add_argument("--dims-per-step", type=int, default=1, help="sizes drawn per step (Matryoshka2dLoss: 1)")
    parser.add_argument("--train", type=int, default=2000, help="STS-B train pairs")
    parser.add_argument("--eval", type=int, default=500, help="dev and test pairs (each)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        layers, dims, seeds = numbers(args.layers), numbers(args.dims), numbers(args.seeds)
    except ValueError as exc:
        parser.error(f"--layers, --dims and --seeds are comma lists of integers: {exc}")
    if min(*layers, *dims, args.dims_per_step, args.train, args.eval, args.epochs, args.threads) < 1:
        parser.error("layers, sizes, --dims-per-step, --train, --eval, --epochs and --threads must be at least 1")
    finetune = get_kind("finetune")
    base = {"model": args.model, "task": "stsb", "epochs": args.epochs, "lr": args.lr, "batch_size": 32,
            "max_train_samples": args.train, "max_eval_samples": args.eval, "data_dir": args.data_dir,
            "device": "cpu", "num_threads": args.threads}
    cut = max(layers)
    one: dict[tuple[int, int], list[float]] = {(j, d): [] for j in layers for d in dims}
    alone: dict[tuple[int, int], list[float]] = {(j, d): [] for j in layers for d in dims}
    seconds = {"one": 0.0, "alone": 0.0}
    for seed in seeds:
        started = time.perf_counter()
        final = finetune.run({**base, "seed": seed, "layer": cut, "adaptive_layers": True, "matryoshka_dims": dims,
                              "matryoshka_dims_per_step": min(args.dims_per_step, len(dims))}, collect([]))
        seconds["one"] += time.perf_counter() - started
        for j in layers:
            for d in dims:
                one[j, d].append(final[f"layer{j}_dim{d}_test_spearman"])
                started = time.perf_counter()
                trained = finetune.run({**base, "seed": seed, "layer": j, "matryoshka_dims": [d]}, collect([]))
                seconds["alone"] += time.perf_counter() - started
                alone[j, d].append(trained[f"dim{d}_test_spearman"])
    print(f"{args.model}, STS-B {args.train} train pairs, {args.epochs} epoch(s), lr {args.lr}, seeds {seeds}; test "
          f"Spearman x100 on {args.eval} pairs: one 2D training / trained alone (difference)")
    print(f"{'layer':>5} " + " ".join(f"{f'd = {d}':>24}" for d in dims))
    for j in layers:
        cells = []
        for d in dims:
            a, b = statistics.mean(one[j, d]), statistics.mean(alone[j, d])
            cells.append(f"{a:.2f} / {b:.2f} ({a - b:+.2f})")
        print(f"{j:>5} " + " ".join(f"{c:>24}" for c in cells))
    mean_one = statistics.mean(statistics.mean(v) for v in one.values())
    mean_alone = statistics.mean(statistics.mean(v) for v in alone.values())
    print(f"mean over the cells: one training {mean_one:.2f}, trained alone {mean_alone:.2f} "
          f"({mean_one - mean_alone:+.2f})")
    print(f"seconds: one 2D training {seconds['one']:.0f}, {len(one)} trainings alone {seconds['alone']:.0f} "
          f"({seconds['alone'] / seconds['one']:.2f}x)")


if __name__ == "__main__":
    main()
