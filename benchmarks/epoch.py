"""One STS-B training epoch and one test-set encoding: our `finetune` against sentence-transformers.

Both train all-MiniLM-L6-v2 (k=6, the full model) for one epoch on STS-B train with batch 32,
lr 2e-5, 10 % warmup and MSE on cosine (sentence-transformers' CosineSimilarityLoss is our
cosine_mse), then score STS-B test. Like for like: each side is timed from the same start (the
data in memory, no model loaded, nothing tokenized) to the same end (the epoch done), so model
loading, tokenization and batching count on both sides. The peer runs at its default fp32 and,
where bf16 is fast on this machine (AMX / AVX512-BF16 CPUs, CUDA), also with `bf16=True`.
Evaluation throughput: the test sentences encoded by `SentenceTransformer.encode` (batch 32) against
our evaluator's embedder, tokenization included on both sides, in fp32 (what a trial scores in by
default, `eval_precision: fp32`) and, where bf16 is fast, in bf16 (a bf16 peer model; ours under bf16
autocast, what `eval_precision: same` scores in).
Prints samples/s, sentences/s, ratios and test Spearman side by side; "ours before" is our epoch
with the step's two levers off (torch's dropout masks, torch's dense word-embedding gradient), and
our encoding with SDPA's fused attention kernel, in the same run, so the levers' gain is measured
from the same start to the same end as the rest.

    python benchmarks/epoch.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from trainables.data.tasks import load_task
from trainables.evaluation.evaluators import Embedder
from trainables.kinds import get_kind
from trainables.models.batching import TokenCache, forget_shared_tokens
from trainables.models.encoder import (
    build_sentence_encoder,
    encoder_depth,
    load_config,
    load_tokenizer,
    resolve_model_path,
)
from trainables.runtime import bf16_is_fast, resolve_precision

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LR, BATCH, WARMUP = 2e-5, 32, 0.1


def synchronize(device: str) -> None:
    """The device's queued work done, so that a clock stopped now measures it (a no-op on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def warmup_argument(ratio: float) -> dict[str, float]:
    """The warmup as a fraction of the steps, as this transformers takes it: `warmup_steps` below 1 from
    transformers 5 (whose `warmup_ratio` warns that it is going), `warmup_ratio` before (the same
    ceil(steps x ratio) steps)."""
    import transformers

    return {"warmup_steps" if int(transformers.__version__.split(".")[0]) >= 5 else "warmup_ratio": ratio}


