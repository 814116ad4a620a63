"""In-batch negatives on (anchor, positive[, negative]) pairs: sentence-transformers'
MultipleNegativesRankingLoss (`sentence_transformer/losses/multiple_negatives_ranking.py`, 6.2) and the two
variants its documentation names, each equal to it on the same embeddings (tests/trainables/test_ranking.py):

- `mnrl`: InfoNCE, directions ("query_to_doc",), the default (SBERT's NLI v2 recipe, SimCSE's supervised loss);
- `mnrl_symmetric`: ("query_to_doc", "doc_to_query"), per_direction (MultipleNegativesSymmetricRankingLoss);
- `gte`: all four directions, one joint softmax (GTE's improved contrastive loss, Li et al. 2023);
- `cached_mnrl`: `mnrl` through GradCache (CachedMultipleNegativesRankingLoss): a large batch in a small one's
  memory, each mini-batch encoded twice.

As a `PairLoss` it is called with `u` the anchors (batch, dim), `v` the candidates: the batch's positives,
then its hard negatives if any (batch * (1 + negatives), dim), and `target` the column of `v` that holds each
anchor's positive (`arange(batch)`). Similarity: the cosine, times `scale` (20, theirs). Not carried over:
gathering across devices (one process trains one trial) and the hardness weighting modes (off there by
default)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' `cos_sim`: the (len(a), len(b)) cosines of unit-normalised rows."""
    return F.normalize(a, p=2, dim=1) @ F.normalize(b, p=2, dim=1).T


class RankingLoss(nn.Module):
    directions: tuple[str, ...] = ("query_to_doc",)
    partition: str = "joint"

    def __init__(self, dim: int, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = u.shape[0]
        if v.shape[0] % batch or target.shape[0] != batch:
            raise ValueError(f"{type(self).__name__}: {batch} anchors, {v.shape[0]} candidates and {target.shape[0]} "
                             "targets; the candidates are the positives, then whole columns of negatives")
        rows = torch.arange(batch, device=u.device)
        positives = v[target]
        matrices = {"query_to_doc": cosine_matrix(u, v)}
        if "query_to_query" in self.directions:
            itself = torch.eye(batch, device=u.device, dtype=torch.bool)
            matrices["query_to_query"] = cosine_matrix(u, u).masked_fill(itself, -torch.inf)
        if "doc_to_query" in self.directions:
            matrices["doc_to_query"] = cosine_matrix(u, positives).T
        if "doc_to_doc" in self.directions:
            same = torch.eye(batch, device=u.device, dtype=torch.bool)[target].repeat(1, v.shape[0] // batch)
            matrices["doc_to_doc"] = cosine_matrix(v, positives).T.masked_fill(same, -torch.inf)
        scaled = [m * self.scale for m in matrices.values()]
        positive = scaled[0][rows, target]
        if self.partition == "joint":
            log_z = torch.logsumexp(torch.cat(scaled, dim=1), dim=1)
        else:
            log_z = sum(torch.logsumexp(m, dim=1) for m in scaled) / len(scaled)
        return -(positive - log_z).mean()


class MultipleNegativesRankingLoss(RankingLoss):
    """InfoNCE with in-batch negatives: each anchor against every candidate of the batch."""


class CachedRankingLoss(RankingLoss):
    """MNRL trained through GradCache (`trainables.training.bi_encoder.cached_step`): the same loss and
    gradients as `mnrl` (sentence-transformers' CachedMultipleNegativesRankingLoss), with the activations of
    `mini_batch_size` sentences at a time, so `batch_size` (the in-batch negatives) can grow past memory (its
    declaration says `gradient_cache=True`; the loss itself is MNRL's)."""


class SymmetricRankingLoss(RankingLoss):
    """Also each positive against every anchor; the two softmaxes' losses averaged."""

    directions = ("query_to_doc", "doc_to_query")
    partition = "per_direction"


class GTERankingLoss(RankingLoss):
    """Anchor->candidates, anchor->anchors, positive->anchors and positive->candidates in one softmax."""

    directions = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
