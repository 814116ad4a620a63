"""Task registry: every data set as train/dev/test DataFrames with the same columns.

STS tasks give `sentence1`, `sentence2`, `score` (scaled to [0, 1]); pair classification gives
`sentence1`, `sentence2`, `label`; unlabeled corpora give `sentence` (train only); pairs give `anchor`,
`positive` and, as triplets, `negative` (train only: training data for in-batch-negative losses). A task is a
built-in name — a declaration of its files in the data folder (the layout of `shared/data`) and,
for some, of a hub copy read when the folder lacks them — or a study's own declaration
(`trainables.data.declaration`); both are read by `trainables.data.sources`. The data folder is the
one given, else `$ORCHESTRATOR_DATA_DIR`, else `../shared/data` beside the checkout; the hub is asked
only when it is reachable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainables.data.declaration import DataDeclaration, HubSource, parse_declaration
from trainables.data.sources import SENTEVAL, DeclaredData, Origin, read_declared, split_sha256
from trainables.errors import DataNotFoundError, UserInputError, one_of
from trainables.hub import hub_reachable

DATA_DIR_ENV = "ORCHESTRATOR_DATA_DIR"
SPLITS = ("train", "dev", "test")
STSB_LANGUAGES = ("de", "en", "es", "fr", "it", "ja", "nl", "pl", "pt", "ru", "zh")
SAMPLE_SEED = 0  # caps select the same rows in every trial, whatever the trial's seed


@dataclass(frozen=True)
class TaskData:
    """One task's splits; `dev` and `test` are None for unlabeled corpora."""

    name: str
    kind: str  # "sts" | "classification" | "unlabeled" | "pairs"
    language: str
    train: pd.DataFrame
    dev: pd.DataFrame | None = None
    test: pd.DataFrame | None = None

    def split(self, name: str) -> pd.DataFrame:
        if name not in SPLITS or getattr(self, name) is None:
            valid = [s for s in SPLITS if getattr(self, s) is not None]
            raise one_of("split", name, valid)
        return getattr(self, name)


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task: where the data folder holds it and, for some, the hub copy — both declarations
    of the kind a study file may write (`trainables.data.declaration`), read by the same code."""

    name: str
    kind: str
    local: Callable[[str], DataDeclaration]  # language -> its files, relative to the data folder
    hub: Callable[[str], DataDeclaration] | None = None  # language -> the hub copy
    languages: tuple[str, ...] = ("en",)
    eval_only: bool = False  # a test split only (the SentEval STS years): scored, never trained on
    layout: str | None = None  # the files to put in the data folder, when they are not the declaration's own

    def local_files(self, language: str) -> list[str]:
        """Relative paths, for the "put files here" message."""
        if self.layout:
            return [self.layout]
        declared = self.local(language)
        return list(declared.files.values()) if declared.files else [declared.file]

    @property
    def hub_id(self) -> str | None:
        return self.hub(self.languages[0]).hf.path if self.hub else None


def _sts_files(name: str, pattern: str, fmt: str, columns: dict, score_range=(0.0, 5.0), **options):
    """A built-in STS task with one file per split (`pattern` holds {split} and {language})."""
    return lambda language: DataDeclaration(
        name=name, type="sts", files={s: pattern.format(split=s, language=language) for s in SPLITS}, format=fmt,
        columns=columns, score_range=score_range, language=language, **options)


_SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
_SICK_COLUMNS = {"sentence1": "sentence_A", "sentence2": "sentence_B", "score": "relatedness_score"}
SENTEVAL_YEARS = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16"}


def _senteval(name: str, year: str) -> Callable[[str], DataDeclaration]:
    """A SemEval STS year in SentEval's layout (a test split of every subset): declared like the rest,
    read by the same code, in a format only the built-ins use (no train or dev split to declare)."""
    return lambda language: DataDeclaration.model_construct(
        name=name, type="sts", files={"test": f"sts12-16/{year}-en-test"}, format=SENTEVAL, columns={},
        score_range=(0.0, 5.0), header=True, quoting="minimal", encoding="utf-8", language="en", hf=None, file=None)


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec("stsb", "sts", _sts_files("stsb", "stsb/sts-{split}.csv", "tsv", {"sentence1": 5, "sentence2": 6,
                                                                                   "score": 4},
                                           header=False, quoting="none"),
                 hub=lambda language: DataDeclaration(name="stsb", type="sts", score_range=(0.0, 1.0),
                                                      hf=HubSource(path="sentence-transformers/stsb"))),
        TaskSpec("stsb_multi_mt", "sts",
                 _sts_files("stsb_multi_mt", "stsb-multi-mt/stsb-{language}-{split}.csv", "csv",
                            {"sentence1": 0, "sentence2": 1, "score": 2}, header=False),
                 hub=lambda language: DataDeclaration(
                     name="stsb_multi_mt", type="sts", score_range=(0.0, 5.0), language=language,
                     columns={"score": "similarity_score"},
                     hf=HubSource(path="PhilipMay/stsb_multi_mt", config=language, splits={s: s for s in SPLITS})),
                 languages=STSB_LANGUAGES),
        TaskSpec("korsts", "sts", _sts_files("korsts", "korsts/sts-{split}.tsv", "tsv", {}, quoting="none"),
                 languages=("ko",)),
        TaskSpec("sick", "sts", lambda language: DataDeclaration(  # SemEval-2014 Task 1's files (4500/500/4927)
            name="sick", type="sts", files={s: f"sick/semeval2014/{f}" for s, f in _SICK_FILES.items()},
            format="tsv", quoting="none", columns=_SICK_COLUMNS, score_range=(1.0, 5.0))),
        TaskSpec("sick_full", "sts", lambda language: DataDeclaration(  # the release by SemEval_set (4439/495/4906)
            name="sick_full", type="sts", file="sick/SICK.txt", split_column="SemEval_set",
            split_values={"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}, format="tsv", quoting="none",
            columns=_SICK_COLUMNS, score_range=(1.0, 5.0))),
        TaskSpec("sick_nli", "pairs", lambda language: DataDeclaration(  # SICK train's 1299 entailment pairs
            name="sick_nli", type="pairs", files={"train": "sick/semeval2014/SICK_train.txt"}, format="tsv",
            quoting="none", columns={"anchor": "sentence_A", "positive": "sentence_B"},
            where={"entailment_judgment": "ENTAILMENT"}), layout="sick/semeval2014/SICK_train.txt"),
        TaskSpec("sick_nli3", "nli", lambda language: DataDeclaration(  # SICK train's 4500 pairs, 3 judgments
            name="sick_nli3", type="nli", files={"train": "sick/semeval2014/SICK_train.txt"}, format="tsv",
            quoting="none", columns={"sentence1": "sentence_A", "sentence2": "sentence_B",
                                     "label": "entailment_judgment"}), layout="sick/semeval2014/SICK_train.txt"),
        TaskSpec("mrpc", "classification", lambda language: DataDeclaration(  # GLUE's split (3668/408/1725)
            name="mrpc", type="pair_classification", files={s: f"mrpc/glue/{s}.tsv" for s in SPLITS}, format="tsv",
            quoting="none", encoding="utf-8-sig",
            columns={"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"})),
        *[TaskSpec(name, "sts", _senteval(name, year), eval_only=True,
                   layout=f"sts12-16/{year}-en-test/STS.input.<subset>.txt and STS.gs.<subset>.txt")
          for name, year in SENTEVAL_YEARS.items()],
        TaskSpec("unlabeled_en", "unlabeled", lambda language: DataDeclaration(
            name="unlabeled_en", type="unlabeled", files={"train": "unlabeled-en/wiki1m_for_simcse*.txt"},
            format="text"), layout="unlabeled-en/wiki1m_for_simcse.txt"),
    ]
}


def task_spec(name: str) -> TaskSpec:
    """A built-in task's entry (a declared one has no entry: `task_kind` and `load_task` read either)."""
    if name not in TASKS:
        raise one_of("task", name, TASKS)
    return TASKS[name]


def resolve_language(spec: TaskSpec, language: str | None) -> str:
    """The task's language; tasks with one language accept only that one (or none)."""
    if language is None:
        if len(spec.languages) > 1:
            raise UserInputError("language", None, f"task {spec.name} needs a language, one of: "
                                 + ", ".join(spec.languages))
        return spec.languages[0]
    if language not in spec.languages:
        hint = " (Korean STS-B is the task korsts)" if language == "ko" else ""
        raise UserInputError("language", language, f"task {spec.name} has the languages: "
                             + ", ".join(spec.languages) + hint)
    return language


def default_data_dir() -> Path | None:
    """`../shared/data` beside the checkout this code runs from, when it exists (a source checkout or an
    editable install; an installed package has no checkout, and reads the hub)."""
    checkout = Path(__file__).resolve().parents[2]  # trainables/data/tasks.py -> the checkout
    folder = checkout.parent / "shared" / "data"
    return folder if (checkout / "pyproject.toml").is_file() and folder.is_dir() else None


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The data folder: the explicit argument, else $ORCHESTRATOR_DATA_DIR, else `../shared/data` beside
    the checkout when it exists, else none (the hub)."""
    value = explicit if explicit is not None else os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser() if value else default_data_dir()


def _cap(frame: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    """A fixed random subset (same rows for every trial), in the original order."""
    if limit is None or limit >= len(frame):
        return frame.reset_index(drop=True)
    if limit < 1:
        raise UserInputError("data.max_samples", limit, "use a positive number of rows, or null for all")
    return frame.sample(n=limit, random_state=SAMPLE_SEED).sort_index().reset_index(drop=True)


TaskRef = str | dict | DataDeclaration  # a built-in task's name, or a declaration (a study's `task:` mapping)


def task_name(task: TaskRef) -> str:
    """How reports and messages name a task: its registry name, or its declaration's `name`."""
    if isinstance(task, str):
        return task
    return task.name if isinstance(task, DataDeclaration) else str(task.get("name", "task"))


