"""What a study ran on, as facts a paper's reproducibility section and `orchestrator reproduce` compare:
the versions of the packages that make the numbers, every installed distribution (the locked
environment), the git commit (and whether the tree had uncommitted changes) and the machine.

Pure Python: nothing here imports torch unless asked for the GPUs (`gpus`), which only a trial's worker does."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

# the packages whose versions a paper names (import name in the record -> distribution)
KEY_PACKAGES = {"torch": "torch", "transformers": "transformers", "sentence-transformers": "sentence-transformers",
                "ray": "ray", "optuna": "optuna", "mlflow": "mlflow", "numpy": "numpy", "scipy": "scipy",
                "pandas": "pandas", "orchestrator": "ablation-orchestrator"}
LOCK_FILE = "environment.txt"  # every distribution of the launch's environment, `name==version` per line
UNKNOWN = "unknown"


def package_version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "absent"


def package_versions() -> dict[str, str]:
    """Python and the key packages, as `{"python": "3.11.2", "torch": "2.13.0", ...}`."""
    return {"python": platform.python_version(), **{name: package_version(dist) for name, dist in KEY_PACKAGES.items()}}


NOT_FROM_AN_INDEX = "# not from an index: "  # a pin pip cannot install by name: kept, as a comment


def environment_lock() -> str:
    """Every installed distribution as `name==version`, sorted (what `pip freeze` pins, read through
    importlib.metadata so that an environment without pip is locked too), after a header naming the
    interpreter and the platform. A distribution installed from a folder, a file or a repository (PEP 610's
    direct_url.json: the orchestrator's own checkout, a local plugin) is no index's to give, so its pin is a
    comment naming where it came from: `pip install -r` the lock installs everything else."""
    pins = set()
    for d in distributions():
        if not d.metadata["Name"]:
            continue
        pin = f"{d.metadata['Name']}=={d.version}"
        where = _direct_url(d)
        pins.add(f"{NOT_FROM_AN_INDEX}{pin} ({where})" if where else pin)
    header = [f"# python {platform.python_version()} ({sys.implementation.name}) on {platform.platform()}",
              "# every distribution of the environment the study ran in: pip install -r this file (torch from the "
              "index of its build, e.g. +cpu or +cu124)"]
    return "\n".join(header + sorted(pins, key=lambda line: line.removeprefix(NOT_FROM_AN_INDEX).lower())) + "\n"


def _direct_url(distribution) -> str | None:
    """Where a distribution installed from a URL (not an index) came from, per its direct_url.json."""
    import json

    try:
        text = distribution.read_text("direct_url.json")
        return str(json.loads(text)["url"]) if text else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_lock(text: str) -> dict[str, str]:
    """`name==version` lines of a lock (those not from an index too), as {normalised name: version}."""
    pins = {}
    for line in text.splitlines():
        line = line.removeprefix(NOT_FROM_AN_INDEX)
        if "==" in line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[normalise(name)] = pinned.split()[0] if pinned.split() else ""
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_differences(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """`name: recorded -> current` for each distribution whose version changed, appeared or went."""
    out = []
    for name in sorted(set(recorded) | set(current)):
        before, now = recorded.get(name, "absent"), current.get(name, "absent")
        if before != now:
            out.append(f"{name}: {before} -> {now}")
    return out


def git_state(folder: str | Path | None = None) -> dict[str, str]:
    """The commit of the checkout that holds `folder` (this package's by default) and whether its
    tracked files had uncommitted changes: `{"commit": ..., "dirty": "yes"|"no"}` (`unknown` outside git)."""
    where = Path(folder or Path(__file__).resolve().parent)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        if not commit:
            return {"commit": UNKNOWN, "dirty": UNKNOWN}
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                 capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    return {"commit": commit, "dirty": "yes" if changed else "no"}


def cpu_model() -> str:
    """The processor's marketing name (/proc/cpuinfo on Linux, sysctl on macOS), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "processor\t: arm")):
                return re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.processor() or UNKNOWN
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or UNKNOWN


def memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def machine() -> dict[str, str]:
    """The machine this process runs on: CPU model, logical CPUs, memory and operating system."""
    memory = memory_gib()
    return {"cpu_model": cpu_model(), "cpus": str(os.cpu_count() or 0),
            "memory_gib": f"{memory:.1f}" if memory else UNKNOWN, "os": platform.platform()}


def gpus() -> dict[str, str]:
    """The GPUs torch sees here: `{"gpu_model": "NVIDIA H100 80GB HBM3", "gpus": "1"}`, or model `none`."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu_model": "none", "gpus": "0"}
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return {"gpu_model": ", ".join(names), "gpus": str(torch.cuda.device_count())}
