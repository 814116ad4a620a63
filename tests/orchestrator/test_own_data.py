"""Data sets declared in the study file: every format and source reads to the same standard columns,
every malformed declaration is one line at `validate` (exit 2, nothing written), each split's sha256
is what its rows are, reaches the study record, the MLflow parent run and child runs (as dataset
inputs) and the report, and `resume` refuses data that changed, was deleted or damaged since launch."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.instant import instant_executor
from orchestrator.cli import app
from trainables.data.declaration import parse_declaration
from trainables.data.sources import read_declared, split_sha256
from trainables.data.tasks import load_task, task_source
from trainables.errors import UserInputError

runner = CliRunner()
WORDS = ["cat", "dog", "bird", "fish", "tree", "house", "car", "road", "sun", "moon", "star", "sky", "sea", "hill",
         "river", "city"]


def pair_rows(count: int, seed: int, kind: str = "sts") -> list[dict]:
    """Sentence pairs with a score in [0, 5] (sts) or a 0/1 label, half of them paraphrases."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(count):
        first = " ".join(rng.sample(WORDS, 4))
        second = first if i % 2 else " ".join(rng.sample(WORDS, 4))
        target = {"score": 5.0 if i % 2 else round(rng.uniform(0, 2), 2)} if kind == "sts" else {"label": i % 2}
        rows.append({"text_a": first, "text_b": second, **target})
    return rows


def write_splits(folder: Path, fmt: str, kind: str = "sts", sizes=(40, 16, 16)) -> dict[str, str]:
    """train/dev/test files of `fmt` under `folder`; the paths relative to its parent (the study's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, count, seed in zip(("train", "dev", "test"), sizes, (1, 2, 3), strict=True):
        frame = pd.DataFrame(pair_rows(count, seed, kind))
        path = folder / f"{split}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in frame.to_dict("records")))
        elif fmt in ("csv", "tsv"):
            frame.to_csv(path, sep="," if fmt == "csv" else "\t", index=False)
        else:
            frame.to_parquet(path)
        out[split] = f"{folder.name}/{path.name}"
    return out


def declared(files: dict[str, str], kind: str = "sts", **extra) -> dict:
    task = {"name": "own", "type": kind, "files": files, "columns": {"sentence1": "text_a", "sentence2": "text_b"}}
    return {**task, **({"score_range": [0, 5]} if kind == "sts" else {}), **extra}


def study_file(folder: Path, model: str, task, trainable: str = "finetune", **extra) -> Path:
    loss = "cosine_mse" if not isinstance(task, dict) or task.get("type") == "sts" else "cosine_bce"
    raw = {"name": "own_study", "trainable": trainable, "model": model, "task": task, "ablate": {"layer": [1, 2]},
           "train": {"epochs": 1, "batch_size": 8, "loss": loss}, "tracking": {"mlflow_uri": "sqlite:///mlflow.db"},
           **extra}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_every_file_format_reads_the_same_rows(tmp_path, fmt):
    files = write_splits(tmp_path / "data", fmt)
    data = load_task(declared({s: str(tmp_path / p) for s, p in files.items()}))
    expected = pd.DataFrame(pair_rows(40, 1))
    assert list(data.train.columns) == ["sentence1", "sentence2", "score"]
    assert data.train.sentence1.tolist() == expected.text_a.tolist()
    assert data.train.score.tolist() == pytest.approx((expected.score / 5).tolist())  # scaled from [0, 5]
    assert (data.kind, len(data.dev), len(data.test)) == ("sts", 16, 16)


def test_one_file_with_a_split_column_and_labels_named_by_positive_label(tmp_path):
    rows = [{**r, "part": split, "label": "para" if r["label"] else "other"}
            for split, seed in (("TR", 1), ("DV", 2), ("TE", 3)) for r in pair_rows(12, seed, "pair_classification")]
    pd.DataFrame(rows).to_csv(tmp_path / "all.csv", index=False)
    task = {"name": "mixed", "type": "pair_classification", "file": str(tmp_path / "all.csv"), "split_column": "part",
            "split_values": {"train": "TR", "dev": "DV", "test": "TE"}, "positive_label": "para",
            "columns": {"sentence1": "text_a", "sentence2": "text_b"}}
    data = load_task(task)
    assert (len(data.train), len(data.dev), len(data.test), data.kind) == (12, 12, 12, "classification")
    assert data.train.label.tolist() == [i % 2 for i in range(12)]


def test_a_saved_datasets_folder_and_a_folder_of_files_both_load(tmp_path):
    """`hf.path` as a folder written by save_to_disk (load_from_disk) and as a folder of parquet files
    (load_dataset, offline): the same rows either way."""
    import datasets

    frames = {split: pd.DataFrame(pair_rows(n, seed)) for split, n, seed in (("train", 20, 1), ("validation", 8, 2),
                                                                             ("test", 8, 3))}
    datasets.DatasetDict({s: datasets.Dataset.from_pandas(f) for s, f in frames.items()}).save_to_disk(
        str(tmp_path / "saved"))
    (tmp_path / "files" / "data").mkdir(parents=True)
    for split, frame in frames.items():
        frame.to_parquet(tmp_path / "files" / "data" / f"{split}-00000-of-00001.parquet")
    common = {"name": "hub_like", "type": "sts", "score_range": [0, 5],
              "columns": {"sentence1": "text_a", "sentence2": "text_b"}}
    saved = load_task({**common, "hf": {"path": str(tmp_path / "saved")}})
    files = load_task({**common, "hf": {"path": str(tmp_path / "files")}})
    for split in ("train", "dev", "test"):
        pd.testing.assert_frame_equal(saved.split(split), files.split(split))
    assert saved.dev.sentence1.tolist() == frames["validation"].text_a.tolist()


def test_the_sha256_follows_the_rows_not_the_file(tmp_path):
    files = write_splits(tmp_path / "data", "jsonl")
    task = declared({s: str(tmp_path / p) for s, p in files.items()})
    before = task_source(task)
    expected = split_sha256(read_declared(parse_declaration(task)).frames["train"])
    assert before.splits["train"].sha256 == expected and len(expected) == 64
    train = tmp_path / files["train"]
    train.write_text(train.read_text().replace("\n", "\n\n"))  # blank lines: the same rows
    assert task_source(task).splits["train"].sha256 == before.splits["train"].sha256
    lines = train.read_text().splitlines()
    row = json.loads(lines[0]) | {"score": 0.5}
    train.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")  # one score changed
    after = task_source(task)
    assert after.splits["train"].sha256 != before.splits["train"].sha256
    assert after.splits["dev"].sha256 == before.splits["dev"].sha256  # the other splits keep theirs


def test_pairs_in_both_train_and_test_are_a_warning_with_their_count(tmp_path, tiny_bert, caplog):
    files = write_splits(tmp_path / "data", "jsonl")
    test = tmp_path / files["test"]
    train_lines = (tmp_path / files["train"]).read_text().splitlines()
    test.write_text(test.read_text() + "\n".join(train_lines[:3]) + "\n")  # 3 train pairs copied into test
    study = study_file(tmp_path, tiny_bert, declared(files))
    result = runner.invoke(app, ["validate", str(study)])
    assert result.exit_code == 0, result.output
    assert "warning: task own: 3 test pairs are also train pairs" in result.stderr


def _files(tmp_path: Path, kind: str = "sts") -> dict[str, str]:
    return write_splits(tmp_path / "data", "jsonl", kind)


def _edit(tmp_path: Path, name: str, change) -> None:
    path = tmp_path / "data" / name
    path.write_text(change(path.read_text()))


BAD = [  # (what to change in a good sts declaration or its files, the exact error line)
    ("no_file", lambda t, d: d | {"files": {**d["files"], "train": "data/nowhere.jsonl"}},
     "error: task.files.train: '{root}/data/nowhere.jsonl' is not valid; no such file (relative paths are read from "
     "the study file's folder)"),
    ("no_column", lambda t, d: d | {"columns": {"sentence1": "txt_a", "sentence2": "text_b"}},
     "error: task.columns.sentence1: 'txt_a' is not valid; {root}/data/train.jsonl has no such column; its columns "
     "are: text_a, text_b, score"),
    ("default_column", lambda t, d: {k: v for k, v in d.items() if k != "columns"},
     "error: task.columns.sentence1: 'sentence1' is not valid; {root}/data/train.jsonl has no such column; its "
     "columns are: text_a, text_b, score"),
    ("score_text", lambda t, d: _edit(t, "dev.jsonl", lambda s: s.replace('"score": 5.0', '"score": "high"', 1)) or d,
     "error: task.files.dev: '{root}/data/dev.jsonl' is not valid; row 2: score 'high' is not a number"),
    ("score_range", lambda t, d: _edit(t, "test.jsonl", lambda s: s.replace('"score": 5.0', '"score": 7.5', 1)) or d,
     "error: task.files.test: '{root}/data/test.jsonl' is not valid; row 2: score 7.5 is outside score_range [0, 5]"),
    ("empty_split", lambda t, d: _edit(t, "dev.jsonl", lambda s: "") or d,
     "error: task.files.dev: '{root}/data/dev.jsonl' is not valid; the dev split has no rows"),
    ("bad_json", lambda t, d: _edit(t, "train.jsonl", lambda s: s.replace("}\n", "\n", 1)) or d,
     "error: task.files.train: '{root}/data/train.jsonl' is not valid; line 1 is not JSON (Expecting ',' "
     "delimiter)"),
    ("no_range", lambda t, d: {k: v for k, v in d.items() if k != "score_range"},
     "error: task.score_range: None is not valid; an sts data set needs its scores' [min, max], e.g. [0, 5] as "
     "STS-B: scores are scaled to [0, 1]"),
    ("upside_down_range", lambda t, d: d | {"score_range": [5, 0]},
     "error: task.score_range: [5.0, 0.0] is not valid; give [min, max] with min < max"),
    ("two_sources", lambda t, d: d | {"hf": {"path": "mteb/stsbenchmark-sts"}},
     "error: task: 'own' is not valid; give one source: files (one file per split), file with split_column (one "
     "file with every split) or hf (a Hugging Face dataset); it has files, hf"),
    ("missing_split", lambda t, d: d | {"files": {k: v for k, v in d["files"].items() if k != "test"}},
     "error: task.files.test: None is not valid; an sts data set needs the splits train, dev, test"),
    ("unknown_split", lambda t, d: d | {"files": {**d["files"], "validation": "data/dev.jsonl"}},
     "error: task.files.validation: 'data/dev.jsonl' is not valid; splits are train, dev and test"),
    ("unknown_suffix", lambda t, d: d | {"files": {**d["files"], "train": "data/train.xlsx"}},
     "error: task.files.train: 'data/train.xlsx' is not valid; use a .csv, .tsv, .jsonl, .parquet or .txt file, or "
     "say which with task.format"),
    ("typo_key", lambda t, d: d | {"colums": {}},
     "error: task.colums: {} is not valid; unknown key; did you mean columns? valid keys here: name, type, files, "
     "file, split_column, split_values, hf, format, columns, score_range, positive_label, where, header, "
     "quoting, encoding, language"),
    ("bad_type", lambda t, d: d | {"type": "regression"},
     "error: task.type: 'regression' is not valid; use 'sts', 'pair_classification', 'unlabeled', 'pairs', "
     "'triplets' or 'nli'"),
    ("unknown_target", lambda t, d: d | {"columns": {**d["columns"], "label": "score"}},
     "error: task.columns.label: 'score' is not valid; an sts data set maps the columns sentence1, sentence2, score"),
    ("file_without_column", lambda t, d: {**{k: v for k, v in d.items() if k != "files"}, "file": "data/train.jsonl"},
     "error: task.split_column: None is not valid; file and split_column go together: one file whose split_column "
     "names each row's split (train, dev, test)"),
]


@pytest.mark.parametrize(("case", "change", "message"), BAD, ids=[case for case, _, _ in BAD])
def test_a_malformed_declaration_is_one_line_exit_2_and_writes_nothing(tmp_path, tiny_bert, monkeypatch, case,
                                                                     change, message):
    monkeypatch.chdir(tmp_path)
    task = change(tmp_path, declared(_files(tmp_path)))
    study = study_file(tmp_path, tiny_bert, task)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    result = runner.invoke(app, ["validate", str(study)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [message.replace("{root}", str(tmp_path))]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written


LABELS = [
    ("three_classes", lambda rows: [r | {"label": i % 3} for i, r in enumerate(rows)],
     "error: task.columns.label: 'label' is not valid; a pair_classification data set has two classes; its labels "
     "have 3: 0, 1, 2; name the matching one with positive_label (the rest: the other class)"),
    ("named_classes", lambda rows: [r | {"label": "yes" if r["label"] else "no"} for r in rows],
     "error: task.positive_label: None is not valid; the labels are no, yes, not 0/1: say which one marks a matching "
     "pair"),
]


@pytest.mark.parametrize(("case", "relabel", "message"), LABELS, ids=[case for case, _, _ in LABELS])
def test_labels_must_be_two_classes(tmp_path, tiny_bert, case, relabel, message):
    files = write_splits(tmp_path / "data", "jsonl", "pair_classification")
    for name in files.values():
        path = tmp_path / name
        rows = relabel([json.loads(line) for line in path.read_text().splitlines()])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["validate", str(study_file(tmp_path, tiny_bert, declared(files,
                                                                                           "pair_classification")))])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [message]


def test_a_declaration_in_the_schema_and_the_plan(tmp_path, tiny_bert):
    schema = json.loads(runner.invoke(app, ["schema"]).stdout)
    task = schema["properties"]["task"]
    declaration = schema["$defs"]["DataDeclaration"]
    assert {"type": "string"} in task["anyOf"] and {"$ref": "#/$defs/DataDeclaration"} in task["anyOf"]
    assert {"name", "type", "files", "file", "split_column", "hf", "columns", "score_range"} <= set(
        declaration["properties"])
    assert declaration["required"] == ["name", "type"]
    files = _files(tmp_path)
    result = runner.invoke(app, ["plan", str(study_file(tmp_path, tiny_bert, declared(files)))])
    assert result.exit_code == 0 and "finetune on own" in result.stdout


def launched(tmp_path: Path, model: str, task) -> tuple[Path, Path]:
    from orchestrator.run.launcher import launch

    study = study_file(tmp_path, model, task)
    storage = tmp_path / "studies"
    launch(study, storage=storage, progress=False, executor=instant_executor(lambda config, seed, epoch: 50.0))
    return study, storage


def test_the_record_mlflow_and_the_report_carry_each_splits_sha256(tmp_path, tiny_bert, monkeypatch):
    from mlflow import MlflowClient

    from reports.record import StudyRecord

    monkeypatch.chdir(tmp_path)
    files = _files(tmp_path)
    task = declared(files)
    _, storage = launched(tmp_path, tiny_bert, task)
    expected = {split: task_source(declared({s: str(tmp_path / p) for s, p in files.items()})).splits[split].sha256
                for split in ("train", "dev", "test")}
    record = StudyRecord.from_json((storage / "own_study" / "study_record.json").read_text())
    assert [d.name for d in record.data] == ["own"]
    assert {s: part.sha256 for s, part in record.data[0].splits.items()} == expected
    assert record.data[0].splits["dev"].source == str(tmp_path / "data" / "dev.jsonl")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("own_study")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("orchestrator.role") == "study")
    assert {s: parent.data.tags[f"data.own.{s}.sha256"] for s in expected} == expected
    inputs = {(i.dataset.name, next(t.value for t in i.tags if t.key == "mlflow.data.context"), i.dataset.digest)
              for i in parent.inputs.dataset_inputs}
    assert inputs == {("own", s, h[:32]) for s, h in expected.items()}
    child = next(r for r in runs if r.data.tags.get("phase") == "replicate")
    contexts = sorted(next(t.value for t in i.tags if t.key == "mlflow.data.context")
                      for i in child.inputs.dataset_inputs)
    assert contexts == ["dev", "test", "train"]
    source = json.loads(next(i.dataset.source for i in child.inputs.dataset_inputs))
    assert source["uri"].startswith(str(tmp_path / "data"))
    result = runner.invoke(app, ["report", "own_study", "--storage", str(storage), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    provenance = json.loads((tmp_path / "r" / "provenance.json").read_text())
    assert {s: part["sha256"] for s, part in provenance["data"][0]["splits"].items()} == expected
    report = (tmp_path / "r" / "report.md").read_text()
    assert f"Data set **own** (sts; train: {tmp_path}/data/train.jsonl" in report
    assert f"dev 16 rows, sha256 `{expected['dev'][:16]}`" in report


@pytest.mark.parametrize(("damage", "message"), [
    ("changed", "error: task.files.train: '{root}/data/train.jsonl' changed since the study was launched; the train "
                "split of own had sha256 {old}… at launch and its rows' sha256 is {new}… now: restore the data it was "
                "launched with, or launch a new study under another name"),
    ("deleted", "error: task.files.train: '{root}/data/train.jsonl' is not valid; no such file (relative paths are "
                "read from the study file's folder)"),
    ("damaged", "error: task.files.train: '{root}/data/train.jsonl' is not valid; line 3 is not JSON (Unterminated "
                "string starting at)"),
])
def test_resume_refuses_data_changed_deleted_or_damaged_since_launch(tmp_path, tiny_bert, monkeypatch, damage,
                                                                     message):
    monkeypatch.chdir(tmp_path)
    files = _files(tmp_path)
    _, storage = launched(tmp_path, tiny_bert, declared(files))
    train = tmp_path / files["train"]
    old = task_source(declared({s: str(tmp_path / p) for s, p in files.items()})).splits["train"]
    lines = train.read_text().splitlines()
    if damage == "changed":
        train.write_text("\n".join([*lines[1:], lines[0]]) + "\n")  # the same rows in another order
    elif damage == "deleted":
        train.unlink()
    else:
        train.write_text("\n".join([*lines[:2], lines[2][:20], *lines[3:]]) + "\n")  # a line cut short
    folder = storage / "own_study"
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    new = task_source(declared({s: str(tmp_path / p) for s, p in files.items()})).splits["train"].sha256[:12] \
        if damage == "changed" else ""
    result = runner.invoke(app, ["resume", "own_study", "--storage", str(storage)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [message.format(root=tmp_path, old=old.sha256[:12], new=new)]
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == before  # nothing written


def test_a_task_name_still_works_and_a_mapping_is_refused_where_a_kind_needs_labels(tmp_path, tiny_bert):
    task = {"name": "corpus", "type": "unlabeled", "files": {"train": "corpus.txt"}}
    (tmp_path / "corpus.txt").write_text("one sentence\nanother one\n")
    result = runner.invoke(app, ["validate", str(study_file(tmp_path, tiny_bert, task))])
    assert result.stderr.strip().splitlines() == ["error: task.type: 'unlabeled' is not valid; finetune needs a "
                                                  "labeled pair task with dev and test splits: sts or "
                                                  "pair_classification"]
    pairs = {"name": "mine", "type": "pairs", "files": {"train": "pairs.jsonl"}}
    (tmp_path / "pairs.jsonl").write_text('{"anchor": "a", "positive": "b"}\n')
    result = runner.invoke(app, ["validate", str(study_file(tmp_path, tiny_bert, pairs))])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        "error: task.type: 'pairs' is not valid; finetune needs a labeled pair task with dev and test splits: sts or "
        "pair_classification (pairs, triplets and nli train a finetune as train.train_data)"]
    with pytest.raises(UserInputError, match="task: 'stsbb' is not valid"):
        load_task("stsbb")


def saved_datasets_folder(tmp_path: Path) -> dict:
    """The JSONL splits saved with `save_to_disk`, declared as `hf: {path: <folder>}`."""
    import datasets

    files = _files(tmp_path)
    splits = {"train": "train", "dev": "validation", "test": "test"}
    datasets.DatasetDict({name: datasets.Dataset.from_pandas(pd.read_json(tmp_path / files[split], lines=True))
                          for split, name in splits.items()}).save_to_disk(str(tmp_path / "saved"))
    return {k: v for k, v in declared(files).items() if k != "files"} | {"hf": {"path": "saved"}}


@pytest.mark.parametrize("source", ["jsonl", "csv", "parquet", "saved_folder"])
def test_a_study_on_each_source_launches_reports_and_verifies(tmp_path, tiny_bert, monkeypatch, source):
    """Launch (trials by the instant executor), report and verify exit 0, and the report names the data set
    and the sha256 of each split as the record has it."""
    monkeypatch.chdir(tmp_path)
    task = saved_datasets_folder(tmp_path) if source == "saved_folder" else \
        declared(write_splits(tmp_path / "data", source))
    _, storage = launched(tmp_path, tiny_bert, task)
    record = json.loads((storage / "own_study" / "study_record.json").read_text())["data"][0]
    assert {s: p["rows"] for s, p in record["splits"].items()} == {"train": 40, "dev": 16, "test": 16}
    reported = runner.invoke(app, ["report", "own_study", "--storage", str(storage), "--out", "r"])
    assert reported.exit_code == 0, reported.output
    markdown = (tmp_path / "r" / "report.md").read_text()
    for split, part in record["splits"].items():
        assert f"{split} {part['rows']} rows, sha256 `{part['sha256'][:16]}`" in markdown
    verified = runner.invoke(app, ["verify", "r"])
    assert verified.exit_code == 0 and verified.stdout.startswith("ok: every number"), verified.output
    if source == "saved_folder":
        assert record["origin"] == f"hf {tmp_path / 'saved'}" and record["splits"]["dev"]["hub_split"] == "validation"


def test_validate_says_what_it_read_of_a_declared_data_set(tmp_path, tiny_bert):
    files = _files(tmp_path)
    result = runner.invoke(app, ["validate", str(study_file(tmp_path, tiny_bert, declared(files)))])
    sha = {s: task_source(declared({k: str(tmp_path / p) for k, p in files.items()})).splits[s].sha256[:12]
           for s in ("train", "dev", "test")}
    assert result.exit_code == 0 and result.stdout.splitlines()[1:] == [
        f"data own: train 40 rows (sha256 {sha['train']}…), dev 16 rows (sha256 {sha['dev']}…), test 16 rows "
        f"(sha256 {sha['test']}…)"]
