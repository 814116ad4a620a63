"""Cross-encoder building blocks: both sentences in one input to a (truncated) encoder (the second
as segment B where the encoder embeds segments) with a regression head (the model's pretrained
pooler and a new classifier, as sentence-transformers, or a new linear layer); the score of a pair
is the sigmoid of the head's logit. Trained with BCE on scores in [0, 1] (targets are clipped there: a
cosine below 0 is no probability) or MSE of the sigmoid. Used by the `cross_encoder` kind, by
`distill` and by the teacher stage."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from trainables.errors import UserInputError, one_of
from trainables.evaluation.evaluators import sts_metrics
from trainables.models.batching import chunk_cost, chunk_tokens, pad, padding_chunks
from trainables.models.encoder import (
    last_hidden_state,
    load_encoder,
    load_tokenizer,
    pair_separator,
    prepare_for_training,
    resolve_model_path,
    segment_ids,
    truncate_encoder,
)
from trainables.models.packed import packed_linears
from trainables.names import CROSS_HEADS, CROSS_LOSSES  # noqa: F401 (re-exported)
from trainables.poolings import POOLINGS, build_pooling
from trainables.runtime import autocast, linear_schedule, optimizer_step
from trainables.training.bi_encoder import build_optimizer, check_finite, epoch_batches


class CrossEncoder(nn.Module):
    """A (truncated) encoder over the joined pair and a head to one logit. `head: pretrained` is the
    model's own sequence-classification head, as sentence-transformers' CrossEncoder (and so the
    Trans-Encoder reference) builds it: for BERT-family models the pretrained pooler (dense + tanh on
    the first token), dropout and a new linear classifier; `pooling` is then the model's (cls).
    `head: linear` is a new linear layer on the pooled last hidden state (no pooler, no dropout)."""

    def __init__(self, name: str, layer: int | None = None, pooling: str = "cls", dropout_masks: str = "torch",
                 head: str = "pretrained"):
        super().__init__()
        POOLINGS.entry(pooling, "pooling")  # an unknown name is one line before the encoder loads
        if head not in CROSS_HEADS:
            raise one_of("head", head, CROSS_HEADS)
        if head == "pretrained" and pooling != "cls":
            raise UserInputError("pooling", pooling, "head: pretrained reads the first token through the model's "
                                                     "pooler: use pooling: cls, or head: linear")
        self.pooling, self.head_kind = pooling, head
        if head == "pretrained":
            self.classifier = load_sequence_classifier(name, dropout_masks)
            if layer is not None:
                truncate_encoder(self.classifier.base_model, layer, keep_pooler=True)
        else:
            self.encoder = load_encoder(name, dropout_masks=dropout_masks)
            if layer is not None:
                truncate_encoder(self.encoder, layer)
            self.pool_layer = build_pooling(pooling, self.encoder.config.hidden_size)
            self.head = nn.Linear(self.encoder.config.hidden_size, 1)
        # the second sentence is segment B, as in pretraining (BERT's next-sentence pairs)
        self.separator = pair_separator(load_tokenizer(name), self.backbone().config)

    def unread_modules(self) -> list[nn.Module]:
        """Under `head: linear`, the encoder's pooler when it kept one (`layer: null`): the head reads
        the pooled last hidden state."""
        pooler = getattr(self.encoder, "pooler", None) if self.head_kind == "linear" else None
        return [pooler] if isinstance(pooler, nn.Module) else []

    def backbone(self) -> nn.Module:
        """The (truncated) transformer: the classifier's base model under `head: pretrained`."""
        return self.classifier.base_model if self.head_kind == "pretrained" else self.encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        segments = None if self.separator is None else segment_ids(input_ids, attention_mask, self.separator)
        if self.head_kind == "pretrained":
            return self.classifier(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=segments).logits.squeeze(-1)
        hidden = last_hidden_state(self.encoder, input_ids, attention_mask, segments)
        return self.head(self.pool_layer(hidden, attention_mask)).squeeze(-1)


def load_sequence_classifier(name: str, dropout_masks: str = "torch"):
    """`AutoModelForSequenceClassification` with one label (regression), as sentence-transformers'
    CrossEncoder loads it: the pretrained encoder and pooler, a new classifier."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as transformers_logging

    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the new classifier's "newly initialized" notice is expected
    try:
        model = AutoModelForSequenceClassification.from_pretrained(resolve_model_path(name), num_labels=1,
                                                                   trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise UserInputError("model", name, f"no sequence-classification head for it ({exc}); use head: linear") \
            from None
    finally:
        transformers_logging.set_verbosity(level)
    return prepare_for_training(model, dropout_masks)


class PairTokens:
    """Token ids of each distinct (sentence1, sentence2) pair, joined with the tokenizer's
    separators, truncated to the longest-first `max_length`; tokenized once."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self._ids: dict[tuple[str, str], list[int]] = {}

    def lookup(self, first: Sequence[str], second: Sequence[str]) -> list[list[int]]:
        pairs = list(zip(first, second, strict=True))
        new = list(dict.fromkeys(p for p in pairs if p not in self._ids))
        if new:
            encoded = self.tokenizer([a for a, _ in new], [b for _, b in new], truncation="longest_first",
                                     max_length=self.max_length)["input_ids"]
            self._ids.update(zip(new, encoded, strict=True))
        return [self._ids[p] for p in pairs]

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


