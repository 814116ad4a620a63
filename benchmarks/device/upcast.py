"""A model folder carried as bf16 and made fp32 again: `downcast` (here, by prepare.sh) writes the
folder with `model.bf16.safetensors` in place of `model.safetensors`, which the device tool's 64 MiB
carry allows for MiniLM; `upcast` (there) writes fp32 `model.safetensors` in a new folder. Both
sides of a benchmark then load the same fp32 weights (MiniLM's rounded to bf16 once, so its
Spearman differs slightly from the published model's).

    python benchmarks/device/upcast.py .gpu/minilm /tmp/minilm
    python benchmarks/device/upcast.py --down MODEL_FOLDER .gpu/minilm
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


if __name__ == "__main__":
    down = sys.argv[1:2] == ["--down"]
    paths = sys.argv[2:] if down else sys.argv[1:]
    if len(paths) != 2:
        sys.exit(__doc__)
    count = (downcast if down else upcast)(Path(paths[0]), Path(paths[1]))
    print(f"{'downcast' if down else 'upcast'} {count} tensors to {paths[1]}")
