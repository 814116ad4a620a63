"""In-batch negatives on (anchor, positive[, negative]) pairs: sentence-transformers'
MultipleNegativesRankingLoss (`sentence_transformer/losses/multiple_negatives_ranking.py`, 6.2), the variants its
documentation names and its GradCache form, each equal to it on the same embeddings, and GISTEmbedLoss
(`GISTLoss` below, equal to theirs) (tests/trainables/test_ranking.py, test_gradient_cache.py):

- `mnrl`: InfoNCE, directions ("query_to_doc",), the default (SBERT's NLI v2 recipe, SimCSE's supervised loss);
- `mnrl_symmetric`: ("query_to_doc", "doc_to_query"), per_direction (MultipleNegativesSymmetricRankingLoss);
- `gte`: all four directions, one joint softmax (GTE's improved contrastive loss, Li et al. 2023);
- `cached_mnrl`: `mnrl` through GradCache (CachedMultipleNegativesRankingLoss): a large batch in a small one's
  memory, each mini-batch encoded twice;
- `gist`: GISTEmbed, in-batch negatives a frozen guide model judges false left out.

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


class GISTLoss(nn.Module):
    """sentence-transformers' GISTEmbedLoss (`sentence_transformer/losses/gist_embed.py`, 6.2; Solatorio 2024):
    in-batch negatives like MNRL, but a frozen guide model's cosines decide which are false negatives: any
    candidate the guide finds more similar to the anchor than the anchor's own positive (minus `margin`,
    `absolute`, or minus |sim| x margin, `relative`) is left out of the softmax. Anchor->positives and
    anchor->negatives, anchor->anchors and positive->positives (their contrast_anchors and contrast_positives,
    on), one softmax at temperature 0.01; `target` names each anchor's positive among the first `batch` rows of
    `v` (`arange`, as there). The learner gives the batch's guide vectors (`guide`) before each step, laid out
    as `u` and `v` are."""

    guided = True

    def __init__(self, dim: int, temperature: float = 0.01, margin: float = 0.0, strategy: str = "absolute"):
        super().__init__()
        self.temperature, self.margin, self.strategy = temperature, margin, strategy
        self.guide: tuple[torch.Tensor, torch.Tensor] | None = None

    def _masked(self, guided: torch.Tensor, sims: torch.Tensor, own: torch.Tensor,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        limit = own - (own.abs() * self.margin if self.strategy == "relative" else self.margin)
        mask = guided > limit
        if keep is not None:
            mask = mask & ~keep
        return sims.masked_fill(mask, -torch.inf)

    def forward(self, u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.guide is None:
            raise RuntimeError("GISTLoss needs the batch's guide vectors (set .guide before the step)")
        gu, gv = self.guide
        batch = u.shape[0]
        positives, negatives = v[:batch], v[batch:]
        guide_positives, guide_negatives = gv[:batch], gv[batch:]
        guided_ap = cosine_matrix(gu, guide_positives)
        rows = torch.arange(batch, device=u.device)
        own = guided_ap[rows, target].view(-1, 1)  # the guide's cosine of each anchor and its positive
        keep = torch.zeros_like(guided_ap, dtype=torch.bool)
        keep[rows, target] = True  # the anchor's own positive is never masked
        scores = [self._masked(guided_ap, cosine_matrix(u, positives), own, keep),
                  self._masked(cosine_matrix(gu, gu), cosine_matrix(u, u), own),
                  self._masked(cosine_matrix(guide_positives, guide_positives), cosine_matrix(positives, positives),
                               own)]
        if len(negatives):
            for j in range(0, len(negatives), batch):  # each column of hard negatives, as its own block
                scores.append(self._masked(cosine_matrix(gu, guide_negatives[j:j + batch]),
                                           cosine_matrix(u, negatives[j:j + batch]), own))
        return F.cross_entropy(torch.cat(scores, dim=1) / self.temperature, target)
