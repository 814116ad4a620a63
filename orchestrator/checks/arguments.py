"""The public API's arguments checked before a function runs: a notebook's wrong type is one
`UserInputError` naming the argument and what it takes, not a TypeError from deep inside."""

from __future__ import annotations

import os
from typing import Any

from trainables.errors import UserInputError

PATHLIKE = (str, os.PathLike)
# What each annotation of the public functions admits, checked before a function runs: a notebook's wrong
# type is one UserInputError naming the argument, not a TypeError from deep inside
ADMITS: dict[str, tuple[str, Any]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "str | None": ("a string or None", lambda v: v is None or isinstance(v, str)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "bool": ("True or False", lambda v: isinstance(v, bool)),
    "str | Path": ("a path (str or Path)", lambda v: isinstance(v, PATHLIKE)),
    "str | Path | None": ("a path (str or Path) or None", lambda v: v is None or isinstance(v, PATHLIKE)),
    "Storage": ("a folder (str or Path) or None", lambda v: v is None or isinstance(v, PATHLIKE)),
    "Sequence[str]": ("a list of strings such as ['train.lr=3e-5']",
                      lambda v: isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)),
    "str | Sequence[str]": ("a study name or a list of names", lambda v: isinstance(v, str) or (
        isinstance(v, list | tuple) and all(isinstance(x, str) for x in v))),
    "Sequence[str] | None": ("a list of strings or None", lambda v: v is None or (
        isinstance(v, list | tuple) and all(isinstance(x, str) for x in v))),
    "Sequence[int] | None": ("a list of integers or None", lambda v: v is None or (
        isinstance(v, list | tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v))),
}


def checked_arguments(function: Any, admits: dict[str, tuple[str, Any]] | None = None) -> Any:
    """`function` with its arguments checked against the annotations above (and `admits`, the caller's own
    types) before it runs."""
    import functools
    import inspect

    signature = inspect.signature(function)
    known = {**ADMITS, **(admits or {})}
    checks = {name: known[str(p.annotation)] for name, p in signature.parameters.items()
              if str(p.annotation) in known}

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise UserInputError(function.__name__, "arguments", f"{exc}: see help(orchestrator.{function.__name__})"
                                 ) from None
        for name, value in bound.arguments.items():
            if name in checks and not checks[name][1](value):
                raise UserInputError(name, value if isinstance(value, str | int | float | None) else
                                     type(value).__name__, f"give {checks[name][0]}")
        return function(*args, **kwargs)

    return wrapper
