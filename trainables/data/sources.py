"""Reading what a data declaration names into train/dev/test DataFrames of the standard columns
(`sentence1`, `sentence2`, `score` in [0, 1] or `label` 0/1; `sentence`), checking every row on the
way, and a sha256 of each split's rows. Files are read with pandas (CSV, TSV, Parquet through
pyarrow) or line by line (JSONL, text, so a damaged line is named); Hugging Face datasets through
`datasets.load_from_disk` (a saved folder) or `datasets.load_dataset` (a hub id or a folder of
files). Each problem is one `UserInputError` naming the key under `task`, the file and the row."""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from trainables.data.declaration import NLI_CLASSES, SPLITS, TARGETS, TEXT_COLUMNS, DataDeclaration
from trainables.errors import UserInputError

SENTEVAL = "senteval"  # the built-in STS12-16 layout: STS.input.<subset>.txt and STS.gs.<subset>.txt per folder
SHOWN_COLUMNS = 12


@dataclass(frozen=True)
class Origin:
    """Where a split's rows were read: a file (with the split column's value when one file holds every
    split) or a Hugging Face dataset's split."""

    uri: str  # a file's path, or a hub id or dataset folder
    split: str | None = None  # the hub dataset's split
    config: str | None = None  # the hub dataset's configuration
    column: str | None = None  # `split_column = value`, when one file holds every split

    @property
    def hub(self) -> bool:
        return self.split is not None

    def __str__(self) -> str:
        if self.hub:
            return f"{self.uri}" + (f" ({self.config})" if self.config else "") + f" [{self.split}]"
        return self.uri + (f" ({self.column})" if self.column else "")


@dataclass(frozen=True)
class DeclaredData:
    """A declaration's splits, read and checked: standard columns, scores scaled, labels 0/1."""

    frames: dict[str, pd.DataFrame]
    sources: dict[str, Origin]  # split -> where its rows came from
    overlap: int = 0  # distinct test pairs that are also train pairs (a warning, not an error)
    notes: list[str] = field(default_factory=list)


def read_declared(d: DataDeclaration, root: Path | None = None, key: str = "task",
                  builtin: bool = False) -> DeclaredData:
    """Every split `d` declares, read (relative file paths against `root`) and checked; a built-in
    task's missing file raises FileNotFoundError (the caller turns to the hub or names the layout)."""
    raw, sources, keys = _raw_splits(d, root, key, builtin)
    frames = {split: _standard(d, frame, split, str(sources[split]), keys[split], key) for split, frame in raw.items()}
    if d.type == "pair_classification":
        _binary_labels(d, frames, key)
    if d.type == "nli":
        _nli_labels(d, frames, key)
    overlap = 0
    if "train" in frames and "test" in frames and d.type in ("sts", "pair_classification"):
        train = set(zip(frames["train"].sentence1, frames["train"].sentence2, strict=True))
        overlap = len(set(zip(frames["test"].sentence1, frames["test"].sentence2, strict=True)) & train)
    return DeclaredData(frames, sources, overlap)


def split_sha256(frame: pd.DataFrame) -> str:
    """sha256 of a split's rows as the trials read them (columns, then each row as JSON, in order):
    any change of a sentence, a score or the rows' order changes it, a file's formatting does not."""
    digest = hashlib.sha256(json.dumps(list(frame.columns)).encode())
    for row in frame.itertuples(index=False, name=None):
        digest.update(json.dumps(row, ensure_ascii=False, default=_plain).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)


# --- the raw rows of each split ---------------------------------------------------------------


