"""Parameter types of a study's search space, parsed from YAML values. Pure: no Ray, no Optuna.

In `ablate`, a list is a Grid (every value is a cell). In `tune.params`, a list is a Choice and
a mapping names a distribution: {uniform: [a, b]}, {loguniform: [a, b]}, {int: [a, b]},
{choice: [...]}. A scalar anywhere is Fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainables.errors import UserInputError


@dataclass(frozen=True)
class Fixed:
    value: Any


@dataclass(frozen=True)
class Grid:
    values: tuple


@dataclass(frozen=True)
class Choice:
    values: tuple


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int


Param = Fixed | Grid | Choice | Uniform | LogUniform | IntRange
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "int")


def _bounds(key: str, name: str, raw: Any) -> tuple[float, float]:
    if not (isinstance(raw, list | tuple) and len(raw) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw)):
        raise UserInputError(key, {name: raw}, f"give {name} two numbers [low, high]")
    low, high = raw
    if not low < high:
        raise UserInputError(key, {name: raw}, f"{name} needs low < high")
    if name == "loguniform" and low <= 0:
        raise UserInputError(key, {name: raw}, "loguniform needs low > 0")
    if name == "int" and not all(float(x).is_integer() for x in raw):
        raise UserInputError(key, {name: raw}, "int needs whole numbers [low, high]")
    return low, high


def parse_tuned(key: str, raw: Any) -> Param:
    """A `tune.params` entry."""
    if isinstance(raw, dict):
        if len(raw) != 1 or next(iter(raw)) not in DISTRIBUTIONS:
            raise UserInputError(key, raw, "write one of {choice: [...]}, {uniform: [low, high]}, "
                                           "{loguniform: [low, high]}, {int: [low, high]}")
        (name, value), = raw.items()
        if name == "choice":
            return parse_tuned(key, value) if isinstance(value, list) else Fixed(value)
        low, high = _bounds(key, name, value)
        if name == "int":
            return IntRange(int(low), int(high))
        return Uniform(float(low), float(high)) if name == "uniform" else LogUniform(float(low), float(high))
    if isinstance(raw, list):
        if not raw:
            raise UserInputError(key, raw, "give at least one value")
        return Choice(tuple(raw))
    return Fixed(raw)


def parse_ablated(key: str, raw: Any) -> Fixed | Grid:
    """An `ablate` entry (presets such as `layer: all` are resolved by the caller)."""
    if isinstance(raw, dict):
        raise UserInputError(key, raw, "ablate takes a value or a list of values (a grid); "
                                       "distributions belong under tune.params")
    if isinstance(raw, list):
        if not raw:
            raise UserInputError(key, raw, "give at least one value")
        if len(set(map(repr, raw))) != len(raw):
            raise UserInputError(key, raw, "values repeat; list each once")
        return Grid(tuple(raw))
    return Fixed(raw)
