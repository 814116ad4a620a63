"""The plan's checks across its parts: the task's name and language, every trial config against its kind
(with each tuned value it may meet), the report's axes and baseline, and a model's depth for `layer`."""

from __future__ import annotations

import json
from typing import Any, cast

from orchestrator.study.cells import Cell, model_depth_at
from orchestrator.study.config import StudyConfig
from orchestrator.study.data import check_task
from search_spaces.params import Choice, Fixed, Grid, IntRange, LogUniform, Param, Uniform
from trainables.contract import TrialConfig
from trainables.errors import Problems, UserInputError, UserInputErrors
from trainables.kinds import TrainableKind


def covering_values(param: Param) -> list[Any]:
    """Values that together cover what a tuned parameter can take (every choice, both ends of a
    range), to check each against the trainable before launch."""
    if isinstance(param, Fixed):
        return [param.value]
    if isinstance(param, Grid | Choice):
        return list(param.values)
    if isinstance(param, IntRange | Uniform | LogUniform):
        return [param.low, param.high]
    raise TypeError(param)


def check_task_name(study: StudyConfig) -> None:
    check_task(study, task_names())


def check_language(study: StudyConfig, axes: dict[str, Fixed | Grid]) -> None:
    from trainables.data.tasks import resolve_language, task_spec

    if "language" not in axes and isinstance(study.task, str):
        try:
            resolve_language(task_spec(study.task), study.language)
        except UserInputError as exc:
            raise UserInputError("language", study.language, exc.fix) from None


def check_trials(kind: TrainableKind, cells: tuple[Cell, ...], base: dict[str, Any], tuned: dict[str, Param],
                  origins: dict[str, str]) -> list[TrialConfig]:
    """Every cell's trial config parsed and deep-checked, with every tuned value it may meet (one
    parameter at a time); the cells' configs at the first tuned values."""
    covering = {k: covering_values(p) for k, p in tuned.items()}
    sample = {k: values[0] for k, values in covering.items()}
    found = Problems()  # every cell is checked; a problem that every cell shares is said once
    parsed = [found.check(check_trial, kind, {**base, **cell.values, **sample}, origins) for cell in cells]
    for cell in cells:
        for name, values in covering.items():
            for value in values[1:]:
                found.check(check_trial, kind, {**base, **cell.values, **sample, name: value}, origins)
    found.raise_any()
    return cast("list[TrialConfig]", parsed)  # no None: a failed check raised above


def tasks_read(study: StudyConfig, cells: tuple[Cell, ...], base: dict[str, Any], origins: dict[str, str],
               train_data: bool = True) -> list[tuple[Any, str | None, str]]:
    """Every (task, language, key) the cells train and score on, each once, in a stable order: the task,
    and (`train_data`: when the trials' checks passed) the data set a finetune trains on instead of the
    task's train split, in its own language, named by its key."""
    seen: dict[str, tuple[Any, str | None, str]] = {}
    for cell in cells:
        found = [(cell.values.get("task", base["task"]), cell.values.get("language", study.language), "task")]
        trained = cell.values.get("train_data", base.get("train_data"))
        if trained is not None and train_data:
            found.append((trained, None, origins.get("train_data", "train.train_data")))
        for read in found:
            seen.setdefault(json.dumps(read[:2], sort_keys=True, default=str), read)
    return [seen[k] for k in sorted(seen)]


def task_names() -> list[str]:
    from trainables.data.tasks import TASKS

    trains_only = ("unlabeled", "pairs", "nli")  # no dev or test split: a corpus, or a finetune's train_data
    return [name for name, spec in TASKS.items() if spec.kind not in trains_only and not spec.eval_only]


