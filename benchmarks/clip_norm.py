"""What reading only the word-embedding gradient's written rows saves the clipping: the same STS-B
batches, the same model and optimizer, the training step timed with the clipping's norm read on the
rows the step's lookups wrote (`rows`, trainables.runtime.total_norm) and on the whole table
(`table`, torch's `get_total_norm`), in one process.

The two take turns (rows, table on even turns; table, rows on odd ones), each turn timing `--steps`
steps after two warm-up steps; per side it prints the ms per step of every turn, the best and its
ratio to the table's, and the clipping's own ms per step (the norm and, when beyond 1.0, the multiply,
timed inside the same steps); then the largest relative difference between the two norms over the
steps of one pass (the norms of the same gradients, each read both ways).

    python benchmarks/clip_norm.py --data-dir ../shared/data [--model mpnet] [--steps 30] [--turns 4]
"""

from __future__ import annotations

import time

import torch
from profile_step import stsb_steps, turns_model, turns_parser  # benchmarks/, the script's own folder

import trainables.runtime as runtime
from trainables.training.bi_encoder import train_step

SIDES = ("rows", "table")


def main() -> None:
    parser = turns_parser(__doc__, 4)
    args = parser.parse_args()
    setup = turns_model(parser, args)
    name, device, dtype, model = setup.name, setup.device, setup.dtype, setup.model
    run = stsb_steps(name, args.data_dir, model, args.steps)
    ours, torchs, runtime_clip = runtime.total_norm, torch.nn.utils.get_total_norm, runtime.clip_gradients
    side = {"now": "rows"}
    clipping = {"seconds": 0.0}
    differences: list[float] = []

    def timed_clip(parameters, max_norm):
        started = time.perf_counter()
        total = runtime_clip(parameters, max_norm)
        clipping["seconds"] += time.perf_counter() - started
        return total

    def both_norms(grads):
        mine, theirs = ours(grads), torchs(grads)
        differences.append(abs(float(mine) - float(theirs)) / float(theirs))
        return theirs

    norm_of = {"rows": ours, "table": torchs, "both": both_norms}
    print(f"torch {torch.__version__}, {args.threads} threads, precision auto -> {str(dtype).split('.')[-1]}; "
          f"{name.split('/')[-1]}, STS-B train batches of 32 pairs, clipping at 1.0")
    runtime.clip_gradients = timed_clip  # the step's clipping (runtime.optimizer_step calls it), timed

    def step(rows):
        token_lists, y = run.batch(rows)
        runtime.total_norm = norm_of[side["now"]]
        train_step(model, run.loss_fn, run.optimizer, run.scheduler, token_lists, y, run.tokens.pad_id, device,
                   dtype, 1.0)

    times: dict[str, list[float]] = {s: [] for s in SIDES}
    clip_ms: dict[str, list[float]] = {s: [] for s in SIDES}
    try:
        for rows in run.batches[:2]:  # warm-up: allocator, oneDNN kernels
            step(rows)
        for turn in range(args.turns):
            for now in SIDES if turn % 2 == 0 else SIDES[::-1]:
                side["now"], clipping["seconds"] = now, 0.0
                started = time.perf_counter()
                for rows in run.batches[2:]:
                    step(rows)
                times[now].append(1000 * (time.perf_counter() - started) / len(run.batches[2:]))
                clip_ms[now].append(1000 * clipping["seconds"] / len(run.batches[2:]))
        side["now"] = "both"
        for rows in run.batches[2:]:
            step(rows)
    finally:
        runtime.total_norm, runtime.clip_gradients = ours, runtime_clip
    for now in SIDES:
        print(f"{now:>6}: " + " ".join(f"{t:.1f}" for t in times[now])
              + f" ms/step, best {min(times[now]):.1f} ({min(times['table']) / min(times[now]):.3f}x the table's); "
              f"clipping {min(clip_ms[now]):.2f} ms/step at best")
    print(f"the two norms of the same gradients ({len(differences)} steps) differ by at most "
          f"{max(differences):.1e} of the norm")


if __name__ == "__main__":
    main()
