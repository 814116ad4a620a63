"""Where our GPU epoch's time goes: the learner's build (model load, tokenization) against its
training round, under cProfile, with sentence-transformers' epoch timed beside it (a warm-up of
both first). What showed, on an H200, that training cut each step into CPU-sized chunks (253
encoder forwards for 45 steps at batch 128).

    python benchmarks/device/profile_epoch.py /tmp/minilm .gpu/data > $OUT/prof.log
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from epoch import our_epoch, sentence_transformers_epoch  # noqa: E402

from trainables.data.tasks import load_task  # noqa: E402
from trainables.kinds import get_kind  # noqa: E402
from trainables.models.batching import forget_shared_tokens  # noqa: E402
from trainables.models.encoder import encoder_depth, load_config  # noqa: E402
from trainables.runtime import prepare  # noqa: E402
from trainables.training.loop import seed_round  # noqa: E402


def main(model: str, data_dir: str, device: str = "cuda") -> None:
    data = load_task("stsb", data_folder=data_dir)
    our_epoch(data_dir, "fp32", model, device, 128, 512, score=False)  # warm-up: CUDA, cuBLAS, kernels
    sentence_transformers_epoch(data.train.head(512), data.test, False, model, device, 128, score=False)
    for batch in (128, 32):
        kind = get_kind("finetune")
        cfg = kind.parse({"model": model, "task": "stsb", "layer": encoder_depth(load_config(model)), "epochs": 1,
                          "lr": 2e-5, "batch_size": batch, "warmup_ratio": 0.1, "loss": "cosine_mse",
                          "precision": "fp32", "data_dir": data_dir, "device": device})
        resolved, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
        seed_round(0, 0)
        forget_shared_tokens()
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        learner = kind.build(cfg, resolved, dtype)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        built = time.perf_counter()
        seed_round(0, 1)
        learner.train_round(1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        trained = time.perf_counter()
        profile.disable()
        peer_started = time.perf_counter()
        sentence_transformers_epoch(data.train, data.test, False, model, device, batch, score=False)
        print(f"batch {batch}: ours build {built - started:.2f} s, train_round {trained - built:.2f} s "
              f"({len(learner.lengths)} pairs); ST epoch {time.perf_counter() - peer_started:.2f} s", flush=True)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:4])
