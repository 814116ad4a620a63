"""Layer-wise learning-rate decay (`layer_lr_decay`, ELECTRA's `_get_layer_lrs`) against a flat learning rate, side
by side: `finetune` trials of the same model, data, epochs and seeds at each (lr, decay) setting and each cut, their
dev and test Spearman x100. ELECTRA fine-tunes base models at lr 1e-4 with decay 0.8; the reference paper of this
project used 2e-5 without it. Quality, not speed.

    python benchmarks/layer_lr_decay.py --data-dir ../shared/data [--settings 2e-5:1.0,1e-4:1.0,1e-4:0.8]
"""

from __future__ import annotations

import argparse
import statistics

from trainables.contract import collect
from trainables.kinds import get_kind

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def settings_of(text: str) -> list[tuple[float, float]]:
    pairs = []
    for part in text.split(","):
        lr, _, decay = part.partition(":")
        pairs.append((float(lr), float(decay or 1.0)))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--layers", default="3,6")
    parser.add_argument("--settings", default="2e-5:1.0,1e-4:1.0,1e-4:0.8", help="lr:decay pairs")
    parser.add_argument("--train", type=int, default=2000, help="STS-B train pairs")
    parser.add_argument("--eval", type=int, default=500, help="dev and test pairs (each)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        settings = settings_of(args.settings)
        layers = [int(x) for x in args.layers.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as exc:
        parser.error(f"--settings (lr:decay,...), --layers and --seeds must be numbers: {exc}")
    if min(args.train, args.eval, args.epochs, args.threads, *layers) < 1 or any(
            lr <= 0 or not 0 < decay <= 1 for lr, decay in settings):
        parser.error("--train, --eval, --epochs, --threads and the layers must be at least 1; lr > 0, 0 < decay <= 1")
    finetune = get_kind("finetune")
    base = {"model": args.model, "task": "stsb", "epochs": args.epochs, "batch_size": 32,
            "max_train_samples": args.train, "max_eval_samples": args.eval, "data_dir": args.data_dir,
            "device": "cpu", "num_threads": args.threads}
    print(f"{args.model}, STS-B {args.train} train pairs, {args.epochs} epoch(s), seeds {seeds}; Spearman x100 on "
          f"{args.eval} pairs, dev (best epoch) / test")
    print(f"{'layer':>5} " + " ".join(f"{f'lr {lr:g}, decay {decay:g}':>24}" for lr, decay in settings))
    for layer in layers:
        cells = []
        for lr, decay in settings:
            runs = [finetune.run({**base, "layer": layer, "lr": lr, "layer_lr_decay": decay, "seed": seed},
                                 collect([])) for seed in seeds]
            dev = statistics.mean(r["best_dev_spearman"] for r in runs)
            test = statistics.mean(r["test_spearman"] for r in runs)
            cells.append(f"{dev:>11.2f} / {test:>6.2f}")
        print(f"{layer:>5} " + " ".join(f"{c:>24}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
