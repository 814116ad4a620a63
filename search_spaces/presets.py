"""Named presets: short YAML words that expand to real axes once the model and task are known."""

from __future__ import annotations

from typing import Any

from search_spaces.params import Fixed, Grid, LogUniform, Param
from trainables.errors import UserInputError
from trainables.poolings import ALL as ALL_POOLINGS
from trainables.poolings import POOLINGS

# tune.params presets
LR_DEFAULT = LogUniform(1e-5, 1e-4)  # the range truncated fine-tuning searches in the reference paper


def expand_layer(raw: Any, depth: int) -> Fixed | Grid:
    """`all` is 0..depth, `last` is depth; numbers must lie in 0..depth."""
    if raw == "all":
        return Grid(tuple(range(depth + 1)))
    if raw == "last":
        return Fixed(depth)
    layers = raw if isinstance(raw, list) else [raw]
    resolved = [depth if k == "last" else k for k in layers]
    bad = [k for k in resolved if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= depth]
    if bad:
        raise UserInputError("ablate.layer", raw,
                             f"the model has {depth} layers: use all, last, or numbers in 0..{depth}")
    return Grid(tuple(resolved)) if isinstance(raw, list) else Fixed(resolved[0])


def expand_pooling(raw: Any) -> Fixed | Grid:
    """`all` is the built-in encoder poolings (a plugin's, and last_token, are named one by one, so `all`
    means the same wherever the study runs); names come from the registry, plugins' included."""
    if raw == "all":
        return Grid(ALL_POOLINGS)
    names = raw if isinstance(raw, list) else [raw]
    bad = [p for p in names if p not in POOLINGS]
    if bad:
        raise UserInputError("ablate.pooling", bad[0], "use all or names from: " + POOLINGS.listing(sort=False))
    return Grid(tuple(names)) if isinstance(raw, list) else Fixed(raw)


def expand_language(raw: Any, languages: tuple[str, ...]) -> Fixed | Grid:
    if raw == "all":
        return Grid(languages)
    names = raw if isinstance(raw, list) else [raw]
    bad = [x for x in names if x not in languages]
    if bad:
        hint = " (Korean STS-B is the task korsts)" if "ko" in bad else ""
        raise UserInputError("ablate.language", bad[0], "the task's languages are: " + ", ".join(languages) + hint)
    return Grid(tuple(names)) if isinstance(raw, list) else Fixed(raw)


def expand_tuned_preset(key: str, raw: Any) -> Param | None:
    """`lr: default` is the paper's log-uniform range; None when `raw` is not a preset word."""
    if key == "lr" and raw == "default":
        return LR_DEFAULT
    return None


def expand_seeds(raw: Any) -> tuple[int, ...]:
    """`replicate.seeds`: a list of seeds, or a count N meaning seeds 0..N-1."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise UserInputError("replicate.seeds", raw, "give a count of at least 1 or a list of seeds")
        return tuple(range(raw))
    if isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) for s in raw):
        if len(set(raw)) != len(raw):
            raise UserInputError("replicate.seeds", raw, "seeds repeat; list each once")
        return tuple(raw)
    raise UserInputError("replicate.seeds", raw, "give a list of whole numbers such as [0, 1, 2] or a count")
