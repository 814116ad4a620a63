"""`orchestrator reproduce REPORT --cell layer=3 --seed 1`: rerun one replicate of a report (a report
folder or an unpacked bundle) from what it stores — the run's exact config, its kind, the study record —
in a scratch folder, after checking that the data's rows and the model's weights are the ones the study
ran on, and put the reported and the recomputed dev and test scores side by side. On the same machine and
precision they match to 1e-6 (same seed, same numbers); when they do not, it names what of the
environment differs from the launch's (package versions, the machine)."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from reports.environment import (
    KEY_PACKAGES,
    LOCK_FILE,
    cpu_model,
    environment_lock,
    lock_differences,
    normalise,
    package_versions,
    read_lock,
)
from reports.paper import REPLICATES_FILE
from reports.record import RECORD_FILE, StudyRecord
from trainables.errors import UserInputError

TOLERANCE = 1e-6
# a replicate that trained in a fused array (`resources.fuse`), rerun alone: the same training to fp32 rounding (the
# stacked matmuls round differently), so its Spearman scores (x100) agree to this (issue 56's tolerance)
FUSED_TOLERANCE = 0.05


@dataclass
class Reproduction:
    entry: dict
    reported: dict[str, float]
    recomputed: dict[str, float]
    checked: list[str] = field(default_factory=list)  # what was verified before the run (data, model)
    environment: list[str] = field(default_factory=list)  # how this environment differs from the launch's
    tolerance: float = TOLERANCE

    def difference(self, name: str) -> float:
        return abs(self.recomputed.get(name, math.nan) - self.reported[name])

    @property
    def matches(self) -> bool:
        return all(self.difference(name) <= self.tolerance for name in self.reported)


def parse_cell(text: str) -> dict[str, str]:
    """`layer=3`, `layer=3 pooling=mean` or `layer=3,pooling=mean` as {axis: value}."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts or not all("=" in p and p.split("=", 1)[0] and p.split("=", 1)[1] for p in parts):
        raise UserInputError("--cell", text, "give the cell's axis values as AXIS=VALUE, e.g. --cell layer=3 or "
                                             "--cell 'layer=3 pooling=mean'")
    return dict(p.split("=", 1) for p in parts)


