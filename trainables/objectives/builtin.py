"""The built-in objectives' declarations (their modules: `sts.py`, `classification.py`, `ranking.py`)."""

from __future__ import annotations

from trainables.objectives.base import Objective

COSINE_MSE = Objective("sts", "trainables.objectives.sts:CosineMSELoss",
                       "MSE between cos(u, v) and the gold score (the reference paper's objective)")
COSENT = Objective("sts", "trainables.objectives.sts:CoSENTLoss", "CoSENT's ranking loss on cosines, scale 20")
ANGLE = Objective("sts", "trainables.objectives.sts:AnglELoss",
                  "AnglE: the CoSENT ranking on angle differences in complex space, scale 20")
SOFTMAX = Objective("pair_classification", "trainables.objectives.classification:SoftmaxClassifierLoss",
                    "SBERT's classifier on (u, v, |u - v|), cross-entropy")
COSINE_BCE = Objective("pair_classification", "trainables.objectives.classification:CosineBCELoss",
                       "BCE with the raw cosine as the logit (the reference paper's MRPC objective)")
COSINE_BCE_AFFINE = Objective("pair_classification", "trainables.objectives.classification:AffineCosineBCELoss",
                              "BCE on a learned affine logit of the cosine, w * cos + b")
MNRL = Objective("pairs", "trainables.objectives.ranking:MultipleNegativesRankingLoss",
                 "MultipleNegativesRankingLoss: InfoNCE with in-batch (and hard) negatives, cosine x 20")
MNRL_SYMMETRIC = Objective("pairs", "trainables.objectives.ranking:SymmetricRankingLoss",
                           "MNRL both ways (anchor->positives and positive->anchors), the two averaged")
GTE = Objective("pairs", "trainables.objectives.ranking:GTERankingLoss",
                "GTE's improved contrastive loss: MNRL's four directions in one softmax")
CACHED_MNRL = Objective("pairs", "trainables.objectives.ranking:CachedRankingLoss",
                        "MNRL through GradCache: the same loss and gradients, a mini-batch's memory",
                        gradient_cache=True)
GIST = Objective("pairs", "trainables.objectives.ranking:GISTLoss",
                 "GISTEmbed: in-batch negatives a frozen guide model judges false are left out (train.guide_model)",
                 guided=True)
SOFTMAX_NLI = Objective("nli", "trainables.objectives.classification:NLISoftmaxLoss",
                        "SBERT's NLI objective: the classifier on (u, v, |u - v|) over entailment, neutral and "
                        "contradiction")
