"""The models a plan cuts, checked before Ray starts: each has an entry in the layer table and takes the
poolings asked of it (from its config.json alone), and its cut at each asked layer is its entry's layer k
(on a few sentences, once per model files: in this process where torch is loaded, else in a child)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from trainables.errors import Problems, UserInputError

if TYPE_CHECKING:
    from orchestrator.study.cells import Cell
    from orchestrator.study.config import StudyConfig
    from trainables.contract import TrialConfig


def check_models(study: StudyConfig, cells: tuple[Cell, ...], parsed: list[TrialConfig],
                  origins: dict[str, str]) -> dict[str, set[int | None]]:
    """Every model the cells cut or probe has an entry in the layer table (trainables.models.architectures) and
    takes the poolings and decoder settings asked of it (no `cls` for a causal model, `bidirectional` only for one,
    `append_eos` only with an EOS token), from its config.json alone; the layers each model is cut at (None: the
    whole model), for `check_cuts` (a probe's layers are its own trials' to score, not cut here)."""
    from trainables.models.architectures import as_asked, refuse_pooling, require_architecture
    from trainables.models.files import model_config, refuse_append_eos

    found = Problems()
    layers: dict[str, set[int | None]] = {}
    for cell, cfg in zip(cells, parsed, strict=True):
        model = getattr(cfg, "model", None)
        cuts = hasattr(cfg, "layer")
        if not isinstance(model, str) or not (cuts or hasattr(cfg, "layers")):
            continue
        if found.check(require_architecture, model, "ablate.model" if "model" in cell.values else "model") is None:
            continue
        both_ways = getattr(cfg, "bidirectional", False) is True
        config = found.check(as_asked, model_config(model), both_ways,
                             origins.get("bidirectional", "train.bidirectional"))
        pooling = getattr(cfg, "pooling", None)
        if config is not None and isinstance(pooling, str):
            found.check(refuse_pooling, config, pooling, origins.get("pooling", "train.pooling"))
        if getattr(cfg, "append_eos", False) is True:
            found.check(refuse_append_eos, model, origins.get("append_eos", "train.append_eos"))
        if cuts:
            layers.setdefault(model, set()).add(cfg.layer)  # type: ignore[attr-defined]  # a kind's own field (hasattr)
    found.raise_any()
    return layers


def check_cuts(layers: dict[str, set[int | None]]) -> None:
    """Each model's cut at each layer the study asks for is its entry's layer k, on a few sentences
    (trainables.models.layer_check; once per model files, then answered from the cache)."""
    import sys

    if "torch" in sys.modules:  # a process that has it (launch, probe, a notebook): in process, remembered there
        from trainables.models.layer_check import check_model_layers

        for model, asked in layers.items():
            check_model_layers(model, None if None in asked else sorted(cast("set[int]", asked)))  # None is not in it
        return
    from trainables.models.files import model_depth
    from trainables.models.layer_cache import already_checked

    for model, asked in layers.items():  # validate and plan import no torch: a child process checks, once
        wanted = list(range(model_depth(model) + 1)) if None in asked else sorted(k for k in asked if k is not None)
        if not already_checked(model, wanted):
            check_cut_apart(model, wanted)


def check_cut_apart(model: str, layers: list[int]) -> None:
    """`trainables.models.layer_check` in a process of its own (answered from its cache file once done)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "trainables.models.layer_check", model, *map(str, layers)],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode == 0:
        return
    try:
        said = json.loads(done.stdout.strip().splitlines()[-1])
        refusal = UserInputError(str(said["key"]), said["value"], str(said["fix"]))
    except (ValueError, IndexError, KeyError, TypeError):  # not the child's one line: it could not run
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        refusal = UserInputError("model", model, f"its layer check could not run ({last}); run `orchestrator "
                                                 "probe --model` on it to see why")
    raise refusal