def task_kind(task: TaskRef) -> str:
    """sts, classification or unlabeled, read from the registry or the declaration (no data read)."""
    return task_spec(task).kind if isinstance(task, str) else parse_declaration(task).kind


def task_languages(task: TaskRef) -> tuple[str, ...]:
    return task_spec(task).languages if isinstance(task, str) else (parse_declaration(task).language,)


@dataclass(frozen=True)
class SplitSource:
    """One split as read: its rows, where they came from and the sha256 of its rows."""

    rows: int
    sha256: str
    origin: Origin


@dataclass(frozen=True)
class TaskSource:
    """What a study's data is, as its record keeps it: each split's rows, origin and sha256."""

    name: str
    language: str
    kind: str
    origin: str  # the declaration's files or hub id, or the data folder a built-in task was read from
    splits: dict[str, SplitSource]
    overlap: int = 0  # distinct test pairs also in train


@dataclass(frozen=True)
class _Read:
    name: str
    kind: str
    language: str
    origin: str
    data: DeclaredData


def _read_task(task: TaskRef, language: str | None, data_folder: str | os.PathLike | None,
               key: str = "task") -> _Read:
    """A built-in task from the data folder, else the hub; a declaration from what it names."""
    if not isinstance(task, str):
        declared = parse_declaration(task, key)
        if language is not None and language != declared.language:
            raise UserInputError("language", language, f"task {declared.name} is in {declared.language}: set "
                                                        "task.language instead")
        return _Read(declared.name, declared.kind, declared.language, declared.describe(),
                     read_declared(declared, key=key))
    spec = task_spec(task)
    lang = resolve_language(spec, language)
    root = data_dir(data_folder)
    if root is not None:
        try:
            return _Read(spec.name, spec.kind, lang, f"data folder {root}",
                         read_declared(spec.local(lang), root, builtin=True))
        except FileNotFoundError:
            pass
    return _Read(spec.name, spec.kind, lang, f"hub {spec.hub_id}", _load_from_hub(spec, lang, root))


def load_task(task: TaskRef, language: str | None = None, data_folder: str | os.PathLike | None = None,
              max_train_samples: int | None = None, max_eval_samples: int | None = None) -> TaskData:
    """A task's splits: a built-in task's from the data folder, else from the hub (a clear error when
    neither has it); a declared data set's from its files or its Hugging Face dataset."""
    read = _read_task(task, language, data_folder)
    frames = dict(read.data.frames)
    if "train" not in frames:  # an evaluation-only set: an empty train split with its columns
        frames["train"] = frames["test"].iloc[:0]
    return TaskData(
        name=read.name, kind=read.kind, language=read.language,
        train=_cap(frames["train"], max_train_samples),
        dev=_cap(frames["dev"], max_eval_samples) if "dev" in frames else None,
        test=_cap(frames["test"], max_eval_samples) if "test" in frames else None,
    )


def task_source(task: TaskRef, language: str | None = None, data_folder: str | os.PathLike | None = None,
                key: str = "task") -> TaskSource:
    """The task's data read in full and checked, with each split's sha256 (what `validate` runs and
    the study record keeps, so that `resume` can refuse data that changed)."""
    read = _read_task(task, language, data_folder, key)
    splits = {split: SplitSource(len(frame), split_sha256(frame), read.data.sources[split])
              for split, frame in read.data.frames.items()}
    return TaskSource(read.name, read.language, read.kind, read.origin, splits, read.data.overlap)


