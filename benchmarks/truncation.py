"""Training-step time of our truncated `finetune` path against the reference paper's implementation.

The paper's way: the full model with output_hidden_states=True, hidden_states[k] mean-pooled,
fp32, each side of the batch padded to its longest sentence (as sentence-transformers does).
Ours: the encoder cut to k layers, length-sorted chunks, precision `auto` (bf16 where the
hardware runs it fast) and also fp32. Same STS-B train batches (32 pairs), paired runs in one
process, alternating which path goes first. Prints ms/step and ratios.

    python benchmarks/truncation.py --data-dir ../shared/data [--steps 20] [--layers 1,2,3,6]
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import get_linear_schedule_with_warmup

from trainables.data.tasks import load_task
from trainables.kinds.finetune import FinetuneConfig
from trainables.models.batching import TokenCache, pad
from trainables.models.encoder import SentenceEncoder, load_encoder, load_tokenizer, pool, truncate_encoder
from trainables.objectives.sts import CosineMSELoss
from trainables.runtime import bf16_is_fast, resolve_precision
from trainables.training.bi_encoder import build_optimizer, train_step

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def paper_step(model, optimizer, layer: int, first, second, targets) -> None:
    """Full model, all hidden states, take hidden_states[layer], mean pooling, cosine MSE."""
    vectors = []
    for token_lists in (first, second):
        ids, mask = pad(token_lists, 0, torch.device("cpu"))
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[layer]
        vectors.append(pool(hidden, mask, "mean"))
    loss = F.mse_loss(F.cosine_similarity(*vectors), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", default="1,2,3,4,5,6")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    auto = resolve_precision("auto", device)
    data = load_task("stsb", data_folder=args.data_dir)
    tokens = TokenCache(load_tokenizer(MODEL), FinetuneConfig(model=MODEL).max_seq_length)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randperm(len(data.train), generator=generator)[:32].tolist() for _ in range(args.steps + 2)]
    first = [tokens.lookup([data.train.sentence1[i] for i in b]) for b in batches]
    second = [tokens.lookup([data.train.sentence2[i] for i in b]) for b in batches]
    targets = [torch.tensor(data.train.score.to_numpy()[b], dtype=torch.float32) for b in batches]
    real = sum(len(x) for b in first + second for x in b)
    padded = sum(len(b) * max(len(x) for x in b) for b in first + second)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bf16 fast here: {bf16_is_fast(device)}, "
          f"precision auto -> {str(auto).replace('torch.', '')}; {args.steps} steps of 32 pairs; "
          f"padding is {100 * (1 - real / padded):.0f}% of the paper's tokens")

    base = load_encoder(MODEL)
    paths = ["sliced", "ours_fp32"] + (["ours_auto"] if auto != torch.float32 else [])
    header = f"{'k':>2} {'paper ms':>9} " + " ".join(f"{p + ' ms':>13} {'ratio':>6}" for p in paths)
    print("sliced = the paper's step on a model cut to k layers (surgery alone); ours = surgery, length-sorted "
          "chunks, fused AdamW")
    print(header)
    for layer in [int(x) for x in args.layers.split(",")]:
        paper_model = copy.deepcopy(base).train()
        paper_opt = torch.optim.AdamW(paper_model.parameters(), lr=2e-5)
        sliced_model = truncate_encoder(copy.deepcopy(base), layer).train()
        sliced_opt = torch.optim.AdamW(sliced_model.parameters(), lr=2e-5)
        ours = {}
        for name in paths[1:]:
            model = SentenceEncoder(truncate_encoder(copy.deepcopy(base), layer), "mean").train()
            opt = build_optimizer(list(model.named_parameters()), lr=2e-5, weight_decay=0.01)
            ours[name] = (model, opt, get_linear_schedule_with_warmup(opt, 0, 10_000),
                          torch.float32 if name == "ours_fp32" else auto)
        times = {name: [] for name in ["paper", *paths]}
        for step in range(args.steps + 2):  # the first two steps warm up and are not counted
            batch = (first[step], second[step], targets[step])
            runs = [("paper", functools.partial(paper_step, paper_model, paper_opt, layer, *batch)),
                    ("sliced", functools.partial(paper_step, sliced_model, sliced_opt, layer, *batch))]
            for name, (model, opt, sched, dtype) in ours.items():
                runs.append((name, functools.partial(train_step, model, CosineMSELoss(), opt, sched,
                                                     first[step] + second[step], targets[step], 0, device, dtype,
                                                     None)))
            if step % 2:
                runs.reverse()
            for name, fn in runs:
                elapsed = timed(fn)
                if step >= 2:
                    times[name].append(elapsed)
        paper_ms = statistics.median(times["paper"])
        row = f"{layer:>2} {paper_ms:>9.1f} "
        row += " ".join(f"{statistics.median(times[p]):>13.1f} {paper_ms / statistics.median(times[p]):>5.2f}x"
                        for p in paths)
        print(row, flush=True)


if __name__ == "__main__":
    main()