def check_trial(kind: TrainableKind, config: dict[str, Any], origins: dict[str, str]) -> TrialConfig:
    """Parse one trial config with its kind's schema, then the kind's deep checks; errors name the
    YAML key the offending value came from."""
    def key_of(name: str) -> str:
        return origins.get(name, f"train.{name}")

    def rekeyed(exc: UserInputError) -> UserInputError:
        return UserInputError(origins.get(exc.key, exc.key), exc.value, exc.fix)

    try:
        parsed: TrialConfig = kind.parse(config)
    except UserInputErrors as exc:
        raise UserInputErrors([rekeyed(e) for e in exc.errors]) from None
    except UserInputError as exc:
        raise rekeyed(exc) from None
    kind.check(parsed, key_of)
    return parsed


def check_baseline(study: StudyConfig, cells: tuple[Cell, ...]) -> None:
    axes = list(cells[0].values) if cells else []
    for key, names in (("report.rows", study.report.rows or []), ("report.columns", [study.report.columns] if
                                                                    study.report.columns else [])):
        for name in names:
            if name not in axes:
                raise UserInputError(key, name, f"name an ablated axis: {', '.join(axes) or 'none ablated'}")
    column = study.report.columns or ("layer" if "layer" in axes else (axes[-1] if axes else None))
    if column in (study.report.rows or []):  # a table with one axis both down and across: a diagonal of dashes
        given = "report.columns" if study.report.columns else "report.columns, by default layer"
        raise UserInputError("report.rows", study.report.rows, f"{column} is the axis across the tables ({given}); "
                                                               f"remove it from report.rows, or set report.columns "
                                                               f"to another ablated axis")
    baseline = study.report.baseline
    if not baseline:
        return
    for name, value in baseline.items():
        key = f"report.baseline.{name}"
        axis_values: set[Any] = {c.values.get(name) for c in cells}  # the axis's values, as the YAML gave them
        if name not in axes:
            raise UserInputError(key, value, "name an ablated axis")
        if name != column:
            raise UserInputError(key, value, f"significance compares the cells of a row against the baseline of the "
                                             f"column axis ({column}); set report.columns: {name} to compare against "
                                             f"{name}={value}, or give a baseline on {column}")
        if value == "last":
            if name != "layer":
                raise UserInputError(key, value, "last means the model's last layer; name one of the ablated values")
            # a study names its model unless ablate.model lists them (parse_study): never None here
            for model in sorted({cast(str, c.values.get("model", study.model)) for c in cells}):
                depth = model_depth_at(model, "model")
                if depth not in axis_values:
                    raise UserInputError(key, value, f"last is the model's last layer ({depth}), which the study does "
                                                     f"not ablate ({', '.join(map(str, sorted(axis_values)))}); add "
                                                     f"it to ablate.layer or name an ablated layer")
        elif value not in axis_values:
            raise UserInputError(key, value,
                                 f"use one of the ablated values: {', '.join(map(str, sorted(axis_values, key=str)))}")


def check_saved_pooling(study: StudyConfig, parsed: list[TrialConfig], origins: dict[str, str]) -> None:
    """`save:` keeps a sentence-transformers folder, which has no module that combines layers: a study that
    pools several layers (`pooling_layers` other than last) in any cell is refused before it runs."""
    if study.save == "none":
        return
    if any(getattr(p, "pool_special_tokens", True) is False for p in parsed):
        raise UserInputError(origins.get("pool_special_tokens", "train.pool_special_tokens"), False,
                             f"save: {study.save} writes sentence-transformers folders, whose Pooling pools every "
                             "token but a prompt's: use save: none, or pool_special_tokens: true")
    if any(getattr(p, "bidirectional", False) is True for p in parsed):
        raise UserInputError(origins.get("bidirectional", "train.bidirectional"), True,
                             f"save: {study.save} writes sentence-transformers folders, which build a decoder causal "
                             "again when loaded: use save: none, or bidirectional: false")
    mixed = [p.pooling_layers for p in parsed  # type: ignore[attr-defined]  # a kind's own field (getattr below)
             if getattr(p, "pooling_layers", "last") != "last"]
    if mixed:
        raise UserInputError(origins.get("pooling_layers", "train.pooling_layers"), mixed[0],
                             f"save: {study.save} writes sentence-transformers folders, which have no module that "
                             f"combines layers: use save: none, or pooling_layers: last")
