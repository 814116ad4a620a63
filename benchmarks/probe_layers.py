"""The zero-shot layer profile against one encoding: `probe` scores every layer of all-mpnet-base-v2
(embeddings and 12 blocks, 13 layers) on STS-B test, against sentence-transformers encoding the same
sentences with the full model once and scoring its one layer.

Both sides are timed from the same start (the test pairs in memory, no model loaded, nothing
tokenized) to the same end (Spearman computed): ours is `trainables.evaluation.probe.probe_layers`
as the `probe` kind and `orchestrator probe` run it (one forward pass per chunk returns every hidden
state; each layer mean-pooled and scored); the peer loads `SentenceTransformer`, encodes the distinct
test sentences (batch 32; deduplicated, as ours are, which only helps it) and computes the cosine
Spearman. In fp32 (the probe's default) and, where bf16 is fast, in bf16 (a bf16 peer model; ours
`precision: bf16`). The peer's Spearman and our last layer's are printed side by side.

    python benchmarks/probe_layers.py --data-dir ../shared/data [--model minilm]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from trainables.data.tasks import load_task
from trainables.kinds import get_kind
from trainables.models.batching import forget_shared_tokens
from trainables.models.encoder import resolve_model_path
from trainables.runtime import bf16_is_fast

MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}


def peer_once(test, model_name: str, bf16: bool) -> tuple[float, float]:
    """(seconds, test Spearman x100) of sentence-transformers encoding the test sentences once."""
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    model = SentenceTransformer(resolve_model_path(model_name), device="cpu")
    if bf16:
        model = model.to(torch.bfloat16)
    model.max_seq_length = 128
    distinct = list(dict.fromkeys(list(test.sentence1) + list(test.sentence2)))
    vectors = model.encode(distinct, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    row = {s: i for i, s in enumerate(distinct)}
    first = vectors[[row[s] for s in test.sentence1]].astype(np.float64)
    second = vectors[[row[s] for s in test.sentence2]].astype(np.float64)
    spearman = 100 * float(spearmanr((first * second).sum(axis=1), test.score).statistic)
    return time.perf_counter() - started, spearman


def our_profile(data_dir: str | None, model_name: str, precision: str) -> tuple[float, list[dict]]:
    """(seconds, one row per layer) of the probe on STS-B test, every layer."""
    from trainables.evaluation.probe import probe_layers

    cfg = get_kind("probe").parse({"model": model_name, "task": "stsb", "splits": ["test"], "precision": precision,
                                   "data_dir": data_dir, "device": "cpu"})
    forget_shared_tokens()  # nothing tokenized at the start, as for the peer
    started = time.perf_counter()
    rows = probe_layers(cfg)
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default="mpnet", help="mpnet, minilm or a model folder")
    args = parser.parse_args()
    model_name = MODELS.get(args.model, args.model)
    test = load_task("stsb", data_folder=args.data_dir).test
    precisions = ["fp32", "bf16"] if bf16_is_fast(torch.device("cpu")) else ["fp32"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {model_name.split('/')[-1]} on STS-B test "
          f"({len(test)} pairs); timed from the same start (pairs in memory, no model, nothing tokenized) to the "
          "same end (Spearman computed)")
    peer = {p: peer_once(test, model_name, p == "bf16") for p in precisions}
    ours = {p: our_profile(args.data_dir, model_name, p) for p in precisions}
    best_peer = min(seconds for seconds, _ in peer.values())
    for p in precisions:
        seconds, rows = ours[p]
        last = rows[-1]
        print(f"{p}: sentence-transformers, the full model once: {peer[p][0]:.1f} s (test Spearman {peer[p][1]:.2f}); "
              f"ours, all {len(rows)} layers: {seconds:.1f} s (layer {last['layer']}: {last['test_spearman']:.2f}; "
              f"best layer {max(rows, key=lambda r: r['test_spearman'])['layer']}); the {len(rows)}-layer profile "
              f"takes {seconds / peer[p][0]:.2f}x the peer's one encoding in {p}, {seconds / best_peer:.2f}x its best")


if __name__ == "__main__":
    main()