def predict(model: CrossEncoder, token_lists: list[list[int]], pad_id: int, device, dtype) -> np.ndarray:
    """Sigmoid scores of every pair, in length-sorted chunks (the evaluator's: fewest padded, packed
    linear layers on a CPU), in input order."""
    was_training = model.training
    model.eval()
    scores = np.empty(len(token_lists), dtype=np.float64)
    try:
        with torch.inference_mode(), autocast(device, dtype), packed_linears(model, torch.device(device)):
            for chunk in padding_chunks([len(t) for t in token_lists], chunk_tokens(device, evaluation=True),
                                        max_chunk=256, chunk_cost=chunk_cost(device)):
                input_ids, mask = pad([token_lists[i] for i in chunk], pad_id, device)
                scores[chunk] = torch.sigmoid(model(input_ids, mask).double()).cpu().numpy()
    finally:
        model.train(was_training)
    return scores


def cross_loss(name: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    targets = targets.clamp(0.0, 1.0).to(logits.dtype)
    if name == "bce":
        return nn.functional.binary_cross_entropy_with_logits(logits, targets)
    return nn.functional.mse_loss(torch.sigmoid(logits), targets)


def train_cross_epoch(model: CrossEncoder, optimizer, scheduler, token_lists: list[list[int]], targets: torch.Tensor,
                      batches: list[list[int]], loss_name: str, pad_id: int, device, dtype,
                      max_grad_norm: float | None, where: str) -> float:
    """One pass over `batches`; returns the mean loss. A non-finite loss ends the trial."""
    model.train()
    total = 0.0
    for step, batch in enumerate(batches, start=1):
        input_ids, mask = pad([token_lists[i] for i in batch], pad_id, device)
        with autocast(device, dtype):
            logits = model(input_ids, mask).float()
        loss = cross_loss(loss_name, logits, targets[batch].to(device))
        check_finite(loss.item(), f"{where}, step {step}", "lower the cross-encoder's learning rate")
        loss.backward()
        optimizer_step(model.parameters(), optimizer, scheduler, max_grad_norm)
        total += loss.item()
    return total / max(1, len(batches))


def both_orders(frame: pd.DataFrame) -> pd.DataFrame:
    """Each pair as (s1, s2) and as (s2, s1) with the same label: a cross-encoder reads an ordered
    input, and Trans-Encoder trains it on both orders."""
    swapped = frame.rename(columns={"sentence1": "sentence2", "sentence2": "sentence1"})
    return pd.concat([frame, swapped[frame.columns]], ignore_index=True)


def fit_cross_encoder(model: CrossEncoder, tokens: PairTokens, frame: pd.DataFrame, epochs: int, lr: float,
                      batch_size: int, seed: int, loss_name: str, device, dtype, warmup_ratio: float = 0.1,
                      where: str = "cross-encoder") -> list[float]:
    """Train on `frame`'s (sentence1, sentence2, score) for `epochs` with a fresh optimizer; the
    mean loss per epoch."""
    token_lists = tokens.lookup(list(frame["sentence1"]), list(frame["sentence2"]))
    targets = torch.as_tensor(frame["score"].to_numpy(dtype=np.float32).copy())
    optimizer = build_optimizer(list(model.named_parameters()), lr, 0.01)
    total = math.ceil(len(frame) / batch_size) * epochs
    scheduler = linear_schedule(optimizer, round(warmup_ratio * total), total)
    losses = []
    for epoch in range(1, epochs + 1):
        torch.manual_seed(seed * 1_000 + epoch)
        batches = epoch_batches([len(t) for t in token_lists], batch_size, seed * 1_000 + epoch, True)
        losses.append(train_cross_epoch(model, optimizer, scheduler, token_lists, targets, batches, loss_name,
                                        tokens.pad_id, device, dtype, 1.0, f"{where} epoch {epoch}"))
    return losses


def score_split(model: CrossEncoder, tokens: PairTokens, frame: pd.DataFrame, split: str, device,
                dtype) -> tuple[dict[str, float], np.ndarray]:
    scores = predict(model, tokens.lookup(list(frame["sentence1"]), list(frame["sentence2"])), tokens.pad_id,
                     device, dtype)
    return sts_metrics(split, scores, frame["score"].to_numpy(dtype=np.float64)), scores


def score_both_orders(model: CrossEncoder, tokens: PairTokens, frame: pd.DataFrame, device, dtype) -> np.ndarray:
    """A cross-encoder's score of each pair, averaged over both orders (for one that learned both)."""
    n = len(frame)
    ordered = both_orders(frame[["sentence1", "sentence2"]])
    scores = predict(model, tokens.lookup(list(ordered["sentence1"]), list(ordered["sentence2"])), tokens.pad_id,
                     device, dtype)
    return (scores[:n] + scores[n:]) / 2
