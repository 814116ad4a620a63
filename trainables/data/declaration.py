"""A data set declared in the study file (`task:` as a mapping) — and the built-in tasks, which are
declarations of the same kind: where the rows are (one file per split, one file with a split column,
or a Hugging Face dataset), which columns hold the sentences and the target, what kind of task it is.

This module checks a declaration's shape without reading a byte of data and without pandas (the
study file's schema is built from it); `trainables.data.sources` reads what it declares and checks
the rows. Each problem is one `UserInputError` naming the key under `task`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainables.errors import UserInputError

SPLITS = ("train", "dev", "test")
TYPES = {"sts": "sts", "pair_classification": "classification", "unlabeled": "unlabeled", "pairs": "pairs",
         "triplets": "pairs", "nli": "nli"}  # -> task kind
TARGETS = {"sts": ("sentence1", "sentence2", "score"), "pair_classification": ("sentence1", "sentence2", "label"),
           "unlabeled": ("sentence",), "pairs": ("anchor", "positive"),
           "triplets": ("anchor", "positive", "negative"),
           "nli": ("sentence1", "sentence2", "label")}  # the columns each type gives, in this order
NEEDED = {"sts": SPLITS, "pair_classification": SPLITS, "unlabeled": ("train",), "pairs": ("train",),
          "triplets": ("train",), "nli": ("train",)}  # splits each type must have
NLI_CLASSES = ("entailment", "neutral", "contradiction")  # an nli data set's labels -> 0, 1, 2 (MNLI's order)
TEXT_COLUMNS = ("sentence1", "sentence2", "sentence", "anchor", "positive", "negative")
FORMATS = ("csv", "tsv", "jsonl", "parquet", "text")
SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
            ".pq": "parquet", ".txt": "text"}
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
TaskRef = str | dict[str, Any]  # a trial config's `task`: a built-in task's name, or a declaration as a mapping
TASK_HELP = "a built-in task (stsb, sick, mrpc, ...) or a data set of your own: a mapping with name, type and files"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HubSource(Section):
    """A Hugging Face dataset: a hub id (`datasets.load_dataset`, online or from the local cache), or
    a folder written by `Dataset(Dict).save_to_disk` (`datasets.load_from_disk`, offline) or holding
    data files (`datasets.load_dataset` on the folder)."""

    path: str = Field(description="hub id (mteb/stsbenchmark-sts) or a local folder, relative to the study file")
    config: str | None = Field(None, description="the dataset's configuration (subset), if it has several")
    revision: str | None = Field(None, description="a hub revision (branch, tag or commit) to pin")
    splits: dict[str, str] = Field({"train": "train", "dev": "validation", "test": "test"},
                                   description="train/dev/test -> the dataset's split names")


class DataDeclaration(Section):
    """`task:` as a mapping: a data set of your own."""

    name: str = Field(pattern=NAME_PATTERN, max_length=100, description="how reports and MLflow name it")
    type: Literal["sts", "pair_classification", "unlabeled", "pairs", "triplets", "nli"] = Field(
        description="sts (a similarity score per pair), pair_classification (two classes per pair), unlabeled "
                    "(sentences), pairs ((anchor, positive) without a score: training data for an in-batch "
                    "negatives loss such as mnrl, named by finetune's train_data) or triplets (anchor, positive, "
                    "negative: a hard negative beside each pair) or nli (a pair and its entailment, neutral or "
                    "contradiction judgment, in any case, or 0/1/2 in that order: training data for softmax_nli)")
    files: dict[str, str] | None = Field(None, description="train/dev/test -> a file, relative to the study file")
    file: str | None = Field(None, description="one file holding every split, told apart by split_column")
    split_column: str | None = Field(None, description="with file: the column that names each row's split")
    split_values: dict[str, str] | None = Field(None, description="with file: train/dev/test -> the value of "
                                                                  "split_column (default: the split's own name)")
    hf: HubSource | None = Field(None, description="a Hugging Face dataset instead of files")
    format: Literal["csv", "tsv", "jsonl", "parquet", "text"] | None = Field(
        None, description="the files' format (default: from each file's suffix: .csv, .tsv, .jsonl, .parquet, .txt)")
    columns: dict[str, str | int] = Field({}, description="sentence1/sentence2/score/label/sentence -> the column "
                                                          "that holds it (a name, or a 0-based position with "
                                                          "header: false); default: the same name")
    score_range: tuple[float, float] | None = Field(None, description="sts: the scores' [min, max], scaled to "
                                                                      "[0, 1] (STS-B: [0, 5])")
    positive_label: str | int | bool | None = Field(None, description="pair_classification: the label value of a "
                                                                      "matching pair, when the labels are not 0/1; "
                                                                      "with it, every other value is the other class "
                                                                      "(NLI's entailment against the rest)")
    where: dict[str, str | int | bool | list[str | int | bool]] | None = Field(
        None, description="keep only the rows whose column holds this value, or one of these values (compared as "
                          "text), before anything else is read: {entailment_judgment: ENTAILMENT}")
    header: bool = Field(True, description="csv/tsv: the first row names the columns")
    quoting: Literal["minimal", "none"] = Field("minimal", description="csv/tsv: minimal (\"...\" quotes a field) "
                                                                       "or none (quotes are text, as in STS-B)")
    encoding: str = Field("utf-8", description="csv/tsv/text: the files' encoding (utf-8-sig skips a BOM)")
    language: str = Field("en", description="the sentences' language, as reports name it")

    @property
    def kind(self) -> str:
        """The task kind the rest of the code reads: sts, classification or unlabeled."""
        return TYPES[self.type]

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits it declares, in train/dev/test order."""
        if self.files is not None:
            declared = set(self.files)
        elif self.hf is not None:
            declared = set(self.hf.splits)
        else:
            declared = set(self.split_values or NEEDED[self.type])
        return tuple(s for s in SPLITS if s in declared)

    def format_of(self, path: str) -> str:
        return self.format or SUFFIXES[Path(path).suffix.lower()]

    def describe(self) -> str:
        """Where the rows come from, in a few words (reports, MLflow)."""
        if self.hf is not None:
            return f"hf {self.hf.path}" + (f" ({self.hf.config})" if self.hf.config else "")
        if self.file is not None:
            return f"{self.file} split by {self.split_column}"
        return ", ".join(f"{split}: {path}" for split, path in (self.files or {}).items())


