"""Task registry: every data set as train/dev/test DataFrames with the same columns.

STS tasks give `sentence1`, `sentence2`, `score` (scaled to [0, 1]); pair classification gives
`sentence1`, `sentence2`, `label`; unlabeled corpora give `sentence` (train only). Sources, in
order: the local data folder (the layout of `shared/data`), then the Hugging Face hub.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainables.errors import DataNotFoundError, UserInputError, one_of

DATA_DIR_ENV = "ORCHESTRATOR_DATA_DIR"
SPLITS = ("train", "dev", "test")
STSB_LANGUAGES = ("de", "en", "es", "fr", "it", "ja", "nl", "pl", "pt", "ru", "zh")
SAMPLE_SEED = 0  # caps select the same rows in every trial, whatever the trial's seed


@dataclass(frozen=True)
class TaskData:
    """One task's splits; `dev` and `test` are None for unlabeled corpora."""

    name: str
    kind: str  # "sts" | "classification" | "unlabeled"
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
    name: str
    kind: str
    read_local: Callable[[Path, str], dict[str, pd.DataFrame]]
    local_files: Callable[[str], list[str]]  # relative paths, for the "put files here" message
    read_hub: Callable[[str], dict[str, pd.DataFrame]] | None = None
    languages: tuple[str, ...] = ("en",)
    hub_id: str | None = None
    eval_only: bool = False  # a test split only (the SentEval STS years): scored, never trained on


# --- local readers -------------------------------------------------------------------------


def _read_rows(path: Path, delimiter: str = "\t", quoting: int = csv.QUOTE_NONE,
               header: bool = False, encoding: str = "utf-8") -> list[list[str]]:
    with open(path, encoding=encoding, newline="") as f:
        rows = [[c.strip("\r") for c in r] for r in csv.reader(f, delimiter=delimiter, quoting=quoting)]
    rows = [r for r in rows if r]
    return rows[1:] if header else rows


def _sts_frame(rows: list[tuple[str, str, str]], max_score: float, min_score: float = 0.0) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["sentence1", "sentence2", "score"])
    frame["score"] = (frame["score"].astype(float) - min_score) / (max_score - min_score)
    return frame


def _stsb_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    out = {}
    for split in SPLITS:
        rows = _read_rows(root / "stsb" / f"sts-{split}.csv")
        out[split] = _sts_frame([(r[5], r[6], r[4]) for r in rows], max_score=5.0)
    return out


def _stsb_multi_mt_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    out = {}
    for split in SPLITS:
        rows = _read_rows(root / "stsb-multi-mt" / f"stsb-{language}-{split}.csv",
                          delimiter=",", quoting=csv.QUOTE_MINIMAL)
        out[split] = _sts_frame([(r[0], r[1], r[2]) for r in rows], max_score=5.0)
    return out


def _korsts_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    out = {}
    for split in SPLITS:
        rows = _read_rows(root / "korsts" / f"sts-{split}.tsv", header=True)
        out[split] = _sts_frame([(r[5], r[6], r[4]) for r in rows], max_score=5.0)
    return out


_SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
_SICK_SETS = {"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}


def _sick_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    """SemEval-2014 Task 1 files (4500/500/4927), the split SentEval and SimCSE report."""
    out = {}
    for split, name in _SICK_FILES.items():
        rows = _read_rows(root / "sick" / "semeval2014" / name, header=True)
        out[split] = _sts_frame([(r[1], r[2], r[3]) for r in rows], max_score=5.0, min_score=1.0)
    return out


def _sick_full_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    """The full SICK release split by its `SemEval_set` column (4439/495/4906)."""
    rows = _read_rows(root / "sick" / "SICK.txt", header=True)
    return {
        split: _sts_frame([(r[1], r[2], r[4]) for r in rows if r[11] == tag], max_score=5.0, min_score=1.0)
        for split, tag in _SICK_SETS.items()
    }


def _mrpc_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    """GLUE's MRPC split (3668/408/1725) with test labels kept."""
    out = {}
    for split in SPLITS:
        rows = _read_rows(root / "mrpc" / "glue" / f"{split}.tsv", header=True, encoding="utf-8-sig")
        out[split] = pd.DataFrame({"sentence1": [r[3] for r in rows], "sentence2": [r[4] for r in rows],
                                   "label": [int(r[0]) for r in rows]})
    return out


def _unlabeled_en_local(root: Path, language: str) -> dict[str, pd.DataFrame]:
    folder = root / "unlabeled-en"
    files = sorted(folder.glob("wiki1m_for_simcse*.txt"))
    if not files:
        raise FileNotFoundError(folder / "wiki1m_for_simcse.txt")
    lines = [line.strip() for line in files[0].read_text(encoding="utf-8").splitlines()]
    return {"train": pd.DataFrame({"sentence": [s for s in lines if s]})}


SENTEVAL_YEARS = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16"}


def _senteval_subsets(folder: Path) -> list[str]:
    return sorted(p.name.removeprefix("STS.input.").removesuffix(".txt") for p in folder.glob("STS.input.*.txt"))


def _senteval_local(year: str) -> Callable[[Path, str], dict[str, pd.DataFrame]]:
    """A SemEval STS year in SentEval's layout: every subset's pairs with a gold score (0-5; an
    empty gold line is an unscored pair and is dropped, as SentEval does), with a `subset` column."""

    def read(root: Path, language: str) -> dict[str, pd.DataFrame]:
        folder = root / "sts12-16" / f"{year}-en-test"
        subsets = _senteval_subsets(folder)
        if not subsets:
            raise FileNotFoundError(folder)
        frames = []
        for subset in subsets:
            pairs = (folder / f"STS.input.{subset}.txt").read_text(encoding="utf-8").split("\n")
            gold = (folder / f"STS.gs.{subset}.txt").read_text(encoding="utf-8").split("\n")
            rows = [(*pair.split("\t")[:2], score) for pair, score in zip(pairs, gold, strict=False)
                    if score.strip()]
            frame = _sts_frame([(a.strip(), b.strip(), s) for a, b, s in rows], max_score=5.0)
            frames.append(frame.assign(subset=subset))
        return {"test": pd.concat(frames, ignore_index=True)}

    return read


# --- hub readers (used only when the data folder lacks the files) --------------------------


def _hub(dataset_id: str, config: str | None, splits: dict[str, str],
         columns: dict[str, str], max_score: float | None) -> dict[str, pd.DataFrame]:
    from datasets import load_dataset

    out = {}
    for split, hub_split in splits.items():
        frame = load_dataset(dataset_id, config, split=hub_split).to_pandas()
        frame = frame.rename(columns=columns)[list(columns.values())]
        if max_score is not None:
            frame["score"] = frame["score"].astype(float) / max_score
        out[split] = frame
    return out


def _stsb_hub(language: str) -> dict[str, pd.DataFrame]:
    return _hub("sentence-transformers/stsb", None, {"train": "train", "dev": "validation", "test": "test"},
                {"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"}, max_score=None)


def _stsb_multi_mt_hub(language: str) -> dict[str, pd.DataFrame]:
    return _hub("PhilipMay/stsb_multi_mt", language, {s: s for s in SPLITS},
                {"sentence1": "sentence1", "sentence2": "sentence2", "similarity_score": "score"}, max_score=5.0)


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec("stsb", "sts", _stsb_local, lambda lang: [f"stsb/sts-{s}.csv" for s in SPLITS],
                 read_hub=_stsb_hub, hub_id="sentence-transformers/stsb"),
        TaskSpec("stsb_multi_mt", "sts", _stsb_multi_mt_local,
                 lambda lang: [f"stsb-multi-mt/stsb-{lang}-{s}.csv" for s in SPLITS],
                 read_hub=_stsb_multi_mt_hub, languages=STSB_LANGUAGES, hub_id="PhilipMay/stsb_multi_mt"),
        TaskSpec("korsts", "sts", _korsts_local, lambda lang: [f"korsts/sts-{s}.tsv" for s in SPLITS],
                 languages=("ko",)),
        TaskSpec("sick", "sts", _sick_local,
                 lambda lang: [f"sick/semeval2014/{f}" for f in _SICK_FILES.values()]),
        TaskSpec("sick_full", "sts", _sick_full_local, lambda lang: ["sick/SICK.txt"]),
        TaskSpec("mrpc", "classification", _mrpc_local, lambda lang: [f"mrpc/glue/{s}.tsv" for s in SPLITS]),
        *[TaskSpec(name, "sts", _senteval_local(year),
                   lambda lang, year=year: [f"sts12-16/{year}-en-test/STS.input.<subset>.txt and STS.gs.<subset>.txt"],
                   eval_only=True) for name, year in SENTEVAL_YEARS.items()],
        TaskSpec("unlabeled_en", "unlabeled", _unlabeled_en_local,
                 lambda lang: ["unlabeled-en/wiki1m_for_simcse.txt"]),
    ]
}


