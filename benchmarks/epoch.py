"""One STS-B training epoch and one test-set encoding: our `finetune` against sentence-transformers.

Both train all-MiniLM-L6-v2 (k=6, the full model) for one epoch on STS-B train with batch 32,
lr 2e-5, 10 % warmup and MSE on cosine (sentence-transformers' CosineSimilarityLoss is our
cosine_mse), then score STS-B test. Evaluation throughput: the test sentences encoded by
`SentenceTransformer.encode` (batch 32) against our evaluator's embedder. Prints samples/s,
sentences/s, ratios and test Spearman side by side.

    python benchmarks/epoch.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from trainables.batching import TokenCache
from trainables.contract import collect
from trainables.data import load_task
from trainables.evaluation import Embedder
from trainables.kinds import get_kind
from trainables.models import build_sentence_encoder, load_tokenizer, resolve_model_path
from trainables.runtime import resolve_precision

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LR, BATCH, WARMUP = 2e-5, 32, 0.1


def sentence_transformers_epoch(train, test) -> tuple[float, float, float]:
    """(samples/s, test Spearman before, after) of SentenceTransformerTrainer."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    from sentence_transformers.losses import CosineSimilarityLoss

    model = SentenceTransformer(resolve_model_path(MODEL), device="cpu")
    model.max_seq_length = 128
    evaluator = EmbeddingSimilarityEvaluator(list(test.sentence1), list(test.sentence2), list(test.score))
    before = 100 * evaluator(model)["spearman_cosine"]
    with tempfile.TemporaryDirectory() as out:
        args = SentenceTransformerTrainingArguments(
            output_dir=out, num_train_epochs=1, per_device_train_batch_size=BATCH, learning_rate=LR,
            warmup_ratio=WARMUP, save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
            use_cpu=True, logging_strategy="no")
        pairs = Dataset.from_pandas(train[["sentence1", "sentence2", "score"]])
        trainer = SentenceTransformerTrainer(model=model, args=args, loss=CosineSimilarityLoss(model),
                                             train_dataset=pairs)
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    return len(train) / seconds, before, 100 * evaluator(model)["spearman_cosine"]


def encode_throughput(test, precision: str) -> tuple[float, float]:
    """Sentences/s of sentence-transformers' encode and of our embedder on the test sentences."""
    from sentence_transformers import SentenceTransformer

    sentences = list(test.sentence1) + list(test.sentence2)
    model = SentenceTransformer(resolve_model_path(MODEL), device="cpu")
    model.max_seq_length = 128
    model.encode(sentences[:64], batch_size=32)
    started = time.perf_counter()
    model.encode(sentences, batch_size=32)
    theirs = len(sentences) / (time.perf_counter() - started)

    device = torch.device("cpu")
    embed = Embedder(build_sentence_encoder(MODEL).eval(), TokenCache(load_tokenizer(MODEL), 128), device,
                     resolve_precision(precision, device))
    embed(sentences[:64])
    embed.tokens = TokenCache(load_tokenizer(MODEL), 128)  # tokenization is part of the measured time
    started = time.perf_counter()
    embed(sentences)
    ours = len(sentences) / (time.perf_counter() - started)
    return theirs, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--precision", default="auto")
    args = parser.parse_args()
    data = load_task("stsb", data_folder=args.data_dir)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, precision {args.precision} -> "
          f"{str(resolve_precision(args.precision, torch.device('cpu'))).replace('torch.', '')}")

    their_speed, before, their_test = sentence_transformers_epoch(data.train, data.test)
    final = get_kind("finetune").run({
        "model": MODEL, "task": "stsb", "layer": 6, "epochs": 1, "lr": LR, "batch_size": BATCH, "warmup_ratio": WARMUP,
        "loss": "cosine_mse", "precision": args.precision, "data_dir": args.data_dir, "device": "cpu"}, collect([]))
    our_speed = final["train_samples_per_second"]
    their_enc, our_enc = encode_throughput(data.test, args.precision)
    print(f"{'':34} {'sentence-transformers':>22} {'ours':>10} {'ratio':>7}")
    print(f"{'train samples/s (1 epoch, k=6)':34} {their_speed:>22.1f} {our_speed:>10.1f} "
          f"{our_speed / their_speed:>6.2f}x")
    print(f"{'test Spearman after 1 epoch':34} {their_test:>22.2f} {final['test_spearman']:>10.2f} "
          f"{final['test_spearman'] - their_test:>+7.2f}")
    print(f"{'test Spearman before training':34} {before:>22.2f}")
    print(f"{'encode test sentences/s':34} {their_enc:>22.1f} {our_enc:>10.1f} {our_enc / their_enc:>6.2f}x")


if __name__ == "__main__":
    main()
