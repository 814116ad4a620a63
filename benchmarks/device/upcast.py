"""A model folder whose weights travelled as bf16 (`model.bf16.safetensors`, what the device tool's
64 MiB carry allows) back to fp32 `model.safetensors` in a new folder: both sides of a benchmark
then load the same fp32 weights (MiniLM's rounded to bf16 once, so its Spearman differs slightly
from the published model's).

    python benchmarks/device/upcast.py .gpu/minilm /tmp/minilm
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def upcast(source: Path, target: Path) -> int:
    """Copies `source` to `target` with its bf16 weights as fp32; the number of tensors."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.bf16.safetensors"), dirs_exist_ok=True)
    weights = load_file(source / "model.bf16.safetensors")
    save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()},
              target / "model.safetensors", metadata={"format": "pt"})
    return len(weights)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"upcast {upcast(Path(sys.argv[1]), Path(sys.argv[2]))} tensors to {sys.argv[2]}")
