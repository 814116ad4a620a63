"""A study's data: its task (a built-in name or a declared data set) checked and read in full at
`validate`, each split's sha256 kept in the study record, and `resume` refusing data that changed
since launch, naming the split. Reading and checking the rows is `trainables.data`'s; this module
decides what a study's checks are and what its record keeps."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from orchestrator.study.config import StudyConfig
from reports.record import DataRecord, SplitRecord, StudyRecord
from trainables.data.declaration import DataDeclaration, resolve_paths
from trainables.errors import UserInputError

log = logging.getLogger("orchestrator.data")


def trial_task(study: StudyConfig, study_dir: Path | None) -> str | dict[str, Any]:
    """The `task` every trial config carries: a built-in name, or the declaration as a mapping with its
    paths made absolute (trials may run in another working folder, or on another node)."""
    if not isinstance(study.task, DataDeclaration):
        return study.task
    declared = study.task.model_dump(mode="json", exclude_defaults=True)
    return resolve_paths({"name": study.task.name, "type": study.task.type, **declared}, study_dir or Path.cwd())


def check_task(study: StudyConfig, valid_names: list[str]) -> None:
    """A built-in name the study can train on, or a declaration of a labeled data set."""
    from trainables.data.tasks import task_spec

    if isinstance(study.task, DataDeclaration):
        if study.task.type not in ("sts", "pair_classification"):
            trains = study.task.kind in ("pairs", "nli")
            fix = " (pairs, triplets and nli train a finetune as train.train_data)" if trains else ""
            raise UserInputError("task.type", study.task.type, f"{study.trainable} needs a labeled pair task with dev "
                                                               f"and test splits: sts or pair_classification{fix}")
        if study.language is not None and study.language != study.task.language:
            raise UserInputError("language", study.language, f"task {study.task.name} is in {study.task.language} "
                                                              "(task.language): remove language")
        return
    if study.task not in valid_names:
        import difflib

        close = difflib.get_close_matches(study.task, valid_names, n=1)
        raise UserInputError("task", study.task, (f"did you mean {close[0]}? " if close else "") +
                             f"valid names: {', '.join(sorted(valid_names))}, or a mapping that declares a data set")
    if task_spec(study.task).kind == "unlabeled":
        raise UserInputError("task", study.task, f"{study.trainable} needs a labeled pair task")
    if task_spec(study.task).kind in ("pairs", "nli"):
        raise UserInputError("task", study.task, f"{study.trainable} needs a task with dev and test splits to select "
                                                 f"and score on; {study.task} is training pairs: give it as "
                                                 "train.train_data beside a task such as stsb")


def read_study_data(tasks: list[tuple[Any, str | None]] | list[tuple[Any, str | None, str]],
                    data_dir: str | None) -> tuple[DataRecord, ...]:
    """Every (task, language[, key]) the study's cells train on, read in full and checked (one line per
    problem, naming the key under `task` or the given one, the file and the row), as the record keeps it; train/test
    pairs in common are a warning with their count for a declared data set (a built-in benchmark's
    own overlap, 7 pairs of STS-B, is only recorded: the report's provenance names it)."""
    from trainables.data.tasks import task_source

    records = []
    for task, language, *key in tasks:  # key: the study file's key that names it (default task)
        source = task_source(task, language, data_dir, *key)
        if source.overlap and not isinstance(task, str):  # a declared data set (a built-in benchmark's: recorded)
            log.warning("task %s: %d test pairs are also train pairs (same sentence1 and sentence2); scores on "
                        "test may be optimistic", source.name, source.overlap)
        records.append(DataRecord(name=source.name, language=source.language, kind=source.kind,
                                  origin=source.origin, overlap=source.overlap,
                                  splits={split: SplitRecord(rows=s.rows, sha256=s.sha256, source=str(s.origin),
                                                             uri=s.origin.uri, hub_split=s.origin.split,
                                                             hub_config=s.origin.config)
                                          for split, s in source.splits.items()}))
    return tuple(records)


class DataChangedError(UserInputError):
    """A study's data is not what it was launched with (exit code 2: restore it, or launch anew)."""

    problem = "changed since the study was launched"


def split_key(task: Any, split: str) -> str:
    """The study file's key that names a split of its task: task.files.train, task.hf.splits.dev, ..."""
    if not isinstance(task, DataDeclaration):
        return "task"
    return (f"task.files.{split}" if task.files is not None else f"task.hf.splits.{split}" if task.hf is not None
            else f"task.split_values.{split}")


def check_unchanged(launched: StudyRecord | None, now: tuple[DataRecord, ...], task: Any) -> None:
    """`resume` refuses a study whose data changed since launch: the first split whose rows' sha256
    differs (or that is gone) is named, with where it was read. Records from before data were kept
    have nothing to compare."""
    if launched is None or not launched.data:
        return
    current = {(d.name, d.language): d for d in now}
    for before in launched.data:
        after = current.get((before.name, before.language))
        if after is None:
            continue  # the edit check refuses a changed task; a data set no cell reads now changes nothing
        for split, old in before.splits.items():
            new = after.splits.get(split)
            if new is None or new.sha256 != old.sha256:
                now_is = "it is gone" if new is None else f"its rows' sha256 is {new.sha256[:12]}… now"
                raise DataChangedError(split_key(task, split), old.source or before.name,
                                       f"the {split} split of {before.name} had sha256 {old.sha256[:12]}… at launch "
                                       f"and {now_is}: restore the data it was launched with, or launch a new study "
                                       "under another name")
