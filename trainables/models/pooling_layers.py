"""Multi-layer pooling (`pooling_layers`), its names and checks (no torch: `validate` reads them): the
token states of several layers of the cut model averaged, then pooled, instead of the cut layer's alone.
then pooled, instead of the cut layer's alone.

- `last` (the default): layer k alone, the cut's own output; today's numbers.
- `first_last`: layers 1 and k averaged, as SimCSE's `avg_first_last` (princeton-nlp/SimCSE, simcse/models.py:
  `hidden_states[1]` and `hidden_states[-1]`, averaged token by token, then the masked mean); at k = 1 that is
  layer 1, at k = 0 (no block left) the embeddings.
- `top2`: layers k - 1 and k, as SimCSE's `avg_top2` (k = 0: the embeddings).
- `all`: every layer 0..k with equal weights.
- `scalar_mix`: every layer 0..k weighted by ELMo's scalar mix, learned in training (AllenNLP's `ScalarMix`:
  `gamma * sum(softmax(s)_j * h_j)`, s initialised to zeros and gamma to 1, so it starts as `all` scaled by 1).
- a list of layers, such as `[4, 6]`: those layers with equal weights; its deepest must be the cut layer k
  (the model is cut at the deepest layer it uses).

Layer j's states are what the model cut at j returns (trainables.models.architectures: a pre-norm stack's
final norm on h_j), so the mix is the same in the probe and in fine-tuning. The mix is per token, before
the pooling, as SimCSE averages, so `cls` reads the mixed first token and `max` the mixed states' maximum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NAMES = ("last", "first_last", "top2", "all", "scalar_mix")
LEARNED = "scalar_mix"


def mixed_layers(spec: str | Sequence[int], k: int) -> list[int]:
    """The layers whose token states are averaged for the model cut at `k` (checked: see `problem`)."""
    if isinstance(spec, str):
        if spec == "last":
            return [k]
        if spec == "first_last":
            return sorted({min(1, k), k})
        if spec == "top2":
            return sorted({max(k - 1, 0), k})
        return list(range(k + 1))  # all, scalar_mix
    return sorted(set(spec))


def problem(spec: Any, k: int | None, scored: str = "the cut layer") -> str | None:
    """Why `spec` cannot be `pooling_layers` at cut `k` (None when it can, or when k is not known yet)."""
    if isinstance(spec, str):
        return None if spec in NAMES else f"use one of: {', '.join(NAMES)}, or a list of layers such as [4, 6]"
    if not isinstance(spec, list | tuple) or not spec or not all(type(j) is int for j in spec):
        return f"use one of: {', '.join(NAMES)}, or a non-empty list of layers such as [4, 6]"
    if len(set(spec)) < len(spec):
        return "name each layer once"
    if min(spec) < 0:
        return "layers are 0 (the embeddings) or more"
    if k is not None and max(spec) != k:
        return (f"the model is cut at the deepest layer it pools, which must be {scored} ({k}): include {k} and "
                f"nothing deeper, or use a name (first_last, top2, all) that follows the cut")
    return None