def _raw_splits(d: DataDeclaration, root: Path | None, key: str, builtin: bool):
    if d.hf is not None:
        frames, sources = _read_hub(d, key)
        return frames, sources, {s: f"{key}.hf.splits.{s}" for s in frames}
    if d.files is not None:
        frames, sources, keys = {}, {}, {}
        for split in (s for s in SPLITS if s in d.files):
            path, keys[split] = _located(d.files[split], root), f"{key}.files.{split}"
            frames[split], sources[split] = _read_file(d, path, keys[split], builtin), Origin(str(path))
        return frames, sources, keys
    path = _located(d.file, root)
    whole = _read_file(d, path, f"{key}.file", builtin)
    if d.split_column not in whole.columns:
        raise UserInputError(f"{key}.split_column", d.split_column, f"{path} has no such column; its columns are: "
                                                                    f"{_columns(whole)}")
    values = d.split_values or {s: s for s in d.splits}
    column = whole[d.split_column].astype(str)
    frames = {s: whole[column == str(v)] for s, v in values.items() if s in SPLITS}  # rows keep their file numbers
    return frames, {s: Origin(str(path), column=f"{d.split_column} = {values[s]}") for s in frames}, \
        {s: f"{key}.split_values.{s}" for s in frames}


def _located(path: str, root: Path | None) -> Path:
    candidate = Path(path).expanduser()
    candidate = candidate if candidate.is_absolute() or root is None else root / candidate
    if not candidate.exists() and any(c in candidate.name for c in "*?["):  # a pattern: its first match
        matches = sorted(candidate.parent.glob(candidate.name))
        return matches[0] if matches else candidate
    return candidate


def _read_file(d: DataDeclaration, path: Path, key: str, builtin: bool = False) -> pd.DataFrame:
    fmt = SENTEVAL if d.format == SENTEVAL else d.format_of(str(path))
    if not path.exists():
        if builtin:
            raise FileNotFoundError(path)
        raise UserInputError(key, str(path), "no such file (relative paths are read from the study file's folder)")
    try:
        if fmt in ("csv", "tsv"):
            return _read_delimited(d, path, "," if fmt == "csv" else "\t")
        if fmt == "jsonl":
            return _read_jsonl(path, key)
        if fmt == "parquet":
            return pd.read_parquet(path)
        if fmt == "text":
            lines = (s.strip() for s in path.read_text(encoding=d.encoding).splitlines())
            return pd.DataFrame({"sentence": [s for s in lines if s]})
        return _read_senteval(path)
    except UserInputError:
        raise
    except UnicodeDecodeError as exc:
        raise UserInputError(key, str(path), f"is not {d.encoding} text (byte {exc.start}): set task.encoding") \
            from None
    except Exception as exc:  # pandas' and pyarrow's parse errors: one line, the file named
        problem = " ".join(str(exc).split())[:200]
        raise UserInputError(key, str(path), f"cannot be read as {fmt}: {problem}") from None


def _read_delimited(d: DataDeclaration, path: Path, separator: str) -> pd.DataFrame:
    quoting = csv.QUOTE_NONE if d.quoting == "none" else csv.QUOTE_MINIMAL
    options = {"sep": separator, "dtype": str, "keep_default_na": False, "quoting": quoting, "encoding": d.encoding}
    if d.header:
        return pd.read_csv(path, **options)
    width = max(int(c) for c in d.columns.values()) + 1  # a longer row keeps its first fields (STS-B's are ragged)
    return pd.read_csv(path, header=None, engine="python", on_bad_lines=lambda fields: fields[:max(width, 1)],
                       **options)