def sentence_transformers_epoch(train, test, bf16: bool = False, model_name: str = MODEL, device: str = "cpu",
                                batch: int = BATCH, score: bool = True) -> tuple[float, float | None, float | None]:
    """(samples/s from model load to the epoch's end, test Spearman before, after; None without
    `score`) of SentenceTransformerTrainer."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    try:  # sentence-transformers 6.2 moved them (the old paths warn)
        from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
        from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    except ImportError:  # before 6.2
        from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
        from sentence_transformers.losses import CosineSimilarityLoss

    evaluator = EmbeddingSimilarityEvaluator(list(test.sentence1), list(test.sentence2), list(test.score))
    before = (100 * evaluator(SentenceTransformer(resolve_model_path(model_name), device=device))["spearman_cosine"]
              if score else None)
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()  # the data in memory, no model loaded, nothing tokenized
        model = SentenceTransformer(resolve_model_path(model_name), device=device)
        model.max_seq_length = 128
        args = SentenceTransformerTrainingArguments(
            output_dir=out, num_train_epochs=1, per_device_train_batch_size=batch, learning_rate=LR,
            save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
            use_cpu=device == "cpu", logging_strategy="no", bf16=bf16, **warmup_argument(WARMUP))
        pairs = Dataset.from_pandas(train[["sentence1", "sentence2", "score"]])
        trainer = SentenceTransformerTrainer(model=model, args=args, loss=CosineSimilarityLoss(model),
                                             train_dataset=pairs)
        trainer.train()
        synchronize(device)
        seconds = time.perf_counter() - started
    return len(train) / seconds, before, 100 * evaluator(model)["spearman_cosine"] if score else None


def our_epoch(data_dir: str | None, precision: str, model_name: str = MODEL, device: str = "cpu",
              batch: int = BATCH, pairs: int | None = None, score: bool = True,
              levers: bool = True) -> tuple[float, float | None]:
    """(samples/s from model load to the epoch's end, test Spearman; None without `score`) of the
    `finetune` kind at the model's full depth, on the first `pairs` train pairs (all by default).
    `levers=False`: the step as it was before its two levers (torch's dropout masks and its dense
    word-embedding gradient)."""
    from trainables.runtime import prepare
    from trainables.training.loop import seed_round

    kind = get_kind("finetune")
    cfg = kind.parse({"model": model_name, "task": "stsb", "layer": encoder_depth(load_config(model_name)),
                      "epochs": 1, "lr": LR, "batch_size": batch, "warmup_ratio": WARMUP, "loss": "cosine_mse",
                      "precision": precision, "data_dir": data_dir, "device": device, "max_train_samples": pairs,
                      "dropout_masks": "fast" if levers else "torch"})
    resolved, dtype = prepare(cfg.device, cfg.precision, cfg.num_threads)
    seed_round(0, 0)
    forget_shared_tokens()  # a worker's token ids from earlier trials would skip the tokenization timed here
    started = time.perf_counter()  # the same start: no model loaded, nothing tokenized
    learner = kind.build(cfg, resolved, dtype)  # loads the model and tokenizes the train sentences
    if not levers:
        encoder = learner.model.encoder
        encoder.set_input_embeddings(encoder.get_input_embeddings().dense())
    seed_round(0, 1)
    learner.train_round(1)
    synchronize(device)
    seconds = time.perf_counter() - started
    return len(learner.lengths) / seconds, learner.evaluate("test")[0]["test_spearman"] if score else None


def peer_encode(sentences: list[str], bf16: bool = False, model_name: str = MODEL, device: str = "cpu",
                batch: int = 32, passes: int = 1) -> float:
    """Sentences/s of sentence-transformers' encode (a bf16 model with `bf16`), tokenization included;
    the best of `passes` passes over all the sentences (one pass is a fifth of a second on a GPU)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_model_path(model_name), device=device)
    if bf16:
        model = model.to(torch.bfloat16)
    model.max_seq_length = 128
    model.encode(sentences[:64], batch_size=batch)
    return best_rate(len(sentences), lambda: model.encode(sentences, batch_size=batch), device, passes)


def our_encode(sentences: list[str], precision: str, model_name: str = MODEL, device: str = "cpu",
               fused: bool = False, passes: int = 1) -> float:
    """Sentences/s of our evaluator's embedder (the model as a `finetune` trial builds it), tokenization
    included; `fused`: with SDPA's fused attention kernel instead of evaluation's unfused one; the best
    of `passes` passes, each tokenizing afresh."""
    resolved = torch.device(device)
    model = build_sentence_encoder(model_name, dropout_masks="fast").to(resolved).eval()
    if fused:
        model.encoder.set_attn_implementation("sdpa")
    embed = Embedder(model, TokenCache(load_tokenizer(model_name), 128), resolved,
                     resolve_precision(precision, resolved))
    embed(sentences[:64])

    def untokenized() -> None:  # tokenization is part of the measured time
        forget_shared_tokens()
        embed.tokens = TokenCache(load_tokenizer(model_name), 128)

    return best_rate(len(sentences), lambda: embed(sentences), device, passes, before=untokenized)


def best_rate(count: int, run, device: str, passes: int, before=lambda: None) -> float:
    """count / seconds of the fastest of `passes` calls of `run`, each after `before` (untimed), the device
    synchronized before the clock starts and before it stops."""
    best = 0.0
    for _ in range(passes):
        before()
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        best = max(best, count / (time.perf_counter() - started))
    return best


