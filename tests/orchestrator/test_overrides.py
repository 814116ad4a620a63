"""Command-line overrides (`train.lr=3e-5`): read as YAML, validated as the study file is, stored merged
in the study folder, and checked like an edited file on resume."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.instant import instant_executor
from orchestrator.cli import app
from orchestrator.run.launcher import launch, resume
from orchestrator.study.config import read_study
from orchestrator.study.journal import Journal
from trainables.errors import UserInputError

runner = CliRunner()


@pytest.fixture()
def study_file(tmp_path, tiny_bert, synthetic_data_dir):
    path = tmp_path / "s.yaml"
    path.write_text("# a comment the stored file keeps when nothing is overridden\n" + yaml.safe_dump({
        "name": "s", "model": tiny_bert, "ablate": {"layer": [1, 2]},
        "tune": {"params": {"warmup_ratio": {"uniform": [0.0, 0.2]}}, "trials": 2, "startup_trials": 1},
        "replicate": {"seeds": [0, 1]}, "train": {"epochs": 2, "lr": 2.0e-5},
        "data_dir": str(synthetic_data_dir), "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}}))
    return path


GOOD = [
    (["train.lr=3e-5"], "train", {"epochs": 2, "lr": 3e-5}),  # YAML 1.1 would read 3e-5 as a string
    (["replicate.seeds=[0,1,2]"], "replicate", {"seeds": [0, 1, 2], "max_seeds": None, "until": None}),
    (["replicate.seeds=5"], "replicate", {"seeds": 5, "max_seeds": None, "until": None}),
    (["ablate.layer=all"], "ablate", {"layer": "all"}),
    (["ablate.pooling=[mean, cls]"], "ablate", {"layer": [1, 2], "pooling": ["mean", "cls"]}),
    (["tune.trials=5", "tune.sampler=random"], "tune", {"trials": 5, "sampler": "random"}),
    (["tune=null"], "tune", None),
    (["~tune"], "tune", None),
    (["~train.lr"], "train", {"epochs": 2}),
    (["train.epochs=1", "train.epochs=3"], "train", {"epochs": 3, "lr": 2e-5}),  # the later one wins
    (["report.labels.cls=CLS"], "report", {"labels": {"cls": "CLS"}}),  # the mappings above it are made
    (["data.max_train_samples=100", "data.max_eval_samples="], "data",
     {"max_train_samples": 100, "max_eval_samples": None}),  # an empty value is null
    (["resources={cpu: 2, gpu: 0.5}"], "resources", {"cpu": 2.0, "gpu": 0.5}),
    (["train.select=a=b"], "train", {"epochs": 2, "lr": 2e-5, "select": "a=b"}),  # the first = splits
]


@pytest.mark.parametrize(("overrides", "key", "expected"), GOOD)
def test_an_override_sets_what_it_names_and_nothing_else(study_file, overrides, key, expected):
    plain = read_study(study_file).config.model_dump(mode="json")
    spec = read_study(study_file, overrides)
    merged = spec.config.model_dump(mode="json")
    value = merged[key]
    if isinstance(expected, dict) and isinstance(value, dict):
        value = {k: value[k] for k in expected}
    assert value == expected
    assert {k: v for k, v in merged.items() if k != key} == {k: v for k, v in plain.items() if k != key}
    assert spec.overrides == tuple(overrides)
    stored = yaml.safe_load(spec.text)  # what the study folder keeps: the merged file, read back the same
    assert read_study(write(study_file.parent / "stored.yaml", spec.text)).config == spec.config
    assert spec.text.startswith(f"# {study_file} with {' '.join(overrides)}\n") and stored["name"] == "s"


def write(path, text):
    path.write_text(text)
    return path


VALID_TOP = ("name, trainable, task, model, language, ablate, tune, replicate, train, data, resources, tracking, "
             "report, storage_path, data_dir, max_failures, max_concurrent, budget, save")
FORM = "write KEY=VALUE (a dotted key, a YAML value), e.g. train.lr=3e-5 or 'replicate.seeds=[0,1,2]'"
BAD = [
    (["train"], f"override: 'train' is not valid; {FORM}"),
    (["=3"], f"override: '=3' is not valid; {FORM}"),
    (["train..lr=3"], f"override: 'train..lr=3' is not valid; {FORM}"),
    (["train lr=3"], f"override: 'train lr=3' is not valid; {FORM}"),
    (["trian.lr=3"], f"trian: {{'lr': 3}} is not valid; unknown key; did you mean train? Valid keys here: "
                     f"{VALID_TOP}"),
    (["tune.trails=4"], "tune.trails: 4 is not valid; unknown key; did you mean trials? Valid keys here: params, "
                        "trials, objectives, sampler, scheduler, grace_epochs, reduction_factor, startup_trials, "
                        "qmc_type, population_size, sampler_seed, seed"),
    (["tune.trials=zero"], "tune.trials: 'zero' is not valid; input should be a valid integer, unable to parse "
                           "string as an integer"),
    (["tune.scheduler=pbt"], "tune.scheduler: 'pbt' is not valid; use 'asha', 'hyperband' or 'none'"),
    (["name=my study"], "name: 'my study' is not valid; use letters, digits, '_', '.' or '-' (it names folders)"),
    (["ablate.layer.x=1"], "ablate.layer: [1, 2] is not valid; it is not a mapping, so ablate.layer.x cannot be "
                           "set; override ablate.layer itself"),
    (["~ablate.layer.x"], "ablate.layer: [1, 2] is not valid; it is not a mapping, so ablate.layer.x cannot be "
                          "removed; override ablate.layer itself"),
    (["train.lr=[1,"], "train.lr: '[1,' is not valid; the value is not YAML (expected the node content, but found "
                       "'<stream end>'); quote a value with spaces or brackets for the shell, e.g. "
                       "'replicate.seeds=[0,1,2]'"),
    (["~nothing"], "nothing: None is not valid; the study file has no such key to remove (~KEY removes a key; "
                   "KEY=VALUE sets one)"),
    (["resources.cpu=-1"], "resources.cpu: -1 is not valid; input should be greater than 0"),
    (["train.epochs=3", "tune.trials=0"], "tune.trials: 0 is not valid; input should be greater than or equal to 1"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD)
def test_a_bad_override_is_one_exact_line(study_file, overrides, message):
    with pytest.raises(UserInputError) as refused:
        read_study(study_file, overrides)
    assert str(refused.value) == message


@pytest.mark.parametrize(("override", "in_file"), [
    ("train.lrr=3", {"train": {"epochs": 2, "lr": 2e-5, "lrr": 3}}),  # the kind's keys: checked by the plan
    ("ablate.poolng=[mean]", {"ablate": {"layer": [1, 2], "poolng": ["mean"]}}),
    ("ablate.layer=[1, 9]", {"ablate": {"layer": [1, 9]}}),
    ("tracking.mlflow_uri=postgresql://nowhere:1/x", {"tracking": {"mlflow_uri": "postgresql://nowhere:1/x"}}),
])
def test_validate_gives_an_override_the_same_line_as_the_same_key_in_a_file(study_file, override, in_file):
    """`validate FILE KEY=VALUE` and `validate EDITED_FILE`: the same one line, exit 2, for every verb."""
    edited = study_file.parent / "edited.yaml"
    edited.write_text(yaml.safe_dump({**yaml.safe_load(study_file.read_text()), **in_file}))
    expected = runner.invoke(app, ["validate", str(edited)])
    assert expected.exit_code == 2 and expected.stderr.startswith("error: ") and expected.stderr.count("\n") == 1
    for verb in ("validate", "plan"):
        found = runner.invoke(app, [verb, str(study_file), override])
        assert (found.exit_code, found.stderr) == (2, expected.stderr)


def test_validate_and_plan_show_the_overridden_study(study_file):
    shown = runner.invoke(app, ["validate", str(study_file), "ablate.layer=[1,2,3]", "replicate.seeds=3",
                                "--name", "s3"])
    assert shown.exit_code == 0 and shown.stdout == "ok: s3: 3 cells, 15 trials\n", shown.output  # 3 x (2 + 3)
    planned = runner.invoke(app, ["plan", str(study_file), "~tune", "ablate.layer=all"])
    assert planned.exit_code == 0, planned.output
    assert "tuned per cell: nothing (grid x seeds)" in planned.stdout
    assert "trials: 0 tuning + 8 replicate = 8" in planned.stdout  # layers 0..3 x 2 seeds
    bad = runner.invoke(app, ["validate", str(study_file), "--name", "a/b"])
    assert bad.exit_code == 2 and bad.stderr == ("error: --name: 'a/b' is not valid; use letters, digits, '_', '.' "
                                                 "or '-' (it names folders)\n")


def score(config: dict, seed: int, epoch: int) -> float:
    return 50 + 5 * config["layer"] + seed + epoch


def issued(folder) -> list[str]:
    return [e["key"] for e in Journal(folder / "journal.jsonl").events() if e["event"] == "issued"]


def test_the_study_folder_keeps_the_merged_file_and_resume_checks_overrides_like_edits(study_file, tmp_path):
    storage = tmp_path / "studies"
    result = launch(read_study(study_file, ["~tune", "train.epochs=3"], name="s_e3"), storage=storage,
                    progress=False, executor=instant_executor(score))
    folder = storage / "s_e3"
    assert result.finished and result.study_dir == folder and result.counts["completed"] == 4
    stored = folder / "study.yaml"
    assert stored.read_text().startswith(f"# {study_file} with ~tune train.epochs=3 --name s_e3\n")
    assert yaml.safe_load(stored.read_text()) == {**{k: v for k, v in yaml.safe_load(study_file.read_text()).items()
                                                     if k != "tune"}, "name": "s_e3",
                                                  "train": {"epochs": 3, "lr": 2e-5}}
    assert (folder / "study.launched.yaml").read_text() == stored.read_text()
    record = json.loads((folder / "study_record.json").read_text())
    assert record["name"] == "s_e3" and record["epochs"] == 3 and record["tuned"] == {}
    assert not (storage / "s").exists()  # --name: a study of its own

    before = (folder / "journal.jsonl").read_bytes()
    with pytest.raises(UserInputError) as refused:
        resume("s_e3", storage, overrides=["train.lr=1e-3"], progress=False, executor=instant_executor(score))
    assert str(refused.value) == ("train.lr: 0.001 is not valid; the study was launched with 2e-05; that change "
                                  "would invalidate its finished work: restore it, or launch under a new name")
    with pytest.raises(UserInputError, match=re.escape("train.epochs: 4 is not valid; the study was launched with 3")):
        launch(read_study(study_file, ["~tune", "train.epochs=4"], name="s_e3"), storage=storage, resume=True,
               progress=False, executor=instant_executor(score))
    assert (folder / "journal.jsonl").read_bytes() == before and stored.read_text().endswith("lr: 2.0e-05\n")

    more = resume("s_e3", storage, overrides=["replicate.seeds=[0,1,2]"], progress=False,
                  executor=instant_executor(score))  # an extension: only the new seed runs
    assert more.finished and more.counts["completed"] == 6
    assert sorted(issued(folder)) == ["c0-s0", "c0-s1", "c0-s2", "c1-s0", "c1-s1", "c1-s2"]
    assert yaml.safe_load(stored.read_text())["replicate"] == {"seeds": [0, 1, 2]}  # resume sees what ran
    again = resume("s_e3", storage, progress=False, executor=instant_executor(score))
    assert again.finished and len(issued(folder)) == 6


def test_resume_refuses_a_name_override(study_file, tmp_path):
    storage = tmp_path / "studies"
    launch(study_file, storage=storage, progress=False, executor=instant_executor(score))
    with pytest.raises(UserInputError) as refused:
        resume("s", storage, overrides=["name=t"], progress=False, executor=instant_executor(score))
    assert str(refused.value).startswith("name: 't' is not valid; the study folder ")
    assert str(refused.value).endswith("is study s: resume it under its own name (--name and name= start a new "
                                       "study with `launch`)")
