"""Post-processing of sentence vectors before the cosine: an affine map y = (x - mean) @ matrix, fitted on
the train split's sentences only and applied to dev and test (`postprocess:`).

- `whiten` (Su et al. 2021, "Whitening Sentence Representations for Better Semantics and Faster Retrieval";
  bojone/BERT-whitening's `compute_kernel_bias`): mean μ, covariance Σ = np.cov(xᵀ) (n − 1 in the
  denominator), its SVD U S Uᵀ, matrix U S^-1/2, its first `dim` columns when a dimension is given (the
  reference's n_components). Without one, every direction the vectors span: the reference keeps all d, and
  a LayerNorm's output spans d − 1 (see SPANNED), whose last 1 / sqrt(s) is rounding noise made unit variance.
- `abtt` (Mu & Viswanath 2018, "All-but-the-Top", Algorithm 1): centre, then remove the projections on the
  top D principal directions of the centred vectors: matrix I − U_D U_Dᵀ; D = `dim`, by default d / 100
  rounded (the paper's rule), at least 1. The paper writes the projection of the raw vector (u_iᵀ v); we
  project the centred one, so the output stays centred; the two differ by one constant vector.
- `zscore`: each dimension centred and divided by its standard deviation (ddof 0); a constant dimension
  is left at 0.

Every map is affine, so a model saved with one (`save:`) carries it as a sentence-transformers Dense layer
with an identity activation, and gives the vectors the trial scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainables.errors import UserInputError, one_of

if TYPE_CHECKING:  # torch is imported where a map is fitted or applied: `validate` checks the names without it
    import torch

POSTPROCESSES = ("none", "whiten", "abtt", "zscore")
# a covariance eigenvalue below this share of the largest is no direction of the vectors: a LayerNorm's output
# spans d - 1 dimensions (its normalized coordinates sum to zero), so a mean of them does too, and the
# reference's 1 / sqrt(s) of that last eigenvalue (1e-15 of the largest, rounding) would blow up noise
SPANNED = 1e-10


@dataclass(frozen=True)
class Affine:
    """y = (x - mean) @ matrix, in float64."""

    mean: np.ndarray  # (d,)
    matrix: np.ndarray  # (d, k)

    def __call__(self, vectors: torch.Tensor) -> torch.Tensor:
        import torch

        x = vectors.double()
        return (x - torch.from_numpy(self.mean)) @ torch.from_numpy(self.matrix)

    def as_linear(self) -> torch.nn.Linear:
        """The same map as a torch Linear (weight matrixᵀ, bias −mean @ matrix), in float32."""
        import torch

        linear = torch.nn.Linear(self.matrix.shape[0], self.matrix.shape[1])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(self.matrix.T.copy()))
            linear.bias.copy_(torch.from_numpy(-(self.mean @ self.matrix)))
        return linear


def abtt_dim(width: int) -> int:
    """All-but-the-top's default number of directions removed: d / 100, at least 1."""
    return max(1, round(width / 100))


def fit(method: str, vectors: np.ndarray | torch.Tensor, dim: int | None = None,
        key: str = "postprocess") -> Affine | None:
    """The map `method` fitted on `vectors` (n, d); None for `none`. One line naming `key` when the
    vectors cannot determine it (fewer sentences than the dimensions it needs)."""
    if method not in POSTPROCESSES:
        raise one_of(key, method, POSTPROCESSES)
    if method == "none":
        return None
    x = (vectors.double().numpy() if hasattr(vectors, "double") else np.asarray(vectors, dtype=np.float64))
    n, width = x.shape
    if dim is not None and not 1 <= dim <= width:
        raise UserInputError(f"{key}_dim", dim, f"the vectors have {width} dimensions: use 1..{width}")
    mean = x.mean(axis=0)
    if method == "zscore":
        if dim is not None:
            raise UserInputError(f"{key}_dim", dim, "zscore keeps every dimension: remove postprocess_dim")
        std = x.std(axis=0)
        return Affine(mean, np.diag(np.divide(1.0, std, out=np.zeros_like(std), where=std > 0)))
    needed = (dim or width) + 1 if method == "whiten" else (dim or abtt_dim(width)) + 1
    if n < needed:
        raise UserInputError(key, method, f"fitting it needs at least {needed} distinct train sentences and the "
                                          f"train split has {n}: raise max_train_samples, or give a smaller "
                                          f"{key}_dim")
    if method == "whiten":
        u, s, _ = np.linalg.svd(np.cov(x.T))
        spanned = int((s > SPANNED * s[0]).sum())  # a direction without variance: its 1 / sqrt(s) is noise
        if dim is not None and dim > spanned:
            raise UserInputError(f"{key}_dim", dim, f"the train sentences' vectors span {spanned} of their {width} "
                                                    f"dimensions: give {spanned} or less")
        kept = dim or spanned
        return Affine(mean, u[:, :kept] / np.sqrt(s[:kept]))
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    top = vt[: dim or abtt_dim(width)].T  # (d, D): the top principal directions
    return Affine(mean, np.eye(width) - top @ top.T)


def fitted_embed(embed, affine: Affine | None):
    """`embed` followed by the map (`embed` itself when there is none)."""
    if affine is None:
        return embed

    def post(sentences):
        return affine(embed(sentences))

    return post


class FittedOnTrain:
    """A run's `postprocess` map: fitted on its train sentences (dev and test never) with the weights `model`
    holds now, once per state of those weights (every in-place change of a parameter, a step or a load, bumps
    its version), so scoring dev, test and the export right after test reuse one map. None for `none`."""

    def __init__(self, method: str, dim: int | None, model: torch.nn.Module, embed, sentences: list[str]):
        self.method, self.dim, self.model, self.embed = method, dim, model, embed
        self.sentences = list(dict.fromkeys(sentences))
        self._fitted: tuple | None = None  # (the weights' versions, the map fitted for them)

    def __call__(self) -> Affine | None:
        if self.method == "none":
            return None
        weights = tuple(p._version for p in self.model.parameters())
        if self._fitted is None or self._fitted[0] != weights:
            self._fitted = (weights, fit(self.method, self.embed(self.sentences), self.dim))
        return self._fitted[1]

    def embedder(self):
        """`embed` followed by the map fitted for the weights held now."""
        return fitted_embed(self.embed, self())