def read_report(folder: Path) -> tuple[list[dict], StudyRecord]:
    """A report folder's (or unpacked bundle's) replicates and study record."""
    report = folder / "report" if (folder / "report" / REPLICATES_FILE).exists() else folder
    if not (report / REPLICATES_FILE).exists():
        raise UserInputError("REPORT", str(folder), f"no {REPLICATES_FILE} there: give a folder written by "
                                                    "`orchestrator report` (or an unpacked --bundle)")
    damaged = UserInputError("REPORT", str(folder), f"{REPLICATES_FILE} is damaged; write the report again with "
                                                   "`orchestrator report`")
    try:
        entries = json.loads((report / REPLICATES_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise damaged from None
    if not isinstance(entries, list) or not all(is_entry(entry) for entry in entries):
        raise damaged
    try:
        text = (report / RECORD_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise UserInputError("REPORT", str(folder), f"its {RECORD_FILE} is missing or unreadable; write the report "
                                                    "again with `orchestrator report`") from None
    return entries, StudyRecord.from_json(text, str(report / RECORD_FILE))


ENTRY_FIELDS = {"cell": str, "values": dict, "seed": int, "kind": str, "config": dict, "reported": dict}


def is_entry(entry: object) -> bool:
    """Whether `entry` is a replicate as `orchestrator report` writes it (replicates.json)."""
    return (isinstance(entry, dict) and all(isinstance(entry.get(k), t) and not isinstance(entry.get(k), bool)
                                            for k, t in ENTRY_FIELDS.items())
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in entry["reported"].values()))


def find_replicate(entries: list[dict], cell: dict[str, str], seed: int) -> dict:
    """The completed replicate of the cell whose axis values are `cell` (a value written as the report
    shows it) and of `seed`."""
    def fits(entry: dict) -> bool:
        return all(str(entry["values"].get(axis)) == value for axis, value in cell.items())

    cells = list(dict.fromkeys(e["cell"] for e in entries))
    axes = list(entries[0]["values"]) if entries else []
    unknown = [axis for axis in cell if axis not in axes]
    if unknown:
        raise UserInputError("--cell", unknown[0], f"not an axis of the study; its axes: {', '.join(axes) or 'none'}")
    matching = list(dict.fromkeys(e["cell"] for e in entries if fits(e)))
    if len(matching) != 1:
        shown = ", ".join(cells) if not matching else ", ".join(matching)
        problem = "matches no completed cell" if not matching else "matches several cells; name every axis"
        raise UserInputError("--cell", " ".join(f"{k}={v}" for k, v in cell.items()), f"{problem}: {shown}")
    found = [e for e in entries if e["cell"] == matching[0] and e["seed"] == seed]
    if not found:
        seeds = sorted(e["seed"] for e in entries if e["cell"] == matching[0])
        raise UserInputError("--seed", seed, f"{matching[0]} has completed replicates of seeds "
                                             f"{', '.join(map(str, seeds))}")
    return found[0]


def check_data(record: StudyRecord, config: dict) -> list[str]:
    """The rows this machine reads for the config's task (the same code as a launch), against the
    record's sha256 of each split the study ran on; a split whose rows differ stops the reproduction
    before anything runs."""
    from orchestrator.study.data import read_study_data

    recorded = {(d.name, d.language): d for d in record.data}
    if not recorded:
        return ["data: not checked (the study's record has no data hashes)"]
    lines = []
    read = [(config.get("task"), config.get("language"))]
    if config.get("train_data") is not None:  # a finetune trained on another data set's train split
        read.append((config["train_data"], None))
    for found in read_study_data(read, config.get("data_dir")):
        before = recorded.get((found.name, found.language))
        name = f"{found.name}/{found.language}"
        if before is None:
            lines.append(f"data: {name}: not in the record, not checked")
            continue
        for split, now in found.splits.items():
            old = before.splits.get(split)
            if old is not None and old.sha256 != now.sha256:
                raise UserInputError("data", f"{name} {split}", f"its rows here ({now.source}) are not the ones the "
                                     f"study ran on (sha256 {now.sha256[:12]}… of {now.rows} rows, recorded "
                                     f"{old.sha256[:12]}… of {old.rows}): give --data-dir the folder that holds the "
                                     "study's data (its files' sha256 are in the bundle's data.sha256)")
        lines.append(f"data: {name} {', '.join(found.splits)}: the rows the study ran on (sha256 checked, "
                     f"{found.origin})")
    return lines


def check_model(record: StudyRecord, config: dict) -> list[str]:
    """The model's weights against the record's sha256 of them."""
    from orchestrator.study.inputs import model_record

    name = config.get("model")
    recorded = {m.name: m for m in record.models}
    if name is None or name not in recorded:
        return [f"model: {name}: not checked (not in the record)"] if name else []
    found = model_record(str(name))
    before = {f.path: f.sha256 for f in recorded[name].files}
    now = {f.path: f.sha256 for f in found.files}
    if before != now:
        raise UserInputError("model", name, f"its weights here ({found.path}) are not the ones the study ran on "
                                            f"(sha256 {', '.join(v[:12] + '…' for v in now.values()) or 'none'}; "
                                            f"recorded {', '.join(v[:12] + '…' for v in before.values())}): "
                                            "give the model the study used")
    return [f"model: {name}: the weights the study ran on (sha256 checked, from {found.path})"]


def rerun(entry: dict, config: dict) -> dict[str, float]:
    """The trial, run here with its kind in a scratch folder (its stage caches too); its last report."""
    from trainables.kinds import load_kind

    kind = load_kind(entry["kind"])
    fields = kind.Config.model_fields
    last: dict = {}

    def report(metrics: dict, checkpoint_dir: str | None = None) -> None:
        last.update(metrics)

    with tempfile.TemporaryDirectory(prefix="orchestrator-reproduce-") as scratch:
        scratch_config = {**config, **({"cache_dir": scratch} if "cache_dir" in fields else {}),
                          **({"export_model": False} if "export_model" in fields else {})}
        kind.run(scratch_config, report)
    return {k: float(v) for k, v in last.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def environment_differences(record: StudyRecord, folder: Path, entry: dict) -> list[str]:
    """How this environment differs from the launch's: key packages, every pinned distribution (the
    report's or bundle's environment.txt) and the trial's machine."""
    recorded = {k: v for k, v in record.provenance.items() if k in package_versions()}
    now = package_versions()
    out = [f"{name}: {recorded[name]} then, {now[name]} now" for name in recorded if recorded[name] != now[name]]
    for where in (folder / LOCK_FILE, folder / "report" / LOCK_FILE):
        if where.exists():  # every other distribution (the key packages are named above)
            named = {normalise(d) for d in KEY_PACKAGES.values()}
            out += [line for line in lock_differences(read_lock(where.read_text()), read_lock(environment_lock()))
                    if line.split(":")[0] not in named]
            break
    hardware = entry.get("hardware")
    machine = hardware.get("cpu_model") if isinstance(hardware, dict) else None
    if machine and machine != cpu_model():
        out.append(f"cpu: {machine} then, {cpu_model()} now")
    return out


def reproduce(folder: str | Path, cell: str, seed: int, data_dir: str | None = None,
              tolerance: float = TOLERANCE) -> Reproduction:
    folder = Path(folder)
    entries, record = read_report(folder)
    entry = find_replicate(entries, parse_cell(cell), seed)
    config = dict(entry["config"])
    if data_dir is not None:
        config["data_dir"] = str(Path(data_dir).expanduser().resolve())
    elif config.get("data_dir") and not Path(config["data_dir"]).is_dir():
        raise UserInputError("--data-dir", config["data_dir"], "the study's data folder is not here: give "
                                                               "--data-dir the folder that holds its data")
    checked = check_data(record, config) + check_model(record, config)
    members = fused_members(record, entry)
    if members > 1 and tolerance == TOLERANCE:
        tolerance = FUSED_TOLERANCE
        checked.append(f"fused: this cell's replicates trained in arrays of up to {members} (resources.fuse); rerun "
                       f"alone a member is the same training to fp32 rounding: scores compared within {tolerance:g}")
    recomputed = rerun(entry, config)
    reported = dict(entry["reported"])
    result = Reproduction(entry, reported, recomputed, checked, tolerance=tolerance)
    if not result.matches:
        result.environment = environment_differences(record, folder, entry)
    return result


def fused_members(record: StudyRecord, entry: dict) -> int:
    """The largest fused array the replicate's cell trained in (1: each trial alone), from the study record."""
    values = {axis: str(value) for axis, value in entry.get("values", {}).items()}
    for cell, fusion in zip(record.cells, record.fusion, strict=False):
        if {axis: str(value) for axis, value in cell.items()} == values:
            return int(fusion.get("members", 1))
    return 1


def render(result: Reproduction) -> list[str]:
    """What the command prints: the checks, then reported and recomputed scores side by side."""
    entry = result.entry
    lines = [f"reproduce {entry['cell']} · seed {entry['seed']} (MLflow run {entry.get('run_id', 'unknown')}; "
             f"config {entry.get('config_source', 'unknown')})", *result.checked]
    width = max(len(name) for name in result.reported) if result.reported else 10
    lines.append(f"{'':{width}}  {'reported':>20}  {'recomputed':>20}  {'difference':>11}")
    for name, value in result.reported.items():
        again = result.recomputed.get(name, math.nan)
        lines.append(f"{name:{width}}  {value:20.12f}  {again:20.12f}  {abs(again - value):11.3g}")
    if result.matches:
        lines.append(f"match: every score within {result.tolerance:g}")
        return lines
    lines.append(f"differs: a score is more than {result.tolerance:g} away from the reported one")
    if result.environment:
        lines += ["the environment differs from the launch's:", *[f"  {line}" for line in result.environment]]
    else:
        lines.append("the environment is the launch's (every package version, the CPU): the difference comes from "
                     "elsewhere (a GPU kernel that is not deterministic, another precision, other threads)")
    return lines


@dataclass
class Rerun:
    """One replicate rerun by `verify --rerun`: its reproduction, and the seed-to-seed standard deviation
    of each reported score in its cell (NaN with fewer than two seeds)."""

    result: Reproduction
    seed_sd: dict[str, float]

    def share(self, name: str) -> float:
        """The rerun's difference as a share of the cell's seed-to-seed sd."""
        sd = self.seed_sd.get(name, math.nan)
        difference = self.result.difference(name)
        return 0.0 if difference == 0 else difference / sd if sd > 0 else math.nan


def seed_spread(entries: list[dict]) -> dict[str, dict[str, float]]:
    """Per cell, the sample sd (n - 1) over its seeds of each reported score."""
    import statistics

    out: dict[str, dict[str, float]] = {}
    for cell in dict.fromkeys(e["cell"] for e in entries):
        rows = [e["reported"] for e in entries if e["cell"] == cell]
        names = dict.fromkeys(name for row in rows for name in row)
        out[cell] = {name: statistics.stdev(values) if len(values := [row[name] for row in rows if name in row]) > 1
                     else math.nan for name in names}
    return out


def rerun_sample(folder: str | Path, count: int, draw_seed: int = 0, data_dir: str | None = None,
                 tolerance: float = TOLERANCE) -> list[Rerun]:
    """`count` replicates of the report drawn at random (numpy's default_rng(`draw_seed`), without
    replacement; all of them when it has fewer), each rerun as `reproduce` reruns one: the same-seed
    variation of this machine, set against the study's seed-to-seed spread."""
    import numpy as np

    if count < 1:
        raise UserInputError("--rerun", count, "give how many replicates to rerun, at least 1")
    entries, _ = read_report(Path(folder))
    if not entries:
        raise UserInputError("REPORT", str(folder), "it has no completed replicate to rerun")
    chosen = sorted(np.random.default_rng(draw_seed).choice(len(entries), size=min(count, len(entries)),
                                                            replace=False).tolist())
    spread = seed_spread(entries)
    out = []
    for index in chosen:
        entry = entries[index]
        cell = " ".join(f"{axis}={value}" for axis, value in entry["values"].items())
        result = reproduce(folder, cell, entry["seed"], data_dir, tolerance)
        out.append(Rerun(result, spread[entry["cell"]]))
    return out


def render_reruns(reruns: list[Rerun], total: int, draw_seed: int) -> list[str]:
    """What `verify --rerun` prints: each rerun's differences against its cell's seed sd, and one verdict."""
    lines = [f"rerun {len(reruns)} of {total} replicates (drawn with seed {draw_seed}) here, each with its own seed "
             f"({cpu_model()}):"]
    worst = 0.0
    for rerun in reruns:
        entry = rerun.result.entry
        parts = []
        for name in rerun.result.reported:
            share = rerun.share(name)
            worst = max(worst, share) if not math.isnan(share) else worst
            sd = rerun.seed_sd.get(name, math.nan)
            parts.append(f"{name} {rerun.result.difference(name):.3g}"
                         + (f" ({share:.1%} of its seed sd {sd:.3g})" if not math.isnan(share) else ""))
        lines.append(f"  {entry['cell']} · seed {entry['seed']}: " + ", ".join(parts))
    if all(r.result.matches for r in reruns):
        tolerance = reruns[0].result.tolerance if reruns else TOLERANCE
        lines.append(f"same-seed variation: none (every score within {tolerance:g}): a rerun gives the reported "
                     "numbers")
    else:
        lines.append(f"same-seed variation: up to {worst:.1%} of the seed-to-seed sd; this machine does not give the "
                     "reported numbers back exactly (a GPU kernel that is not deterministic, other threads, another "
                     "environment: `orchestrator reproduce` on one of them names what differs); say so beside the "
                     "paper's figures")
    return lines
