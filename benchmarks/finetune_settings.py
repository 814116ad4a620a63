"""`finetune` settings side by side: trials of the same model, data, epochs and seeds at each setting and each cut,
their dev (best epoch) and test Spearman x100. A setting is `key=value,...` (values read as YAML); settings are
separated by `;`. The default compares the learning rate and ELECTRA's layer-wise decay (`layer_lr_decay`:
ELECTRA fine-tunes base models at lr 1e-4 with decay 0.8; this project's reference paper used 2e-5 without it).
Quality, not speed.

    python benchmarks/finetune_settings.py --data-dir ../shared/data
    python benchmarks/finetune_settings.py --data-dir ../shared/data \\
        --settings "pooling_layers=last;pooling_layers=first_last;pooling_layers=scalar_mix"
"""

from __future__ import annotations

import argparse
import statistics

import yaml

from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.kinds import get_kind

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT = "lr=2e-5;lr=1e-4;lr=1e-4,layer_lr_decay=0.8"


def settings_of(text: str) -> list[dict]:
    """`key=value,...;...` -> one dict per setting, each value read as YAML (`1e-4` a float, `last` a string)."""
    settings = []
    for part in text.split(";"):
        setting = {}
        for pair in filter(None, part.split(",")):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{pair!r} is not key=value")
            setting[key.strip()] = yaml.safe_load(value)
        settings.append(setting)
    return settings


def label(setting: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in setting.items()) or "defaults"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--layers", default="3,6")
    parser.add_argument("--settings", default=DEFAULT, help="key=value,... settings separated by ;")
    parser.add_argument("--lr", type=float, default=2e-5, help="where a setting does not name lr")
    parser.add_argument("--train", type=int, default=2000, help="train pairs (STS-B's, or a setting's train_data's)")
    parser.add_argument("--eval", type=int, default=500, help="dev and test pairs (each)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        settings = settings_of(args.settings)
        layers = [int(x) for x in args.layers.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except (ValueError, yaml.YAMLError) as exc:
        parser.error(f"--settings (key=value,...;...), --layers and --seeds: {exc}")
    if min(args.train, args.eval, args.epochs, args.threads, *layers) < 1 or args.lr <= 0:
        parser.error("--train, --eval, --epochs, --threads and the layers must be at least 1, --lr above 0")
    finetune = get_kind("finetune")
    base = {"model": args.model, "task": "stsb", "epochs": args.epochs, "batch_size": 32, "lr": args.lr,
            "max_train_samples": args.train, "max_eval_samples": args.eval, "data_dir": args.data_dir,
            "device": "cpu", "num_threads": args.threads}
    for setting in settings:  # every setting checked before the first trial trains
        try:
            finetune.parse({**base, **setting, "layer": layers[0], "seed": seeds[0]})
        except UserInputError as exc:
            parser.error(str(exc))
    width = max(24, *(len(label(s)) for s in settings))
    print(f"{args.model}, at most {args.train} train pairs (STS-B's unless a setting names train_data), "
          f"{args.epochs} epoch(s), seeds {seeds}; STS-B Spearman x100 on {args.eval} pairs, dev (best epoch) / test")
    print(f"{'layer':>5} " + " ".join(f"{label(s):>{width}}" for s in settings))
    for layer in layers:
        cells = []
        for setting in settings:
            runs = [finetune.run({**base, **setting, "layer": layer, "seed": seed}, collect([])) for seed in seeds]
            dev = statistics.mean(r["best_dev_spearman"] for r in runs)
            test = statistics.mean(r["test_spearman"] for r in runs)
            cells.append(f"{dev:.2f} / {test:.2f}")
        print(f"{layer:>5} " + " ".join(f"{c:>{width}}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
