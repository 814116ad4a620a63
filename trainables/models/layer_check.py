"""The layer check: a model is compared with its architecture entry before a study uses it, instead of
trusting the entry. At each layer k asked for, the model cut at k (`cut_view`, the surgery fine-tuning
does) must give the reference representation of layer k (`layer_states`, what the probe scores, from one
pass of the whole model) on a few sentences. A pass is remembered by a fingerprint of the weights (in
memory, and in `layer_checks.json` under the cache folder), so a model is checked once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainables.errors import UserInputError
from trainables.models.architectures import (
    ARCHITECTURES,
    HOW_TO_ADD,
    architecture_of,
    cut_view,
    layer_states,
    require_architecture,
    stack_depth,
    token_states,
)
from trainables.models.layer_cache import CACHE_FILE, _cache_file, _cached, _files_key, _records  # noqa: F401

if TYPE_CHECKING:
    from torch import nn

SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Two dogs run.",
    "The quick brown fox jumps over the lazy dog near the old river bank at dawn.",
    "Ein Kind spielt im Garten mit einem roten Ball.",
)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}  # of the largest state; half precision: 2e-2
HALF_TOLERANCE = 2e-2
SAMPLE = 64  # values read from each end of each tensor for the fingerprint

_passed: dict[str, set[int]] = {}


class LayerMismatchError(UserInputError):
    """A model whose cut at some k does not give the reference representation of layer k."""

    problem = "fails the layer check"


def weights_fingerprint(model: nn.Module) -> str:
    """A cheap hash of what decides the check: transformers' version, the table entry, the config, and
    every tensor's name, shape, dtype and first and last values (not all of its bytes)."""
    import transformers

    digest = hashlib.sha256(f"{transformers.__version__}|{architecture_of(model)!r}|".encode())
    digest.update(model.config.to_json_string(use_diff=False).encode())
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().reshape(-1)
        digest.update(f"|{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        for part in (flat[:SAMPLE], flat[-SAMPLE:]):
            digest.update(part.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def encode(tokenizer: Any, sentences: Sequence[str], device: torch.device) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask` of `sentences`, padded on the side the tokenizer pads (a tokenizer
    without a pad token pads with id 0: the mask hides it)."""
    rows = [list(tokenizer(s, truncation=True, max_length=64)["input_ids"]) for s in sentences]
    width = max(len(row) for row in rows)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = 0 if pad is None else pad
    left = getattr(tokenizer, "padding_side", "right") == "left"
    ids, mask = [], []
    for row in rows:
        fill = width - len(row)
        ids.append([pad] * fill + row if left else row + [pad] * fill)
        mask.append([0] * fill + [1] * len(row) if left else [1] * len(row) + [0] * fill)
    return {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(mask, device=device)}


def difference(got: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference on real tokens, relative to the largest reference state (at least 1)."""
    real = mask.bool()
    got, reference = got[real].double(), reference[real].double()
    return float((got - reference).abs().max() / reference.abs().max().clamp(min=1.0))


def check_layers(model: nn.Module, tokenizer: Any, layers: Sequence[int] | None = None,
                 sentences: Sequence[str] = SENTENCES, *, name: str | None = None,
                 tolerance: float | None = None, cache_dir: str | Path | None = None) -> dict[int, float]:
    """Compare the model cut at each k in `layers` (None: every layer) with the reference layer k, on
    `sentences`; returns each k's relative difference ({} when this model passed for these layers before).
    An architecture not in the table, or a difference above `tolerance`, is one line. The model is left
    as it came (whole, in its training mode)."""
    arch = architecture_of(model)
    shown = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
    depth = stack_depth(model)
    layers = sorted(set(range(depth + 1) if layers is None else layers))
    if not layers or not 0 <= layers[0] <= layers[-1] <= depth:
        raise UserInputError("layer", layers, f"this model has {depth} layers: use values in 0..{depth}")
    key = weights_fingerprint(model)
    if set(layers) <= _passed.get(key, set()) | _cached(key, cache_dir):
        return {}
    parameter = next(model.parameters())
    limit = tolerance if tolerance is not None else TOLERANCE.get(parameter.dtype, HALF_TOLERANCE)
    inputs = encode(tokenizer, sentences, parameter.device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            reference = dict(zip(layers, layer_states(model, inputs, layers), strict=True))
            found = {}
            for k in reversed(layers):
                with cut_view(model, k):
                    found[k] = difference(token_states(model, **inputs), reference[k], inputs["attention_mask"])
    finally:
        model.train(training)
    worst = max(found, key=found.__getitem__)
    if not found[worst] <= limit:  # NaN fails too
        target = ARCHITECTURES[model.config.model_type]
        raise LayerMismatchError("model", shown, f"cut at layer {worst}, its output differs from the reference "
                                                 f"layer {worst} by {found[worst]:.3g} (tolerance {limit:g}): the "
                                                 f"{model.config.model_type} entry {target} (blocks {arch.blocks}, "
                                                 f"final norm {arch.final_norm}) does not describe this model; "
                                                 f"fix it: {HOW_TO_ADD}")
    _remember(key, layers, model.config.model_type, cache_dir)
    return found


def check_model_layers(name: str, layers: Sequence[int] | None = None, sentences: Sequence[str] = SENTENCES,
                       cache_dir: str | Path | None = None) -> dict[int, float]:
    """`check_layers` of the model `name` (hub id or folder): its entry from `config.json` first (an
    unknown architecture is refused without loading anything), then its weights, unless these files
    (names, sizes, times) already passed for these layers."""
    require_architecture(name)
    files = _files_key(name)
    if layers is not None and set(layers) <= _passed.get(files, set()) | _cached(files, cache_dir):
        return {}
    from trainables.models.encoder import load_encoder, load_tokenizer

    try:
        model = load_encoder(name)
        tokenizer = load_tokenizer(name)
    except UserInputError:
        raise
    except Exception as exc:  # damaged or half-copied weights, a tokenizer that will not load: one line
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserInputError("model", name, f"its files could not be loaded ({type(exc).__name__}: {said}); copy "
                                            "the model folder again, or check it with `orchestrator probe --model`"
                             ) from exc
    asked = list(range(stack_depth(model) + 1)) if layers is None else list(layers)
    if set(asked) <= _passed.get(files, set()) | _cached(files, cache_dir):
        return {}
    found = check_layers(model, tokenizer, asked, sentences, name=name, cache_dir=cache_dir)
    _remember(files, asked, model.config.model_type, cache_dir)
    return found


def _remember(key: str, layers: Sequence[int], model_type: str, cache_dir: str | Path | None) -> None:
    """In memory, and in the cache file (under a lock; a cache that cannot be written is only a recheck)."""
    from filelock import FileLock

    _passed.setdefault(key, set()).update(layers)
    path = _cache_file(cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            records = _records(path)
            known = set(records.get(key, {}).get("layers", ())) if isinstance(records.get(key), dict) else set()
            records[key] = {"model_type": model_type, "layers": sorted(known | set(layers))}
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
            temporary.replace(path)
    except OSError:
        pass


__all__ = ["LayerMismatchError", "SENTENCES", "check_layers", "check_model_layers", "weights_fingerprint"]


def main(argv: Sequence[str]) -> int:
    """`python -m trainables.models.layer_check MODEL [K ...]`: the check in a process of its own (what
    `validate` and `plan` run, so that they import no torch); a refusal is one JSON object on stdout
    (key, value, fix) and exit code 2."""
    name, layers = argv[0], [int(k) for k in argv[1:]] or None
    try:
        check_model_layers(name, layers)
    except UserInputError as exc:
        print(json.dumps({"key": exc.key, "value": exc.value if isinstance(exc.value, str | int | float | None)
                          else str(exc.value), "fix": exc.fix}))
        return 2
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