def _read_jsonl(path: Path, key: str) -> pd.DataFrame:
    rows = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))
            except ValueError as exc:
                raise UserInputError(key, str(path), f"line {number} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserInputError(key, str(path), f"line {number} is not a JSON object (one row per line)")
            rows.append(row)
    return pd.DataFrame(rows)


def _read_senteval(folder: Path) -> pd.DataFrame:
    """A SemEval STS year in SentEval's layout: every subset's pairs with a gold score (an empty gold
    line is an unscored pair and is dropped, as SentEval does), with a `subset` column."""
    subsets = sorted(p.name.removeprefix("STS.input.").removesuffix(".txt") for p in folder.glob("STS.input.*.txt"))
    if not subsets:
        raise FileNotFoundError(folder)
    frames = []
    for subset in subsets:
        pairs = (folder / f"STS.input.{subset}.txt").read_text(encoding="utf-8").split("\n")
        gold = (folder / f"STS.gs.{subset}.txt").read_text(encoding="utf-8").split("\n")
        rows = [(*pair.split("\t")[:2], score) for pair, score in zip(pairs, gold, strict=False) if score.strip()]
        frames.append(pd.DataFrame([(a.strip(), b.strip(), s) for a, b, s in rows],
                                   columns=["sentence1", "sentence2", "score"]).assign(subset=subset))
    return pd.concat(frames, ignore_index=True)


def _read_hub(d: DataDeclaration, key: str) -> tuple[dict[str, pd.DataFrame], dict[str, Origin]]:
    """A folder written by `save_to_disk` through `datasets.load_from_disk`; anything else (a hub id,
    a folder of data files) through `datasets.load_dataset`, one split at a time."""
    import datasets

    hub, folder = d.hf, Path(d.hf.path).expanduser()
    frames, sources = {}, {}
    if folder.is_dir() and any((folder / name).exists() for name in ("dataset_dict.json", "state.json")):
        saved = _hub_call(key, hub.path, lambda: datasets.load_from_disk(str(folder)))
        available = list(saved) if isinstance(saved, datasets.DatasetDict) else ["train"]
        for split, name in hub.splits.items():
            if name not in available:
                raise UserInputError(f"{key}.hf.splits.{split}", name, f"{hub.path} has the splits: "
                                                                       f"{', '.join(available)}")
            frames[split] = (saved[name] if isinstance(saved, datasets.DatasetDict) else saved).to_pandas()
            sources[split] = Origin(hub.path, name)
        return frames, sources
    from trainables.hub import offline_unless_reachable

    offline_unless_reachable()  # a hub id: from the local cache only, at once, when the hub cannot be reached
    pinned = {"revision": hub.revision} if hub.revision else {}
    for split, name in hub.splits.items():
        loaded = _hub_call(f"{key}.hf.splits.{split}", name,
                           lambda name=name: datasets.load_dataset(hub.path, hub.config, split=name, **pinned))
        frames[split], sources[split] = loaded.to_pandas(), Origin(hub.path, name, hub.config)
    return frames, sources


def _hub_call(key: str, value: str, call):
    try:
        return call()
    except Exception as exc:  # offline, an unknown id or split, an unreadable folder: one line with the fix
        problem = " ".join(str(exc).split())[:240]
        raise UserInputError(key, value, f"cannot be loaded ({type(exc).__name__}: {problem}); a hub id needs the "
                                         "network or the local cache: offline, give a folder written by "
                                         "save_to_disk") from None


# --- the standard columns, checked ------------------------------------------------------------


def _columns(frame: pd.DataFrame) -> str:
    names = [str(c) for c in frame.columns]
    return ", ".join(names[:SHOWN_COLUMNS]) + (f", … ({len(names)} columns)" if len(names) > SHOWN_COLUMNS else "")


def _standard(d: DataDeclaration, frame: pd.DataFrame, split: str, source: str, where: str, key: str) -> pd.DataFrame:
    """The split's standard columns, checked; a problem names the row (1-based, in its file)."""
    if frame.empty:
        raise UserInputError(where, source, f"the {split} split has no rows")
    for column, wanted in (d.where or {}).items():
        if column not in frame.columns:
            raise UserInputError(f"{key}.where.{column}", wanted, f"{source} has no such column; its columns are: "
                                                                  f"{_columns(frame)}")
        values = {_label_text(v) for v in (wanted if isinstance(wanted, list) else [wanted])}
        frame = frame[frame[column].map(_label_text).isin(values)]
        if frame.empty:
            raise UserInputError(f"{key}.where.{column}", wanted, f"no row of the {split} split ({source}) holds it")
    out = {}
    for target in TARGETS[d.type]:
        column = d.columns.get(target, target)
        if column not in frame.columns:
            raise UserInputError(f"{key}.columns.{target}", column, f"{source} has no such column; its columns are: "
                                                                    f"{_columns(frame)}")
        values = frame[column]
        if values.isna().any():
            raise UserInputError(where, source, f"row {_row(values.isna())}: {column} is empty")
        out[target] = values.astype(str) if target in TEXT_COLUMNS else values
    if d.type == "sts":
        out["score"] = _scores(d, out["score"], source, where, d.columns.get("score", "score"))
    if "subset" in frame.columns:  # the SentEval years' subsets
        out["subset"] = frame["subset"]
    return pd.DataFrame(out).reset_index(drop=True)


def _row(bad: pd.Series) -> int:
    """The first flagged row's number in its file (1-based, the header not counted)."""
    return int(bad.index[int(bad.to_numpy().argmax())]) + 1


def _scores(d: DataDeclaration, values: pd.Series, source: str, where: str, column: Any) -> pd.Series:
    """Scores as numbers within `score_range`, scaled to [0, 1]; the first bad row is named."""
    try:
        numbers = values.astype(float)
    except (TypeError, ValueError):
        bad = pd.to_numeric(values, errors="coerce").isna()
        raise UserInputError(where, source, f"row {_row(bad)}: {column} {values[bad].iloc[0]!r} is not a number") \
            from None
    low, high = d.score_range
    outside = (numbers < low) | (numbers > high) | numbers.isna()
    if outside.any():
        raise UserInputError(where, source, f"row {_row(outside)}: {column} {numbers[outside].iloc[0]:g} is outside "
                                            f"score_range [{low:g}, {high:g}]")
    return (numbers - low) / (high - low)


def _binary_labels(d: DataDeclaration, frames: dict[str, pd.DataFrame], key: str) -> None:
    """Labels as 0/1: two classes over all splits, either 0/1 (or false/true) or named by positive_label."""
    column = d.columns.get("label", "label")
    seen = sorted({_label_text(v) for frame in frames.values() for v in frame["label"]})
    if len(seen) != 2 and (d.positive_label is None or len(seen) < 2):
        raise UserInputError(f"{key}.columns.label", column, f"a pair_classification data set has two classes; its "
                                                             f"labels have {len(seen)}: {', '.join(seen[:10])}"
                                                             + ("" if len(seen) < 2 else "; name the matching one "
                                                                "with positive_label (the rest: the other class)"))
    if d.positive_label is not None:
        positive = _label_text(d.positive_label)
        if positive not in seen:
            raise UserInputError(f"{key}.positive_label", d.positive_label, f"the labels are {', '.join(seen)}")
    elif seen in (["0", "1"], ["false", "true"]):
        positive = seen[1]
    else:
        raise UserInputError(f"{key}.positive_label", None, f"the labels are {', '.join(seen)}, not 0/1: say which "
                                                            "one marks a matching pair")
    for frame in frames.values():
        frame["label"] = [int(_label_text(v) == positive) for v in frame["label"]]


def _nli_labels(d: DataDeclaration, frames: dict[str, pd.DataFrame], key: str) -> None:
    """NLI judgments as 0 (entailment), 1 (neutral), 2 (contradiction): the names in any case, or the numbers."""
    column = d.columns.get("label", "label")
    classes = {**{name: i for i, name in enumerate(NLI_CLASSES)}, **{str(i): i for i in range(3)}}
    for frame in frames.values():
        texts = [_label_text(v).lower() for v in frame["label"]]
        bad = [t for t in texts if t not in classes]
        if bad:
            raise UserInputError(f"{key}.columns.label", column, f"an nli data set's labels are entailment, neutral "
                                                                 f"and contradiction (or 0, 1, 2); it has "
                                                                 f"{bad[0]!r}")
        frame["label"] = [classes[t] for t in texts]


def _label_text(value: Any) -> str:
    """A label as text: 1, 1.0 and "1" are one class; True and "true" another."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip().lower() if str(value).strip().lower() in ("true", "false") else str(value).strip()
