"""The ablate block as a grid of cells: its axes parsed (each problem to the caller's list), their full
factorial, `layer: all|last` expanded with each model's depth, and the keys the orchestrator sets itself."""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass
from typing import Any, cast

from orchestrator.study.config import StudyConfig
from search_spaces.params import Fixed, Grid, parse_ablated
from search_spaces.presets import expand_language, expand_layer, expand_pooling
from trainables.contract import TrialConfig
from trainables.errors import Problems, UserInputError

# keys the orchestrator sets itself; a study may not put them in train/ablate/tune
MANAGED = {"seed", "model", "task", "data_dir", "num_threads", "device", "max_train_samples", "max_eval_samples",
           "score_test", "cache_dir", "export_model"}


@dataclass(frozen=True)
class Cell:
    index: int
    values: dict[str, Any]

    @property
    def key(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items()) or "all"


def model_depth_at(model: str, key: str) -> int:
    from trainables.models.files import model_depth

    try:
        return model_depth(model)
    except UserInputError as exc:
        raise UserInputError(key, model, exc.fix) from None


def did_you_mean(key: str, name: str, valid: list[str]) -> UserInputError:
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return UserInputError(key, name, f"{hint}valid names: {', '.join(sorted(valid))}")


def ablate_axes(study: StudyConfig, schema: type[TrialConfig], found: Problems) -> dict[str, Fixed | Grid]:
    """The ablated axes that parse; the problems of the others go to `found`."""
    valid = [k for k in schema.model_fields if k not in MANAGED or k == "model"]
    axes: dict[str, Fixed | Grid] = {}
    for name, raw in study.ablate.items():
        axis = found.check(ablate_axis, study, name, raw, valid)
        if axis is not None:
            axes[name] = axis
    return axes


def ablate_axis(study: StudyConfig, name: str, raw: Any, valid: list[str]) -> Fixed | Grid:
    from trainables.data.tasks import task_languages

    key = f"ablate.{name}"
    if name == "seed":
        raise UserInputError(key, raw, "seeds are never ablated: list them under replicate.seeds")
    if name not in valid:
        raise did_you_mean(key, name, valid)
    if isinstance(raw, list):
        parse_ablated(key, raw)  # empty lists and repeated values
    if name == "pooling":
        return expand_pooling(raw)
    if name == "language":
        return expand_language(raw, task_languages(study.task))
    if name == "layer":
        return Grid(()) if raw in ("all", "last") else parse_ablated(key, raw)  # per model, in _cells
    return parse_ablated(key, raw)


def grid_cells(study: StudyConfig, axes: dict[str, Fixed | Grid],
               found: Problems | None = None) -> list[dict[str, Any]]:
    """The full factorial grid; `layer: all|last` expands with each cell's model depth. With `found`, layers
    a model does not have go there and the grid goes on with the ones it has (its trials are still checked)."""
    grid_axes = {k: v for k, v in axes.items() if k != "layer"}
    combos = [dict(zip(grid_axes, values, strict=True)) for values in
              itertools.product(*[(p.value,) if isinstance(p, Fixed) else p.values for p in grid_axes.values()])]
    if "layer" not in axes:
        return combos
    cells = []
    depths: dict[str, int] = {}
    for combo in combos:
        model = cast(str, combo.get("model", study.model))  # a study names a model unless ablate.model lists them
        if model not in depths:
            depths[model] = model_depth_at(model, "ablate.model" if "model" in combo else "model")
        try:
            layers = expand_layer(study.ablate["layer"], depths[model])
        except UserInputError as exc:
            if found is None:
                raise
            found.add(exc)
            raw = study.ablate["layer"]
            layers = Grid(tuple(v for v in raw if type(v) is int and 0 <= v <= depths[model]) or (depths[model],)
                          if isinstance(raw, list) else (depths[model],))
        for layer in (layers.value,) if isinstance(layers, Fixed) else layers.values:
            cells.append({k: layer if k == "layer" else combo[k] for k in axes})  # the YAML's axis order
    return cells
