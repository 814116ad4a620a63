"""The example plugin, installed with pip, in a study end to end: `pip install -e examples/plugin`, a
study on a pair-classification data set of its own (JSONL, written here) ablating the built-in
`cosine_bce` against the plugin's `contrastive` and the built-in `mean` pooling against the plugin's
`weightedmean`, through launch (Ray, real trials), report and verify; then `pip uninstall`, and
`status`, `report` and `verify` of that study still work.

The plugin goes into a virtual environment layered on the test's own (its site-packages read through
a .pth file), so installing and uninstalling it never changes the environment other tests run in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "examples" / "plugin"
WORDS = ["cat", "dog", "bird", "fish", "tree", "house", "car", "road", "sun", "moon", "star", "sky", "sea", "hill",
         "river", "city", "red", "blue", "green", "small"]


def layered_venv(folder: Path) -> Path:
    """A venv without pip whose Python also reads this interpreter's site-packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    child_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    parent_site = sysconfig.get_paths()["purelib"]
    (child_site / "parent_environment.pth").write_text(f"import site; site.addsitedir({parent_site!r})\n")
    return python


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
                           "--no-input", *args], capture_output=True, text=True, timeout=300)


def write_pairs(folder: Path) -> dict[str, str]:
    """Paraphrase pairs (label 1: the same words, one swapped) and unrelated ones (label 0)."""
    import random

    rng = random.Random(7)
    folder.mkdir(parents=True)
    files = {}
    for split, count in (("train", 96), ("dev", 40), ("test", 40)):
        rows = []
        for i in range(count):
            first = rng.sample(WORDS, 6)
            second = first[:5] + [rng.choice(WORDS)] if i % 2 else rng.sample(WORDS, 6)
            rows.append({"question": " ".join(first), "candidate": " ".join(second), "is_paraphrase": i % 2})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = f"pairs/{split}.jsonl"
    return files


def cli(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([str(python), "-m", "orchestrator.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_the_example_plugin_installed_with_pip_runs_a_study_and_its_study_outlives_it(tiny_bert, tmp_path):
    python = layered_venv(tmp_path / "venv")
    installed = pip(python, "install", "--no-deps", "--no-build-isolation", "-e", str(PLUGIN))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    files = write_pairs(tmp_path / "pairs")
    study = {"name": "plugin_e2e", "trainable": "finetune", "model": tiny_bert,
             "task": {"name": "toy_paraphrase", "type": "pair_classification", "files": files,
                      "columns": {"sentence1": "question", "sentence2": "candidate", "label": "is_paraphrase"}},
             "ablate": {"loss": ["cosine_bce", "contrastive"], "pooling": ["mean", "weightedmean"]},
             "replicate": {"seeds": [0]}, "train": {"layer": 2, "epochs": 2, "batch_size": 16, "lr": 1e-3},
             "resources": {"cpu": 1}, "tracking": {"mlflow_uri": "sqlite:///mlflow.db"},
             "report": {"columns": "pooling"}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    storage = str(tmp_path / "studies")
    launched = cli(python, "launch", "study.yaml", "--storage", storage, cwd=tmp_path)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    record = json.loads((tmp_path / "studies" / "plugin_e2e" / "study_record.json").read_text())
    assert {(p["group"], p["name"], p["distribution"], p["version"]) for p in record["plugins"]} == {
        ("objectives", "contrastive", "orchestrator-plugin-example", "0.1.0"),
        ("poolings", "weightedmean", "orchestrator-plugin-example", "0.1.0")}
    assert [d["name"] for d in record["data"]] == ["toy_paraphrase"]
    assert {s: p["rows"] for s, p in record["data"][0]["splits"].items()} == {"train": 96, "dev": 40, "test": 40}
    reported = cli(python, "report", "plugin_e2e", "--storage", storage, "--out", "report", cwd=tmp_path)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    cells = [line for line in (tmp_path / "report" / "cells.csv").read_text().splitlines()[1:] if line]
    assert len(cells) == 4  # 2 losses x 2 poolings, each with its test accuracy
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "Data set **toy_paraphrase** (classification" in markdown
    assert f"sha256 `{record['data'][0]['splits']['test']['sha256'][:16]}`" in markdown
    assert "contrastive (objectives, orchestrator-plugin-example 0.1.0)" in markdown
    verified = cli(python, "verify", "report", cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok: every number"), \
        verified.stdout + verified.stderr

    removed = pip(python, "uninstall", "-y", "orchestrator-plugin-example")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    gone = subprocess.run([str(python), "-c", "import orchestrator_plugin_example"], capture_output=True, text=True)
    assert gone.returncode != 0
    status = cli(python, "status", "plugin_e2e", "--storage", storage, cwd=tmp_path)
    assert status.returncode == 0 and "4" in status.stdout, status.stdout + status.stderr
    again = cli(python, "report", "plugin_e2e", "--storage", storage, "--out", "report_after", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "report_after" / "cells.csv").read_text() == (tmp_path / "report" / "cells.csv").read_text()
    assert cli(python, "verify", "report_after", cwd=tmp_path).returncode == 0
    refused = cli(python, "validate", "study.yaml", cwd=tmp_path)  # a new launch needs the plugin again
    assert refused.returncode == 2 and "ablate.pooling: 'weightedmean' is not valid" in refused.stderr
