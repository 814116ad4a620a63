"""Errors a trial can end with, and the one kind of error a user fixes by editing input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
SHOWN_CHARS = 200


class UserInputError(ValueError):
    """Bad input from the user: one line naming the key, the bad value and the fix (exit code 2)."""

    problem = "is not valid"

    def __init__(self, key: str, value: object, fix: str) -> None:
        self.key, self.value, self.fix = key, value, fix
        shown = repr(value)
        if len(shown) > SHOWN_CHARS:  # one line stays one line, whatever the value
            shown = shown[:SHOWN_CHARS] + f"… ({len(shown):,} characters)"
        super().__init__(f"{key}: {shown} {self.problem}; {fix}")


class UserInputErrors(UserInputError):
    """Several problems of one input, each its own line: `validate` reports every error of a study file at
    once. Behaves as its first error where one is expected (key, value, fix, message)."""

    def __init__(self, errors: list[UserInputError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.key, first.value, first.fix)
        self.args = (str(first),)

    def lines(self) -> list[str]:
        return [str(e) for e in self.errors]


class Problems:
    """Collects the UserInputErrors of several independent checks, so one pass reports all it can find;
    the same message twice (a bad key that every cell repeats) is kept once."""

    def __init__(self) -> None:
        self.errors: list[UserInputError] = []

    def add(self, *errors: UserInputError) -> None:
        for error in errors:
            if str(error) not in {str(e) for e in self.errors}:
                self.errors.append(error)

    def check(self, step: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """`step(*args, **kwargs)`, or None with its errors kept."""
        try:
            return step(*args, **kwargs)
        except UserInputErrors as exc:
            self.add(*exc.errors)
        except UserInputError as exc:
            self.add(exc)
        return None

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise UserInputErrors(self.errors)


class DataNotFoundError(UserInputError):
    """A data set is neither in the data folder nor reachable on the hub."""

    problem = "has no data here"


class StorageFullError(UserInputError):
    """The disk under the study folder (or the temp folder) is full: the study stops, nothing it
    finished is lost, and `resume` runs what the full disk stopped once there is space (exit code 1)."""

    problem = "has no space left"
    exit_code = 1


STORAGE_FULL_MARKS = ("[Errno 28]", "No space left on device", "[Errno 122]", "Disk quota exceeded")


def storage_full(error: str | None) -> bool:
    """Does an error (a trial's last traceback line, an exception's text) say the disk is full?"""
    return bool(error) and any(mark in error for mark in STORAGE_FULL_MARKS)


class TrainingDivergedError(RuntimeError):
    """The training loss became NaN or infinite; the trial ends as diverged."""


def one_of(key: str, value: object, valid: object) -> UserInputError:
    """The error for a name outside a closed registry, listing the valid names."""
    names = ", ".join(sorted(str(v) for v in valid))
    return UserInputError(key, value, f"use one of: {names}")
