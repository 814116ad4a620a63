"""Errors a trial can end with, and the one kind of error a user fixes by editing input."""

from __future__ import annotations

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