def task_spec(name: str) -> TaskSpec:
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


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The data folder: the explicit argument, else $ORCHESTRATOR_DATA_DIR, else none."""
    value = explicit if explicit is not None else os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser() if value else None


def _cap(frame: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    """A fixed random subset (same rows for every trial), in the original order."""
    if limit is None or limit >= len(frame):
        return frame.reset_index(drop=True)
    if limit < 1:
        raise UserInputError("data.max_samples", limit, "use a positive number of rows, or null for all")
    return frame.sample(n=limit, random_state=SAMPLE_SEED).sort_index().reset_index(drop=True)


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or \
        os.environ.get("HF_DATASETS_OFFLINE", "0").lower() in ("1", "true", "yes")


def load_task(name: str, language: str | None = None, data_folder: str | os.PathLike | None = None,
              max_train_samples: int | None = None, max_eval_samples: int | None = None) -> TaskData:
    """Load a task's splits from the data folder, else from the hub; a clear error when neither has it."""
    spec = task_spec(name)
    lang = resolve_language(spec, language)
    root = data_dir(data_folder)
    frames = None
    if root is not None:
        try:
            frames = spec.read_local(root, lang)
        except FileNotFoundError:
            frames = None
    if frames is None:
        frames = _load_from_hub(spec, lang, root)
    if "train" not in frames:  # an evaluation-only set: an empty train split with its columns
        frames["train"] = frames["test"].iloc[:0]
    return TaskData(
        name=name, kind=spec.kind, language=lang,
        train=_cap(frames["train"], max_train_samples),
        dev=_cap(frames["dev"], max_eval_samples) if "dev" in frames else None,
        test=_cap(frames["test"], max_eval_samples) if "test" in frames else None,
    )


def _load_from_hub(spec: TaskSpec, language: str, root: Path | None) -> dict[str, pd.DataFrame]:
    where = f"the data folder {root}" if root else f"a data folder (--data-dir or ${DATA_DIR_ENV})"
    files = ", ".join(spec.local_files(language))
    missing = DataNotFoundError("task", spec.name, f"put {files} under {where}"
                                + (f", or go online for the hub copy {spec.hub_id}" if spec.hub_id else ""))
    if spec.read_hub is None or _hub_offline():
        raise missing
    try:
        return spec.read_hub(language)
    except Exception as exc:  # network, auth or schema failure: the local layout is the fix
        raise missing from exc


TASK_SOURCES = ("task", "task+dev", "task+test")  # a task's own splits as an unlabeled source


def task_splits(source: str, task: str, language: str | None, data_folder: str | os.PathLike | None,
                transductive: bool, key: str, what: str) -> list[pd.DataFrame]:
    """The task's splits a `task`, `task+dev` or `task+test` source names (test only when transductive)."""
    if source == "task+test" and not transductive:
        raise UserInputError(key, source, f"test {what} train only with transductive: true")
    data = load_task(task, language, data_folder)
    return [data.train] + ([data.dev] if source != "task" else []) + ([data.test] if source == "task+test" else [])


def corpus_sentences(source: str, task: str, language: str | None, data_folder: str | os.PathLike | None,
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


def load_sts_task(name: str, language: str | None, data_folder: str | os.PathLike | None, who: str,
                  max_train_samples: int | None = None, max_eval_samples: int | None = None) -> TaskData:
    """An STS task with a dev split (what selects epochs, steps, cycles and trials for `who`)."""
    data = load_task(name, language, data_folder, max_train_samples, max_eval_samples)
    if data.kind != "sts" or data.dev is None:
        raise UserInputError("task", name, f"{who} selects on an STS dev split: use stsb, sick, korsts, "
                                           "stsb_multi_mt or sick_full")
    return data


def unlabeled_pairs(source: str, task: str, language: str | None, data_dir: str | None, transductive: bool,
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
