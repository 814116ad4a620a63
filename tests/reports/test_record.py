"""The study record: typed and versioned, what the kind declares carried for readers that never
import it, and the two `plan.json` shapes of older studies still read."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.study.config import parse_study
from orchestrator.study.plan import build_plan, plan_from_record, plan_record
from reports.record import RECORD_VERSION, KindRecord, StudyRecord
from trainables.errors import UserInputError


def study(tiny_bert, data_dir, trainable: str = "finetune", **train) -> dict:
    return {"name": "r", "trainable": trainable, "model": tiny_bert, "data_dir": str(data_dir),
            "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]}, "train": train,
            "tracking": {"mlflow_uri": "sqlite:///x.db"}}


@pytest.mark.parametrize(("trainable", "train", "round_name", "stages", "tables"), [
    ("finetune", {"epochs": 2}, "epoch", [], []),
    ("finetune", {"pretrain": "mlm", "pretrain_corpus": "task", "pretrain_steps": 5}, "epoch", ["dapt"], []),
    ("distill", {"mode": "teacher"}, "cycle", ["teacher"], ["rounds"]),
    ("contrastive", {"steps": 4, "eval_every": 2}, "round", [], []),
    ("contrastive", {"steps": 4, "eval_every": 2, "suite": True}, "round", [], ["suite"]),
])
def test_the_record_carries_the_plan_and_the_kinds_declarations(tiny_bert, synthetic_data_dir, tmp_path, trainable,
                                                                 train, round_name, stages, tables):
    config = parse_study(study(tiny_bert, synthetic_data_dir, trainable, **train))
    plan = build_plan(config, tmp_path)
    record = plan_record(plan, {"orchestrator": "9.9"})
    again = StudyRecord.from_json(record.to_json())
    assert again == record and again.version == RECORD_VERSION
    assert again.kind.name == trainable and again.kind.round_name == round_name and again.kind.stages == stages
    assert again.kind.tables == tables
    assert again.axes == ["layer"] and [k for k, _ in again.planned_cells] == ["layer=1", "layer=2"]
    assert again.replicate_trials == 4 and again.provenance == {"orchestrator": "9.9"}
    stored = plan_from_record(config, again)
    assert stored.cells == plan.cells and stored.seeds == plan.seeds and stored.stages == plan.stages
    assert stored.kind_path == plan.kind_path and stored.cell_reports == plan.cell_reports
    assert stored.tables == plan.tables


def test_a_newer_or_damaged_record_is_one_clear_line():
    record = StudyRecord(name="s", kind=KindRecord(name="finetune"), metric="dev_spearman", cells=[{}], seeds=[0])
    newer = json.loads(record.to_json()) | {"version": RECORD_VERSION + 1}
    with pytest.raises(UserInputError, match="written by a newer orchestrator .* upgrade orchestrator"):
        StudyRecord.from_json(json.dumps(newer))
    with pytest.raises(UserInputError, match="study_record.json: mode"):
        StudyRecord.from_json(json.dumps(json.loads(record.to_json()) | {"mode": "sideways"}))
    with pytest.raises(UserInputError, match="not JSON"):
        StudyRecord.from_json('{"cells": [')


def test_both_legacy_plan_shapes_read_as_records():
    folder_shape = {"cells": [{"layer": 1}], "seeds": [0, 1], "base": {"task": "stsb"}, "metric": "dev_accuracy",
                    "mode": "max", "epochs": 3, "origins": {}, "cell_reports": [3],
                    "kind_path": "trainables.kinds.finetune:FinetuneKind", "cell_costs": [6.0]}
    record = StudyRecord.from_legacy(folder_shape, "old")
    assert record.version == 0 and record.metric == "dev_accuracy" and record.kind.path.endswith("FinetuneKind")
    assert record.cell_costs == [6.0] and record.seeds == [0, 1]
    parent_shape = {"cells": [{"layer": 1}], "tuned": {"lr": "LogUniform(low=1e-05, high=0.001)"}, "seeds": [0],
                    "metric": "dev_spearman", "mode": "max", "epochs": 2, "round": "cycle", "tuning_trials": 4,
                    "replicate_trials": 1, "base": {}}
    record = StudyRecord.from_legacy(parent_shape, "old", "distill")
    assert record.kind == KindRecord(name="distill", round_name="cycle") and list(record.tuned) == ["lr"]


def test_a_report_reads_a_parent_run_from_before_records(tmp_path):
    """A study launched by an older orchestrator carries `plan.json` on its parent run, not a record."""
    from mlflow.tracking import MlflowClient

    from reports.collect import collect
    from reports.store import open_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client: MlflowClient = open_store(uri)
    experiment = client.create_experiment("old", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(experiment, tags={"orchestrator.role": "study"})
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({"name": "old", "trainable": "distill"}))
    client.log_artifact(parent.info.run_id, str(tmp_path / "study.yaml"))
    client.log_dict(parent.info.run_id, {"cells": [{"layer": 2}], "seeds": [0, 1], "metric": "dev_spearman",
                                         "mode": "max", "round": "cycle", "tuned": {"bi_lr": "x"}}, "plan.json")
    runs = collect(uri, "old")
    assert runs.axes == ["layer"] and runs.tuned == ["bi_lr"] and runs.round_name == "cycle"
    assert runs.planned_seeds == 2 and runs.record.kind.name == "distill" and runs.record.version == 0