def _a(data_type: str) -> str:
    return f"an {data_type}" if data_type == "sts" else f"a {data_type}"


def _explain(error: dict, key: str) -> UserInputError:
    loc = [str(p) for p in error["loc"] if not str(p).startswith(("function-", "literal["))]
    where = ".".join([key, *loc])
    if error["type"] == "extra_forbidden":
        valid = list(HubSource.model_fields if loc[:1] == ["hf"] else DataDeclaration.model_fields)
        close = difflib.get_close_matches(loc[-1], valid, n=1)
        return UserInputError(where, error.get("input"), (f"unknown key; did you mean {close[0]}? " if close else
                                                          "unknown key; ") + f"valid keys here: {', '.join(valid)}")
    if error["type"] == "missing":
        return UserInputError(where, None, "this key is required")
    if error["type"] == "string_pattern_mismatch":
        return UserInputError(where, error.get("input"), "use letters, digits, '_', '.' or '-'")
    message = error["msg"].replace("Input should be", "use")
    return UserInputError(where, error.get("input"), message[0].lower() + message[1:])


def parse_declaration(raw: Any, key: str = "task") -> DataDeclaration:
    """A declaration checked for shape (keys, types, which source, which columns, which splits); the
    rows themselves are checked by `trainables.data.sources.check_declared`."""
    if isinstance(raw, DataDeclaration):
        return raw
    if not isinstance(raw, dict):
        raise UserInputError(key, raw, "a task is a name (stsb, sick, mrpc, ...) or a mapping with name, type and "
                                       "files (or file and split_column, or hf)")
    try:
        declared = DataDeclaration(**raw)
    except ValidationError as exc:
        raise _explain(exc.errors()[0], key) from None
    _check_source(declared, key)
    _check_targets(declared, key)
    return declared


