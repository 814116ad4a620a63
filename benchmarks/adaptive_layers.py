"""One `finetune` training with `adaptive_layers` against a separately truncated training at every depth, side by
side: dev and test Spearman x100 at each layer 1..k of the one model (scored with its head, as a model cut there)
and of the model cut at that layer and trained alone, with the same data, epochs, lr and seed; and the seconds
each took. Quality, not speed: the question the method answers is whether one training serves every layer.

    python benchmarks/adaptive_layers.py --data-dir ../shared/data [--train 2000] [--epochs 1] [--seeds 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trainables.contract import collect
from trainables.kinds import get_kind

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--layer", type=int, default=6, help="the cut of the adaptive training (its deepest layer)")
    parser.add_argument("--train", type=int, default=2000, help="STS-B train pairs")
    parser.add_argument("--eval", type=int, default=500, help="dev and test pairs (each)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if min(args.layer, args.train, args.eval, args.epochs, args.threads) < 1:
        parser.error("--layer, --train, --eval, --epochs and --threads must be at least 1")
    finetune = get_kind("finetune")
    base = {"model": args.model, "task": "stsb", "epochs": args.epochs, "lr": args.lr, "batch_size": 32,
            "max_train_samples": args.train, "max_eval_samples": args.eval, "data_dir": args.data_dir,
            "device": "cpu", "num_threads": args.threads}
    seeds = [int(s) for s in args.seeds.split(",")]
    layers = range(1, args.layer + 1)
    one: dict[int, list[float]] = {j: [] for j in layers}
    alone: dict[int, list[float]] = {j: [] for j in layers}
    seconds = {"adaptive": 0.0, "alone": 0.0}
    for seed in seeds:
        started = time.perf_counter()
        final = finetune.run({**base, "seed": seed, "layer": args.layer, "adaptive_layers": True}, collect([]))
        seconds["adaptive"] += time.perf_counter() - started
        for j in layers:
            one[j].append(final[f"layer{j}_test_spearman"])
            started = time.perf_counter()
            cut = finetune.run({**base, "seed": seed, "layer": j}, collect([]))
            seconds["alone"] += time.perf_counter() - started
            alone[j].append(cut["test_spearman"])
    print(f"{args.model}, STS-B {args.train} train pairs, {args.epochs} epoch(s), lr {args.lr}, seeds {seeds}; test "
          f"Spearman x100 on {args.eval} pairs")
    print(f"{'layer':>5} {'one training':>13} {'trained alone':>14} {'difference':>11}")
    for j in layers:
        a, b = statistics.mean(one[j]), statistics.mean(alone[j])
        print(f"{j:>5} {a:>13.2f} {b:>14.2f} {a - b:>+11.2f}")
    print(f"seconds: one adaptive training {seconds['adaptive']:.0f}, {len(layers)} trainings alone "
          f"{seconds['alone']:.0f} ({seconds['alone'] / seconds['adaptive']:.2f}x)")


if __name__ == "__main__":
    main()
