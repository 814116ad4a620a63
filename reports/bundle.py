"""`orchestrator report NAME --bundle`: one archive for a paper's supplementary material, from which a
reader reproduces any cell: the report (with each replicate's exact config and scores), the study file as
launched, its record, the launch's locked environment, the sha256 of every data file, the orchestrator's
source, and a README saying how."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

import yaml

from reports.environment import LOCK_FILE, git_state
from reports.record import RECORD_FILE, StudyRecord
from reports.reproducibility import _first_line

DATA_SUMS = "data.sha256"  # `sha256sum -c data.sha256`, run in the data folder, checks every file
STUDY_FILE = "study.yaml"


def source_archive(folder: Path) -> tuple[Path | None, dict[str, str]]:
    """The orchestrator's code as this process runs it, as an installable source archive: every file of
    its git checkout that git does not ignore (uncommitted changes included, so the archive is the code
    that runs, not only the commit's). None outside a git checkout (an installed wheel)."""
    state = git_state()
    where = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=top,
                                capture_output=True, timeout=60).stdout if top else b""
    except (OSError, subprocess.SubprocessError):
        return None, state
    names = listed.decode("utf-8", errors="replace").split("\0")
    files = [name for name in names if name and (Path(top) / name).is_file()]
    if not files or not (Path(top) / "pyproject.toml").is_file():
        return None, state
    stem = f"ablation-orchestrator-{state['commit'][:12]}"
    archive = folder / f"{stem}.tar.gz"
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name in sorted(files):
            tar.add(Path(top) / name, arcname=f"{stem}/{name}", recursive=False)
    return archive, state


def data_sums(record: StudyRecord) -> str:
    lines = [f"{f.sha256}  {f.path}" for d in record.data for f in d.files]
    return "\n".join(lines) + ("\n" if lines else "")


def readme(record: StudyRecord, replicates: list[dict], source: Path | None, state: dict[str, str]) -> str:
    ran = record.provenance.get("commit", "unknown")
    ran_dirty = " with uncommitted changes" if record.provenance.get("dirty") == "yes" else ""
    here = f"{state['commit']}{' with uncommitted changes' if state.get('dirty') == 'yes' else ''}"
    lines = [f"# Reproducing {record.name}", "",
             f"This archive holds what a reader needs to rerun any replicate of the study `{record.name}`, which "
             f"ran ablation-orchestrator {record.provenance.get('orchestrator', 'unknown')} at commit {ran}"
             f"{ran_dirty}.", "",
             "| file | what it is |", "|---|---|",
             "| `report/` | the report: tables, CSVs, figures, the reproducibility section; `replicates.json` holds "
             "each replicate's exact config and the scores it reported |",
             f"| `{STUDY_FILE}` | the study file as launched |",
             f"| `{RECORD_FILE}` | the study record: plan, search, data and model hashes, versions |",
             f"| `{LOCK_FILE}` | every distribution of the environment the study ran in |",
             f"| `{DATA_SUMS}` | the sha256 of every data file, for `sha256sum -c` in the data folder |"]
    if source is not None:
        lines.append(f"| `source/{source.name}` | the orchestrator's code that wrote this bundle (commit {here}) |")
    lines += [""]
    if source is not None and (state["commit"] != ran or ran_dirty or state.get("dirty") == "yes"):
        lines += [f"**Note:** the source in this archive is commit {here}; the study ran commit {ran}{ran_dirty}. "
                  "The orchestrator's reproduce command says whether the numbers still come out the same.", ""]
    install = (f"pip install --no-deps source/{source.name}" if source is not None else
               f"pip install --no-deps ablation-orchestrator=={record.provenance.get('orchestrator', '')}")
    lines += ["## 1. The environment", "",
              f"Python {record.provenance.get('python', '(see environment.txt)')}, then every pinned distribution and "
              "the orchestrator itself (torch from the index of its build, e.g. `--index-url "
              "https://download.pytorch.org/whl/cpu` for a `+cpu` version; what was installed from a folder or a "
              "repository, the orchestrator among them, is a comment in the lock saying from where):", "",
              "```shell",
              "# not run here: it installs the study's environment", "python -m venv .venv && . .venv/bin/activate",
              f"pip install -r {LOCK_FILE}", install, "```", "", "## 2. The data", ""]
    for d in record.data:
        name = d.name + (f"/{d.language}" if d.language else "")
        license_line = _first_line(d.license) or "none stated"
        splits = ", ".join(f"{split} {s.rows} rows (sha256 {s.sha256[:16]}…)" for split, s in d.splits.items())
        lines.append(f"- **{name}**{f' ({d.title})' if d.title else ''}: read from {d.origin}; license: "
                     f"{license_line}; {splits}")
    lines += ["", f"Put the files in a data folder (the layout of `{DATA_SUMS}`) and check them there:", "",
              "```shell", "# not run here: it needs the data folder", f"cd DATA && sha256sum -c /path/to/{DATA_SUMS}",
              "```", "", "## 3. The models", ""]
    for m in record.models:
        sums = ", ".join(f"{f.path} {f.sha256}" for f in m.files)
        lines.append(f"- **{m.name}** ({m.source}; license: {m.license or 'none stated'}): weights {sums}")
    lines += ["", "## 4. Reproduce a cell", "",
              "Each command reruns one replicate in a scratch folder, after checking that the data's rows and the "
              "model's weights are the ones the study ran on, and prints the reported and the recomputed dev and "
              "test scores side by side. On the same machine and precision they match to 1e-6; otherwise it names "
              "what of the environment differs from the launch's.", "",
              "| cell | seed | reported | command |", "|---|---|---|---|"]
    for entry in replicates:
        cell = " ".join(f"{k}={v}" for k, v in entry["values"].items())
        scores = ", ".join(f"{k} {v:.4f}" for k, v in entry["reported"].items())
        lines.append(f"| {entry['cell']} | {entry['seed']} | {scores} | `orchestrator reproduce . --cell '{cell}' "
                     f"--seed {entry['seed']} --data-dir DATA` |")
    return "\n".join(lines) + "\n"


def write_bundle(runs, report: Path, destination: Path) -> Path:
    """The archive `destination` (a .tar.gz holding one folder `<name>-bundle/`)."""
    import json
    import shutil

    from reports.paper import REPLICATES_FILE

    record = runs.record
    root_name = f"{runs.name}-bundle"
    with tempfile.TemporaryDirectory(prefix="orchestrator-bundle-") as scratch:
        root = Path(scratch) / root_name
        shutil.copytree(report, root / "report")
        study = runs.parent_artifact(STUDY_FILE) or yaml.safe_dump(runs.study_file, sort_keys=False)
        (root / STUDY_FILE).write_text(study)
        (root / RECORD_FILE).write_text(record.to_json())
        lock = runs.parent_artifact(LOCK_FILE)
        (root / LOCK_FILE).write_text(lock if lock is not None else "# not recorded: the study ran before the "
                                                                   "orchestrator kept its environment\n")
        (root / DATA_SUMS).write_text(data_sums(record))
        source, state = source_archive(root / "source")
        replicates = json.loads((report / REPLICATES_FILE).read_text())
        (root / "README.md").write_text(readme(record, replicates, source, state))
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(root, arcname=root_name)
        partial.replace(destination)  # a bundle is whole or absent
    return destination
