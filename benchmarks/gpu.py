"""The first GPU's numbers, ready before it arrives: our `finetune` against sentence-transformers on
one device, then several trials packed on it through the orchestrator.

1. Side by side, per model and batch size: one epoch over the first `--pairs` STS-B train pairs,
   ours at precision `auto` and `fp32` against sentence-transformers' trainer at fp32 and (where
   bf16 is fast) `bf16=True`, each timed from the same start (data in memory, no model loaded,
   nothing tokenized) to the same end (the epoch done, the device synchronized); then encoding the
   test sentences (ours: the evaluator's embedder; theirs: `encode`, fp32 and a bf16 model).
   `--score`: each side's test Spearman after its epoch too (equal Spearman is what makes the ratio fair).
   On a GPU an untimed short round of every side runs first (`--warmup`: CUDA's context, cuBLAS's
   handles and kernels loaded, which would otherwise fall on whichever side runs first), and
   `--repeats N` measures the sides in turns, each keeping its best; within a turn each side's encoding
   is the best of `--encode-passes` passes (default 5 on a GPU, where one pass takes a fifth of a
   second, and 1 on a CPU). Our encoding is measured with
   evaluation's attention (the default: unfused on a CPU, SDPA's kernel on a GPU) and with SDPA set
   directly ("sdpa").
2. Packing: `orchestrator launch` of a study of K replicate trials (K = 1, 2, 4, 8), each asking for
   1/K of the device (`resources.gpu`, or 1/K of the CPUs on a CPU) with K trials at a time: the
   aggregate train samples/s from the study's start to its end, and the device's mean utilization
   while it ran (NVML through torch; "n/a" on a CPU or without NVML). `--packing-mode processes`
   measures the same sharing without Ray (a machine that has torch but not Ray): K processes, each
   one `finetune` epoch, started together behind a barrier; the aggregate from the first start to the
   last end. `--packing none` skips packing.

It runs end to end on a CPU (`--device cpu`, the slow tests use a tiny model) so that it works the
day a GPU appears:

    python benchmarks/gpu.py --data-dir ../shared/data                      # CUDA, MiniLM and MPNet
    python benchmarks/gpu.py --data-dir ../shared/data --device cpu --models minilm --pairs 256 --packing 1,2

`--json PATH` writes every figure to PATH as well.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import yaml
from epoch import (  # the sides, as epoch.py times them
    our_encode,
    our_epoch,
    peer_encode,
    sentence_transformers_epoch,
    synchronize,
)
from utilization import Utilization

from orchestrator.cli.app import quiet_libraries
from trainables.data.tasks import load_task
from trainables.models.encoder import encoder_depth, load_config
from trainables.runtime import bf16_is_fast

MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}
MAX_LENGTH = 128


def packed(model_name: str, data_dir: str, pairs: int, batch: int, device: str, k: int, folder: Path) -> tuple:
    """(aggregate train pairs/s, mean utilization) of K one-epoch trials launched as one study, K at
    a time, each asking for 1/K of the device."""
    from orchestrator.run.launcher import launch

    cpus = os.cpu_count() or 1
    on_gpu = device.startswith("cuda")
    name = f"pack{k}"
    study = folder / f"{name}.yaml"
    study.write_text(yaml.safe_dump({
        "name": name, "trainable": "finetune", "task": "stsb", "model": model_name,
        "ablate": {"layer": [encoder_depth(load_config(model_name))]}, "replicate": {"seeds": list(range(k))},
        "train": {"epochs": 1, "batch_size": batch, "max_seq_length": MAX_LENGTH},  # device: from resources
        "data": {"max_train_samples": pairs, "max_eval_samples": 64}, "data_dir": data_dir,
        "resources": {"cpu": max(1.0, cpus // k) if on_gpu else cpus / k, "gpu": 1 / k if on_gpu else 0},
        "max_concurrent": k, "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}))
    with Utilization(device) as use:
        started = time.perf_counter()
        result = launch(study, storage=folder / "studies", progress=False)
        seconds = time.perf_counter() - started
    if result.counts.get("completed", 0) != k:
        raise RuntimeError(f"packing {k}: {result.counts}")
    return k * pairs / seconds, use.mean


def _one_trial(barrier, results, data_dir: str, model_name: str, device: str, batch: int, pairs: int) -> None:
    """One process of `packed_processes`: CUDA up, wait for the others, then one timed epoch."""
    torch.zeros(1, device=device)  # the device's context made before the clock starts, as a trial's would be
    barrier.wait()
    started = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process of the machine
    try:
        our_epoch(data_dir, "auto", model_name, device, batch, pairs, score=False)
        synchronize(device)
    except BaseException as error:  # the parent waits on the queue: it gets the error, not a half-hour wait
        results.put(f"{type(error).__name__}: {error}")
        raise
    results.put((started, time.perf_counter()))


def packed_processes(model_name: str, data_dir: str, pairs: int, batch: int, device: str, k: int) -> tuple:
    """(aggregate train pairs/s, mean utilization) of K one-epoch `finetune` trials in K processes at
    once on one device, from the first start to the last end (the packing of `packed`, without Ray)."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(k + 1), context.Queue()
    workers = [context.Process(target=_one_trial, args=(barrier, results, data_dir, model_name, device, batch, pairs))
               for _ in range(k)]
    for worker in workers:
        worker.start()
    barrier.wait(timeout=600)
    with Utilization(device) as use:
        spans = [results.get(timeout=1800) for _ in range(k)]
    failed = [span for span in spans if isinstance(span, str)]
    if failed:
        raise RuntimeError(f"packing {k}: a trial's process failed: {failed[0]}")
    for worker in workers:
        worker.join()
    if any(worker.exitcode for worker in workers):
        raise RuntimeError(f"packing {k}: exit codes {[worker.exitcode for worker in workers]}")
    return k * pairs / (max(end for _, end in spans) - min(start for start, _ in spans)), use.mean


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="minilm,mpnet", help="minilm, mpnet, or model folders, comma-separated")
    parser.add_argument("--batches", default="32,128")
    parser.add_argument("--pairs", type=int, default=5749, help="train pairs per epoch (STS-B train has 5,749)")
    parser.add_argument("--packing", default="1,2,4,8", help="trials per device, comma-separated, or none")
    parser.add_argument("--packing-mode", choices=("study", "processes"), default="study",
                        help="study: `orchestrator launch` through Ray; processes: K processes, no Ray")
    parser.add_argument("--score", action="store_true", help="each side's test Spearman after its epoch too")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    parser.add_argument("--before", action="store_true",
                        help="ours also with the CPU's two training levers off (torch's dropout masks, a dense "
                             "word-embedding gradient), once per batch size")
    parser.add_argument("--repeats", type=int, default=1, help="turns per side; each side keeps its best")
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                        help="the side-by-side epochs and encodings (--no-compare: only the packing)")
    parser.add_argument("--encode-passes", type=int, default=None,
                        help="passes over the test sentences per encoding, the best kept (default: 5 on a GPU, 1)")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                        help="one short untimed round of every side first (default: on a GPU)")
    args = parser.parse_args(argv)
    for option, value in (("--repeats", args.repeats), ("--encode-passes", args.encode_passes)):
        if value is not None and value < 1:
            parser.error(f"{option} {value}: give 1 or more")
    quiet_libraries()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu to check the benchmark runs")
    device = torch.device(args.device)
    if args.warmup is None:
        args.warmup = device.type == "cuda"
    passes = args.encode_passes or (5 if device.type == "cuda" else 1)
    fast_bf16 = bf16_is_fast(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device {name}; torch {torch.__version__}; bf16 fast: {fast_bf16}; {args.pairs} train pairs per epoch",
          flush=True)
    record: dict = {"device": name, "torch": torch.__version__, "bf16_fast": fast_bf16, "pairs": args.pairs,
                    "encode_passes": passes, "runs": [], "packing": []}
    data = load_task("stsb", data_folder=args.data_dir)
    train = data.train.head(args.pairs)
    sentences = list(data.test.sentence1) + list(data.test.sentence2)
    batches = [int(b) for b in args.batches.split(",")]
    for key in args.models.split(","):
        model = MODELS.get(key, key)
        if args.warmup and args.compare:  # CUDA's context, cuBLAS's handles and kernels loaded before any clock starts
            for p in ("auto", "fp32"):
                our_epoch(args.data_dir, p, model, args.device, batches[0], min(args.pairs, 256), score=False)
                our_encode(sentences[:512], p, model, args.device)
            for bf16 in (False, True)[:2 if fast_bf16 else 1]:
                sentence_transformers_epoch(train.head(256), data.test, bf16, model, args.device, batches[0],
                                            score=False)
                peer_encode(sentences[:512], bf16, model, args.device, batches[0])
        for batch in batches if args.compare else ():
            ours, enc_ours, theirs, enc_theirs, spearman = {}, {}, {}, {}, {}
            for turn in range(args.repeats):  # each side in turn, each keeping its best (load moves between turns)
                for p in ("auto", "fp32") if args.before and turn == 0 else ():  # dropout_masks: torch, dense
                    ours[f"{p} before"] = our_epoch(args.data_dir, p, model, args.device, batch, args.pairs,
                                                    score=False, levers=False)[0]
                for p in ("auto", "fp32"):
                    speed, after = our_epoch(args.data_dir, p, model, args.device, batch, args.pairs,
                                             score=args.score)
                    ours[p], spearman[f"ours {p}"] = max(ours.get(p, 0.0), speed), after
                peers = (("ST fp32", False), ("ST bf16", True))[:2 if fast_bf16 else 1]
                for name, bf16 in peers:
                    speed, _, after = sentence_transformers_epoch(train, data.test, bf16, model, args.device, batch,
                                                                  score=args.score)
                    theirs[name], spearman[name] = max(theirs.get(name, 0.0), speed), after
                # the encodings after the turn's epochs, in an order reversed every other turn, each after a
                # garbage collection: on the H100 the encoding right after a training epoch lost up to 42 % of
                # its speed (the H200 60 %), even between MPNet's two routes, which run the same code
                encodings = [(enc_ours, p, partial(our_encode, sentences, p, model, args.device, passes=passes))
                             for p in ("auto", "fp32")]
                encodings += [(enc_ours, f"{p} sdpa",  # SDPA set directly: on a CPU the kernel evaluation replaces
                               partial(our_encode, sentences, p, model, args.device, fused=True, passes=passes))
                              for p in ("auto", "fp32")]
                encodings += [(enc_theirs, name, partial(peer_encode, sentences, bf16, model, args.device, batch,
                                                         passes)) for name, bf16 in peers]
                for rows, key, measure in encodings[::-1] if turn % 2 else encodings:
                    settle(args.device)
                    rows[key] = max(rows.get(key, 0.0), measure())
            best, best_enc = max(theirs.values()), max(enc_theirs.values())
            label = f"{Path(model).name} batch {batch}"
            print(f"{label}: train pairs/s " + " · ".join(f"{n} {v:.1f}" for n, v in theirs.items())
                  + " · " + " · ".join(f"ours {p} {v:.1f}" for p, v in ours.items())
                  + f" · ours/best peer {max(ours['auto'], ours['fp32']) / best:.2f}x")  # as configured by default
            print(f"{label}: encode sentences/s " + " · ".join(f"{n} {v:.1f}" for n, v in enc_theirs.items())
                  + " · " + " · ".join(f"ours {p} {v:.1f}" for p, v in enc_ours.items())
                  + f" · ours/best peer {max(enc_ours['auto'], enc_ours['fp32']) / best_enc:.2f}x")
            if args.score:
                print(f"{label}: test Spearman after the epoch "
                      + " · ".join(f"{n} {v:.2f}" for n, v in sorted(spearman.items())), flush=True)
            record["runs"].append({"model": Path(model).name, "batch": batch, "train": {**theirs, **{
                f"ours {p}": v for p, v in ours.items()}}, "encode": {**enc_theirs, **{
                    f"ours {p}": v for p, v in enc_ours.items()}}, "test_spearman": spearman if args.score else None})
            write(args.json, record)
        sizes = [] if args.packing.strip().lower() in ("", "none") else [int(v) for v in args.packing.split(",")]
        with tempfile.TemporaryDirectory(prefix="gpu-pack-") as scratch:
            for k in sizes:
                if args.packing_mode == "processes":
                    rate, use = packed_processes(model, args.data_dir, args.pairs, batches[0], args.device, k)
                else:
                    rate, use = packed(model, args.data_dir, args.pairs, batches[0], args.device, k, Path(scratch))
                shown = f"{use:.0f} %" if use is not None else "n/a"
                how = {("processes", True): "process", ("processes", False): "processes",
                       ("study", True): "trial", ("study", False): "trials"}[args.packing_mode, k == 1]
                print(f"{Path(model).name} packing {k} {how} on one device "
                      f"(batch {batches[0]}): aggregate {rate:.1f} train pairs/s, device utilization {shown}",
                      flush=True)
                record["packing"].append({"model": Path(model).name, "mode": args.packing_mode, "k": k,
                                          "batch": batches[0], "pairs_per_s": rate, "utilization": use})
                write(args.json, record)


def settle(device: str) -> None:
    """Garbage from the last measurement collected and the device idle before the next clock starts."""
    gc.collect()
    synchronize(device)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def write(path: str | None, record: dict) -> None:
    """The figures so far, rewritten after each measurement (a run cut short keeps what it measured)."""
    if path:
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