def encode_rows(test, precisions: list[str], repeats: int = 2) -> dict[str, dict[str, float]]:
    """Sentences/s of the test sentences per precision: sentence-transformers' encode (a bf16 model for
    bf16), ours with SDPA's fused attention ("before"), ours as a trial scores; the three sides take
    turns, `repeats` times, and each keeps its best (on a shared machine, load moves between turns)."""
    sentences = list(test.sentence1) + list(test.sentence2)
    sides = {"peer": lambda p: peer_encode(sentences, p == "bf16"),
             "before": lambda p: our_encode(sentences, p, fused=True), "ours": lambda p: our_encode(sentences, p)}
    rows: dict[str, dict[str, float]] = {p: {} for p in precisions}
    for _ in range(repeats):
        for precision in precisions:
            for side, measure in sides.items():
                rows[precision][side] = max(rows[precision].get(side, 0.0), measure(precision))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--encode-only", action="store_true",
                        help="only the encoding rows (no training epochs: minutes instead of a quarter hour)")
    args = parser.parse_args()
    data = load_task("stsb", data_folder=args.data_dir)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, precision {args.precision} -> "
          f"{str(resolve_precision(args.precision, torch.device('cpu'))).replace('torch.', '')}")

    fast_bf16 = bf16_is_fast(torch.device("cpu"))
    if args.encode_only:
        print(f"{'':34} {'ST fp32':>10}" + (f" {'ST bf16':>10}" if fast_bf16 else "")
              + f" {'ours before':>11} {'ours':>10} {'ratio vs best':>14}")
        print_encoding(encode_rows(data.test, ["fp32", "bf16"] if fast_bf16 else ["fp32"]),
                       ["ST fp32", "ST bf16"] if fast_bf16 else ["ST fp32"])
        return
    peers = {"ST fp32": sentence_transformers_epoch(data.train, data.test)}
    if fast_bf16:
        peers["ST bf16"] = sentence_transformers_epoch(data.train, data.test, bf16=True)
    before = our_epoch(args.data_dir, args.precision, levers=False)
    our_speed, our_test = our_epoch(args.data_dir, args.precision)
    encode = encode_rows(data.test, ["fp32", "bf16"] if fast_bf16 else ["fp32"])
    print("timed from the same start (data in memory, no model, nothing tokenized) to the same end; "
          + ("ST bf16 also measured" if fast_bf16 else "no fast bf16 on this CPU: ST bf16 not measured"))
    print(f"{'':34} " + " ".join(f"{name:>10}" for name in peers) + f" {'ours before':>11} {'ours':>10} "
          f"{'ratio vs best':>14}")
    best_train = max(p[0] for p in peers.values())
    print(f"{'train samples/s (1 epoch, k=6)':34} " + " ".join(f"{p[0]:>10.1f}" for p in peers.values())
          + f" {before[0]:>11.1f} {our_speed:>10.1f} {our_speed / best_train:>13.2f}x")
    print(f"{'test Spearman after 1 epoch':34} " + " ".join(f"{p[2]:>10.2f}" for p in peers.values())
          + f" {before[1]:>11.2f} {our_test:>10.2f}")
    print(f"{'test Spearman before training':34} {peers['ST fp32'][1]:>10.2f}")
    print_encoding(encode, list(peers))
    print("training, ours before with torch's dropout masks and dense word-embedding gradient (dropout_masks: "
          "torch, no row-wise gradient)")


def print_encoding(encode: dict[str, dict[str, float]], peers: list[str]) -> None:
    """The encoding rows under the peers' columns: each precision's peer, ours before, ours, ratios."""
    best_enc = max(row["peer"] for row in encode.values())
    for precision, row in encode.items():
        label = f"encode sentences/s, {precision}"
        cells = [f"{row['peer']:>10.1f}" if name == f"ST {precision}" else f"{'':>10}" for name in peers]
        print(f"{label:34} " + " ".join(cells) + f" {row['before']:>11.1f} {row['ours']:>10.1f} "
              f"{row['ours'] / best_enc:>13.2f}x  ({row['ours'] / row['peer']:.2f}x ST {precision}, "
              f"{row['ours'] / row['before']:.2f}x before)")
    print("encoding, ours before: SDPA's fused attention kernel; ours: evaluation's unfused attention (the "
          "default); each side the best of two turns. Dev and test are scored in fp32 (eval_precision: fp32, the "
          "default), so a trial's dev and test encodings run at the fp32 row's speed; the bf16 row is "
          "eval_precision: same")


if __name__ == "__main__":
    main()
