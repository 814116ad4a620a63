"""Same-seed variation against seed-to-seed spread: how far a `finetune` trial rerun with its own seed lands
from itself, set beside how far trials of different seeds land from each other (issue 54, item 6).

On a CPU a rerun repeats its trial bit for bit (the same kernels in the same order), so the same-seed column
is 0. On a GPU some kernels (atomics in backward passes, cuBLAS's split-K choices) may add in another order
each run; this measures how large that is next to the seed-to-seed standard deviation the report's tests
use, which is what `verify --rerun` shows for a study's own replicates.

Each run is one `finetune` trial built as the orchestrator builds it (the kind's `parse` and `build`, the
training loop's seeding per round), trained `--epochs` epochs on the first `--pairs` STS-B train pairs and
scored on dev and test. `--repeats` runs of seed 0, then one run of each of `--seeds` seeds (seed 0's run is
the first repeat). Per precision: each run's dev and test Spearman (x100), the largest difference between
same-seed runs, the largest weight difference between them, and the seeds' standard deviation.

    python benchmarks/same_seed.py --device cpu --model tiny --pairs 64 --repeats 2 --seeds 2
    python benchmarks/same_seed.py --device cuda --model /tmp/minilm --data-dir .gpu/data --precision fp32,bf16

`--json PATH` writes every figure to PATH as well.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trainables.kinds import get_kind
from trainables.models.encoder import encoder_depth, load_config
from trainables.runtime import prepare
from trainables.training.loop import seed_round, weights_of

MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}


def one_run(model: str, seed: int, precision: str, device: str, epochs: int, pairs: int | None, batch: int,
            data_dir: str | None, eval_samples: int | None) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """({dev, test} Spearman x100, the trained weights on the CPU) of one `finetune` trial of `seed`."""
    kind = get_kind("finetune")
    cfg = kind.parse({"model": model, "task": "stsb", "layer": encoder_depth(load_config(model)), "seed": seed,
                      "epochs": epochs, "lr": 2e-5, "batch_size": batch, "warmup_ratio": 0.1, "loss": "cosine_mse",
                      "precision": precision, "data_dir": data_dir, "device": device, "max_train_samples": pairs,
                      "max_eval_samples": eval_samples})
    resolved, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    seed_round(cfg.seed, 0)  # as the training loop seeds the build
    learner = kind.build(cfg, resolved, dtype)
    for round_ in range(1, epochs + 1):
        seed_round(cfg.seed, round_)
        learner.train_round(round_)
    scores = {split: learner.evaluate(split)[0][f"{split}_spearman"] for split in ("dev", "test")}
    weights = {name: value.detach().float().cpu() for name, value in weights_of(learner).items()
               if value.is_floating_point()}
    return scores, weights


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def measure(args, precision: str) -> dict:
    runs, weights = [], []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        scores, trained = one_run(args.model, 0, precision, args.device, args.epochs, args.pairs, args.batch,
                                  args.data_dir, args.max_eval_samples)
        runs.append(scores)
        weights.append(trained)
        print(f"{precision} seed 0 run {repeat + 1}: dev {scores['dev']:.4f} test {scores['test']:.4f} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    seeds = [runs[0]]
    for seed in range(1, args.seeds):
        scores, _ = one_run(args.model, seed, precision, args.device, args.epochs, args.pairs, args.batch,
                            args.data_dir, args.max_eval_samples)
        seeds.append(scores)
        print(f"{precision} seed {seed}: dev {scores['dev']:.4f} test {scores['test']:.4f}", flush=True)
    out: dict = {"precision": precision, "same_seed_runs": runs, "seed_runs": seeds,
                 "same_seed_weight_difference": max((largest_difference(weights[0], w) for w in weights[1:]),
                                                    default=0.0)}
    for split in ("dev", "test"):
        same = [r[split] for r in runs]
        out[f"{split}_same_seed_range"] = max(same) - min(same)
        out[f"{split}_seed_sd"] = statistics.stdev([r[split] for r in seeds]) if len(seeds) > 1 else None
    return out


def line(row: dict) -> str:
    parts = []
    for split in ("dev", "test"):
        sd = row[f"{split}_seed_sd"]
        same = row[f"{split}_same_seed_range"]
        parts.append(f"{split} same-seed range {same:.4f}" + (
            f" against seed SD {sd:.4f} ({same / sd:.3f} of it)" if sd else ""))
    parts.append(f"largest same-seed weight difference {row['same_seed_weight_difference']:.3g}")
    return f"{row['precision']}: " + " · ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="minilm", help="minilm, a hub id or a model folder")
    parser.add_argument("--data-dir", default=None, help="the data folder holding stsb/ (default: the project's)")
    parser.add_argument("--precision", default="fp32", help="fp32, bf16 or both comma-separated")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=None, help="train pairs (default: all 5,749)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-eval-samples", type=int, default=None, help="dev and test pairs scored (all)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of seed 0")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1, one run each")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.repeats < 2 or args.seeds < 2:
        parser.error("--repeats and --seeds: at least 2 each (a range and a standard deviation need two)")
    args.model = MODELS.get(args.model, args.model)
    rows = [measure(args, precision.strip()) for precision in args.precision.split(",")]
    for row in rows:
        print(line(row), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                       "torch": torch.__version__, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
