"""A study that trains on SICK's entailment pairs with in-batch negatives (`train_data: sick_nli`, the MNRL
family and GISTEmbed with a guide model) and selects and scores on STS-B launches on a local Ray, records both
data sets' hashes, reports and verifies, as issue 55 asks of an MNRL study."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from orchestrator.study.folder import RECORD
from tests.orchestrator.test_launch import run_cli, write_study

pytestmark = pytest.mark.slow


def test_an_mnrl_study_on_sick_entailment_pairs_launches_reports_and_verifies(tiny_bert, data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, data_dir, ablate={"loss": ["mnrl", "gte", "gist"]}, tune=None,
                        replicate={"seeds": [0]},
                        train={"train_data": "sick_nli", "guide_model": tiny_bert, "layer": 2, "epochs": 1,
                               "batch_size": 16, "max_seq_length": 16, "lr": 1e-3},
                        data={"max_train_samples": 64, "max_eval_samples": 40})
    storage = tmp_path / "studies"
    checked = run_cli("validate", str(study), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    launched = run_cli("launch", str(study), "--storage", str(storage), cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "finished: 3 completed" in launched.stdout, launched.stdout[-2000:]
    record = json.loads((storage / "e2e" / RECORD).read_text())
    read = {d["name"]: d for d in record["data"]}
    assert set(read) == {"stsb", "sick_nli"} and set(read["sick_nli"]["splits"]) == {"train"}
    assert read["sick_nli"]["splits"]["train"]["rows"] == 1299  # every entailment pair hashed; trials cap to 64
    runs = pd.read_csv(tmp_path / "reports" / "e2e" / "runs.csv")
    replicates = runs[runs.phase == "replicate"].set_index("loss")
    assert set(replicates.index) == {"mnrl", "gte", "gist"} and replicates.test_spearman.notna().all()
    assert replicates.test_spearman["mnrl"] != pytest.approx(replicates.test_spearman["gte"], abs=1e-6)
    verified = run_cli("verify", str(tmp_path / "reports" / "e2e"), cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr
