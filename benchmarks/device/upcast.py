"""A model folder carried as bf16 and made fp32 again: `downcast` (here, by prepare.sh) writes the
folder with `model.bf16.safetensors` in place of `model.safetensors`, which the device tool's 64 MiB
carry allows for MiniLM; `upcast` (there) writes fp32 `model.safetensors` in a new folder. Both
sides of a benchmark then load the same fp32 weights (MiniLM's rounded to bf16 once, so its
Spearman differs slightly from the published model's).

A model too large to carry at all (MPNet: 220 MB in bf16) travels without its weights (`--bare`:
config and tokenizer), and `--draw` makes weights there from its config (seed 0, the architecture's
own initialization): both sides then time the same architecture, shapes and tokens as the real
model, but its Spearman means nothing, so such a run is for speed only.

    python benchmarks/device/upcast.py .gpu/minilm /tmp/minilm
    python benchmarks/device/upcast.py --down MODEL_FOLDER .gpu/minilm
    python benchmarks/device/upcast.py --bare MODEL_FOLDER .gpu/mpnet
    python benchmarks/device/upcast.py --draw .gpu/mpnet /tmp/mpnet
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CARRIED = "model.bf16.safetensors"


def convert(source: Path, target: Path, read: str, write: str, dtype: torch.dtype, leave: tuple[str, ...]) -> int:
    """`source` copied to `target` (less `read` and `leave`) with `read`'s floating weights as `dtype`
    in `write`; the number of tensors."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(read, *leave), dirs_exist_ok=True)
    weights = load_file(source / read)
    save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}, target / write,
              metadata={"format": "pt"})
    return len(weights)


def downcast(source: Path, target: Path) -> int:
    """The folder to carry: weights in bf16, the model card and training data list left behind."""
    return convert(source, target, "model.safetensors", CARRIED, torch.bfloat16, ("README.md", "data_config.json"))


def upcast(source: Path, target: Path) -> int:
    """The carried folder back to fp32 weights."""
    return convert(source, target, CARRIED, "model.safetensors", torch.float32, ())


def bare(source: Path, target: Path) -> int:
    """The folder to carry without weights (config, tokenizer, sentence-transformers' modules)."""
    shutil.copytree(source, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt", "*.onnx", "onnx", "openvino",
                                                  "README.md", "data_config.json"))
    return 0


def draw(source: Path, target: Path) -> int:
    """A bare folder given weights drawn from its config (seed 0) in `model.safetensors`."""
    from transformers import AutoConfig, AutoModel

    shutil.copytree(source, target, dirs_exist_ok=True)
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.from_pretrained(source))
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return len(weights)


MODES = {"--down": downcast, "--bare": bare, "--draw": draw}

if __name__ == "__main__":
    mode = sys.argv[1] if sys.argv[1:2] and sys.argv[1] in MODES else None
    paths = sys.argv[2:] if mode else sys.argv[1:]
    if len(paths) != 2:
        sys.exit(__doc__)
    count = MODES.get(mode, upcast)(Path(paths[0]), Path(paths[1]))
    print(f"{(mode or '--up')[2:]} {count} tensors to {paths[1]}")
