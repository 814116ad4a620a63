"""Evaluators: embed each distinct sentence once (length-sorted chunks), score pairs by cosine.

Each evaluator returns a dict of split-prefixed metrics (x100) and names its primary metric;
the scheduler's metric and mode come from there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from trainables.errors import one_of
from trainables.models.batching import TokenCache, encode_tokens
from trainables.models.packed import packed_linears
from trainables.names import SELECTS
from trainables.runtime import autocast

Embed = Callable[[Sequence[str]], torch.Tensor]


class Embedder:
    """Sentence vectors from a SentenceEncoder in inference mode; duplicates are encoded once."""

    def __init__(self, model: torch.nn.Module, tokens: TokenCache, device: torch.device,
                 dtype: torch.dtype = torch.float32, tokens_per_chunk: int | None = None):
        self.model, self.tokens, self.device, self.dtype = model, tokens, device, dtype
        self.tokens_per_chunk = tokens_per_chunk

    def __call__(self, sentences: Sequence[str]) -> torch.Tensor:
        distinct = list(dict.fromkeys(sentences))
        was_training = self.model.training
        self.model.eval()
        try:
            with (torch.inference_mode(), autocast(self.device, self.dtype),
                  packed_linears(self.model, self.device)):
                vectors = encode_tokens(self.model, self.tokens.lookup(distinct), self.tokens.pad_id,
                                        self.device, self.tokens_per_chunk, max_chunk=256, fewest_padded=True)
        finally:
            self.model.train(was_training)
        vectors = vectors.float().cpu()
        row = {s: i for i, s in enumerate(distinct)}
        return vectors[torch.as_tensor([row[s] for s in sentences], dtype=torch.long)]


def pair_cosines(embed: Embed, frame: pd.DataFrame) -> np.ndarray:
    """Cosine similarity of each (sentence1, sentence2) row, in float64 (both columns embedded in
    one pass). A collapsed encoder's cosines can all lie within 1e-5 of each other and still rank
    the pairs (MiniLM's CLS at layers 1-3); in float32 their ranks are partly rounding (layer 3 of
    MiniLM: 29.3 against 39.0 in float64), in float64 they are those of a float64 model."""
    n = len(frame)
    vectors = torch.nn.functional.normalize(embed(list(frame["sentence1"]) + list(frame["sentence2"])).double(),
                                            dim=-1)
    return (vectors[:n] * vectors[n:]).sum(dim=-1).numpy()


COLLAPSED = 1e-4  # cosines closer together than this: a collapsed encoder (scored, and flagged in the report)
RESOLUTION = 8 * float(np.finfo(np.float64).eps)  # a relative spread below this, float64 cannot resolve


def degenerate(scores: np.ndarray) -> bool:
    """Every pair scored the same (an exactly constant output, layer 0 with CLS pooling, or a spread
    below what float64 can resolve): there is no ranking, so no correlation."""
    if not len(scores):
        return False
    return bool(np.ptp(scores) <= RESOLUTION * max(1.0, float(np.max(np.abs(scores)))))


def spread_flag(split: str, cosines: np.ndarray) -> dict[str, float]:
    """`{split}_cosine_spread` when the split's cosines lie within COLLAPSED of each other: the
    score is real (it ranks the pairs) but comes from a collapsed encoder, and the report says so."""
    spread = float(np.ptp(cosines)) if len(cosines) else 0.0
    return {f"{split}_cosine_spread": spread} if len(cosines) and spread < COLLAPSED else {}


def sts_metrics(split: str, scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson x100 of `scores` (float64) against the gold scores; NaN for a degenerate split."""
    if degenerate(scores):
        return {f"{split}_spearman": float("nan"), f"{split}_pearson": float("nan")}
    from scipy.stats import pearsonr, spearmanr  # ~0.6 s: when scores exist

    return {f"{split}_spearman": 100 * float(spearmanr(scores, gold).statistic),
            f"{split}_pearson": 100 * float(pearsonr(scores, gold).statistic)}


class PairEvaluator(ABC):
    """Scores one split of a pair task; `primary_metric` and `greater_is_better` drive selection."""

    primary_metric: str
    greater_is_better: bool = True
    last_scores: dict[str, np.ndarray]  # the pair scores (cosines) of each split's latest evaluation

    @abstractmethod
    def evaluate(self, embed: Embed, split: str) -> dict[str, float]:
        """Metrics of `split`, keys prefixed with it (`dev_spearman`)."""

    def primary(self, split: str) -> str:
        return f"{split}_{self.primary_metric}"


class STSEvaluator(PairEvaluator):
    """Spearman and Pearson (x100) of cosine similarity against the gold scores."""

    primary_metric = "spearman"

    def __init__(self, splits: dict[str, pd.DataFrame]):
        self.splits, self.last_scores = splits, {}

    def evaluate(self, embed: Embed, split: str) -> dict[str, float]:
        frame = self.splits[split]
        cosines = self.last_scores[split] = pair_cosines(embed, frame)
        return {**sts_metrics(split, cosines, frame["score"].to_numpy(dtype=np.float64)),
                **spread_flag(split, cosines)}


def _cut_counts(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores sorted high to low and, for each cut i (the top i pairs predicted positive), the true
    positives and the true negatives."""
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], labels[order]
    true_pos = np.concatenate([[0], np.cumsum(sorted_labels)])
    true_neg = (1 - sorted_labels).sum() - np.concatenate([[0], np.cumsum(1 - sorted_labels)])
    return sorted_scores, true_pos, true_neg


def _threshold_at(sorted_scores: np.ndarray, cut: int) -> float:
    if cut == 0:
        return float(sorted_scores[0]) + 1e-6
    if cut == len(sorted_scores):
        return float(sorted_scores[-1])
    return float((sorted_scores[cut - 1] + sorted_scores[cut]) / 2)


def best_accuracy_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The cosine threshold (predict 1 at or above it) with the highest accuracy on these pairs."""
    sorted_scores, true_pos, true_neg = _cut_counts(scores, labels)
    return _threshold_at(sorted_scores, int(np.argmax(true_pos + true_neg)))


def best_f1_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The cosine threshold with the highest F1 of the positive class (SentEval's and the paper's
    MRPC selection): F1 = 2 TP / (predicted positives + actual positives)."""
    sorted_scores, true_pos, _ = _cut_counts(scores, labels)
    predicted = np.arange(len(sorted_scores) + 1)
    f1 = 2 * true_pos / np.maximum(1, predicted + labels.sum())
    return _threshold_at(sorted_scores, int(np.argmax(f1)))


class PairClassificationEvaluator(PairEvaluator):
    """Accuracy and F1 (x100) of thresholded cosine; the threshold is tuned on dev for the selected
    metric (`select: accuracy`, or `f1` as the paper does for MRPC) and reused on every other
    split, so test never influences it."""

    def __init__(self, splits: dict[str, pd.DataFrame], select: str = "accuracy"):
        if select not in SELECTS:
            raise one_of("select", select, SELECTS)
        self.splits, self.last_scores, self.primary_metric = splits, {}, select

    def evaluate(self, embed: Embed, split: str) -> dict[str, float]:
        dev = self.splits["dev"]
        dev_scores = self.last_scores["dev"] = pair_cosines(embed, dev)
        tune = best_f1_threshold if self.primary_metric == "f1" else best_accuracy_threshold
        threshold = tune(dev_scores, dev["label"].to_numpy())
        frame = self.splits[split]
        scores = self.last_scores[split] = dev_scores if split == "dev" else pair_cosines(embed, frame)
        labels = frame["label"].to_numpy()
        predicted = (scores >= threshold).astype(int)
        true_pos = int(((predicted == 1) & (labels == 1)).sum())
        precision = true_pos / max(1, int(predicted.sum()))
        recall = true_pos / max(1, int(labels.sum()))
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {f"{split}_accuracy": 100 * float((predicted == labels).mean()),
                f"{split}_f1": 100 * f1, f"{split}_threshold": threshold, **spread_flag(split, scores)}


def make_evaluator(kind: str, splits: dict[str, pd.DataFrame], select: str | None = None) -> PairEvaluator:
    """The evaluator for a task kind (`sts` or `classification`, selecting on `select`)."""
    return STSEvaluator(splits) if kind == "sts" else PairClassificationEvaluator(splits, select or "accuracy")