def _check_source(d: DataDeclaration, key: str) -> None:
    given = [name for name in ("files", "file", "hf") if getattr(d, name) is not None]
    if len(given) != 1:
        raise UserInputError(key, d.name, "give one source: files (one file per split), file with split_column "
                                          f"(one file with every split) or hf (a Hugging Face dataset); it has "
                                          f"{', '.join(given) if given else 'none'}")
    if (d.file is None) != (d.split_column is None):
        missing = "split_column" if d.file is not None else "file"
        raise UserInputError(f"{key}.{missing}", None, "file and split_column go together: one file whose "
                                                       "split_column names each row's split (train, dev, test)")
    if d.split_values is not None and d.file is None:
        raise UserInputError(f"{key}.split_values", d.split_values, "it belongs with file and split_column")
    mappings = {"files": d.files, "hf.splits": d.hf.splits if d.hf else None, "split_values": d.split_values}
    for name, mapping in mappings.items():
        for split, value in (mapping or {}).items():
            if split not in SPLITS:
                raise UserInputError(f"{key}.{name}.{split}", value, "splits are train, dev and test")
    missing = [s for s in NEEDED[d.type] if s not in d.splits]
    if missing:
        where = "files" if d.files is not None else "hf.splits" if d.hf is not None else "split_values"
        raise UserInputError(f"{key}.{where}.{missing[0]}", None, f"{_a(d.type)} data set needs the splits "
                                                                  f"{', '.join(NEEDED[d.type])}")
    for split, path in (d.files or {}).items() if d.format is None else ():
        if Path(path).suffix.lower() not in SUFFIXES:
            raise UserInputError(f"{key}.files.{split}", path, "use a .csv, .tsv, .jsonl, .parquet or .txt file, "
                                                               "or say which with task.format")
    if d.file is not None and d.format is None and Path(d.file).suffix.lower() not in SUFFIXES:
        raise UserInputError(f"{key}.file", d.file, "use a .csv, .tsv, .jsonl, .parquet or .txt file, or say which "
                                                    "with task.format")
    text = [p for p in ([*(d.files or {}).values(), d.file] if d.hf is None else []) if p and d.format_of(p) == "text"]
    if text and d.type != "unlabeled":
        raise UserInputError(f"{key}.type", d.type, f"{text[0]} is a text file (one sentence a line): only an "
                                                    "unlabeled data set reads one")


def _check_targets(d: DataDeclaration, key: str) -> None:
    for target in d.columns:
        if target not in TARGETS[d.type]:
            raise UserInputError(f"{key}.columns.{target}", d.columns[target],
                                 f"{_a(d.type)} data set maps the columns {', '.join(TARGETS[d.type])}")
    if d.type == "sts":
        if d.score_range is None:
            raise UserInputError(f"{key}.score_range", None, "an sts data set needs its scores' [min, max], e.g. "
                                                             "[0, 5] as STS-B: scores are scaled to [0, 1]")
        low, high = d.score_range
        if not low < high:
            raise UserInputError(f"{key}.score_range", list(d.score_range), "give [min, max] with min < max")
    elif d.score_range is not None:
        raise UserInputError(f"{key}.score_range", list(d.score_range), f"only an sts data set has scores; "
                                                                        f"{_a(d.type)} one has none")
    if d.positive_label is not None and d.type != "pair_classification":
        raise UserInputError(f"{key}.positive_label", d.positive_label, "only a pair_classification data set has "
                                                                        "labels")
    by_position = all(isinstance(c, int) for c in d.columns.values()) and len(d.columns) == len(TARGETS[d.type])
    if not d.header and d.hf is None and not by_position:
        raise UserInputError(f"{key}.columns", dict(d.columns), "with header: false, give every column as a 0-based "
                                                                 "position: " + ", ".join(TARGETS[d.type]))


def resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """The declaration with its file paths made absolute against `base` (the study file's folder), and
    an `hf.path` that names a folder there made absolute too (anything else stays a hub id)."""
    out = dict(raw)
    if isinstance(out.get("files"), dict):
        out["files"] = {split: _absolute(path, base) for split, path in out["files"].items()}
    if isinstance(out.get("file"), str):
        out["file"] = _absolute(out["file"], base)
    hf = out.get("hf")
    if isinstance(hf, dict) and isinstance(hf.get("path"), str):
        folder = Path(hf["path"]).expanduser()
        folder = folder if folder.is_absolute() else base / folder
        if folder.is_dir():
            out["hf"] = {**hf, "path": str(folder.resolve())}
    return out


def _absolute(path: Any, base: Path) -> Any:
    if not isinstance(path, str):
        return path
    candidate = Path(path).expanduser()
    return str((candidate if candidate.is_absolute() else base / candidate).resolve())