def _load_from_hub(spec: TaskSpec, language: str, root: Path | None) -> DeclaredData:
    """The hub's copy, asked only when the hub is reachable (else the one-line error at once)."""
    where = f"the data folder {root}" if root else f"a data folder (--data-dir or ${DATA_DIR_ENV})"
    files = ", ".join(spec.local_files(language))
    missing = DataNotFoundError("task", spec.name, f"put {files} under {where}"
                                + (f", or go online: the hub copy {spec.hub_id} cannot be reached from here"
                                   if spec.hub_id else ""))
    if spec.hub is None or not hub_reachable():
        raise missing
    try:
        return read_declared(spec.hub(language))
    except Exception as exc:  # network, auth or schema failure: the local layout is the fix
        raise missing from exc


TASK_SOURCES = ("task", "task+dev", "task+test")  # a task's own splits as an unlabeled source


def task_splits(source: str, task: TaskRef, language: str | None, data_folder: str | os.PathLike | None,
                transductive: bool, key: str, what: str) -> list[pd.DataFrame]:
    """The task's splits a `task`, `task+dev` or `task+test` source names (test only when transductive)."""
    if source == "task+test" and not transductive:
        raise UserInputError(key, source, f"test {what} train only with transductive: true")
    data = load_task(task, language, data_folder)
    return [data.train] + ([data.dev] if source != "task" else []) + ([data.test] if source == "task+test" else [])


def corpus_sentences(source: str, task: TaskRef, language: str | None, data_folder: str | os.PathLike | None,
                     transductive: bool, key: str = "corpus") -> list[str]:
    """Distinct non-empty sentences of an unlabeled corpus: `unlabeled_en`, `task` (the task's train
    sentences), `task+dev`, `task+test` (only with `transductive`) or a text file, one sentence a line."""
    if source == "unlabeled_en":
        sentences = list(load_task("unlabeled_en", data_folder=data_folder).train["sentence"])
    elif source in TASK_SOURCES:
        frames = task_splits(source, task, language, data_folder, transductive, key, "sentences")
        sentences = [s for f in frames for column in ("sentence1", "sentence2") for s in f[column]]
    elif Path(source).expanduser().is_file():
        sentences = Path(source).expanduser().read_text(encoding="utf-8").splitlines()
    else:
        raise UserInputError(key, source, "use unlabeled_en, task, task+dev, task+test (transductive) "
                                          "or the path of a text file")
    return list(dict.fromkeys(s.strip() for s in sentences if s.strip()))


def load_sts_task(task: TaskRef, language: str | None, data_folder: str | os.PathLike | None, who: str,
                  max_train_samples: int | None = None, max_eval_samples: int | None = None) -> TaskData:
    """An STS task with a dev split (what selects epochs, steps, cycles and trials for `who`)."""
    data = load_task(task, language, data_folder, max_train_samples, max_eval_samples)
    if data.kind != "sts" or data.dev is None:
        raise UserInputError("task", data.name, f"{who} selects on an STS dev split: use stsb, sick, korsts, "
                                                "stsb_multi_mt, sick_full or an sts data set of your own")
    return data


def unlabeled_pairs(source: str, task: TaskRef, language: str | None, data_dir: str | None, transductive: bool,
                    max_samples: int | None = None, key: str = "pairs") -> pd.DataFrame:
    """Distinct (sentence1, sentence2) pairs without labels: the task's train pairs (`task`), with
    dev (`task+dev`) or test (`task+test`, transductive only), or a TSV file of two sentence
    columns; at most `max_samples`, the same rows in every trial."""
    if source in TASK_SOURCES:
        frames = task_splits(source, task, language, data_dir, transductive, key, "pairs")
        frame = pd.concat([f[["sentence1", "sentence2"]] for f in frames], ignore_index=True)
    elif Path(source).expanduser().is_file():
        frame = pd.read_csv(Path(source).expanduser(), sep="\t", header=None, quoting=3, usecols=[0, 1],
                            names=["sentence1", "sentence2"], dtype=str, keep_default_na=False)
    else:
        raise UserInputError(key, source, "use task, task+dev, task+test (transductive) or the path of a TSV "
                                          "file with two sentence columns")
    frame = frame[(frame.sentence1.str.strip() != "") & (frame.sentence2.str.strip() != "")]
    frame = frame.drop_duplicates().reset_index(drop=True)
    if max_samples is not None and max_samples < len(frame):
        frame = frame.sample(n=max_samples, random_state=SAMPLE_SEED).sort_index().reset_index(drop=True)
    if len(frame) < 2:
        raise UserInputError(key, source, "fewer than 2 pairs")
    return frame
