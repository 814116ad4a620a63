"""`orchestrator verify reports/NAME`: every number of a written report, recomputed from MLflow.

The report folder says what produced it and from which store (`provenance.json`) and which runs
make each cell (`cells.csv`). Verify reads those runs again, rebuilds the report in a scratch
folder, and names every cell whose runs or numbers differ (a metric edited, a run deleted after
the report was written), then any other table line that differs.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pandas as pd

from reports.build import PROVENANCE, build_report, producer
from reports.collect import collect, combine
from trainables.errors import UserInputError

NUMBERS = ("n", "mean", "std", "dev")
PRODUCED = "Produced by ablation-orchestrator"


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    except (TypeError, ValueError):
        return a == b


def _ids(value) -> set[str]:
    return set(str(value).split(";")) - {"", "nan"} if isinstance(value, str) else set()


def compare_cells(written: pd.DataFrame, fresh: pd.DataFrame, metric: str) -> list[str]:
    problems = []
    fresh = fresh.set_index("cell")
    for row in written.itertuples(index=False):
        cell = row.cell
        if cell not in fresh.index:
            problems.append(f"cell {cell}: in the report, not in MLflow any more")
            continue
        now = fresh.loc[cell]
        gone = _ids(row.run_ids) - _ids(now.run_ids)
        if gone:
            problems.append(f"cell {cell}: run {', '.join(sorted(gone))} is no longer in MLflow "
                            f"(n {row.n} in the report, {now.n} now)")
        for name in NUMBERS:
            if name in written.columns and not _same(getattr(row, name), now[name]):
                what = f"{metric} {name}" if name in ("mean", "std") else name
                problems.append(f"cell {cell}: {what} {getattr(row, name)} in the report, {now[name]} from MLflow")
    return problems


def compare_text(written: Path, fresh: Path) -> list[str]:
    problems = []
    for path in sorted([*written.glob("*.tex"), *written.glob("report.md")]):
        other = fresh / path.name
        if not other.exists():
            problems.append(f"{path.name}: MLflow's runs no longer give this table")
            continue
        old = [line for line in path.read_text().splitlines() if PRODUCED not in line]
        new = [line for line in other.read_text().splitlines() if PRODUCED not in line]
        for number, (a, b) in enumerate(zip(old, new, strict=False), start=1):
            if a != b:
                problems.append(f"{path.name} line {number}: {a.strip()!r} in the report, {b.strip()!r} from MLflow")
                break
        else:
            if len(old) != len(new):
                problems.append(f"{path.name}: {len(old)} lines in the report, {len(new)} from MLflow")
    return problems


def read_provenance(folder: Path) -> tuple[dict, list[dict]]:
    """The report's `provenance.json` and the studies it was written from, or one line saying it is
    damaged (cut short, not an object, a study or its store missing: edited by hand, a crash mid-write)."""
    damaged = UserInputError("FOLDER", str(folder), f"{PROVENANCE} is damaged; write the report again with "
                                                    "`orchestrator report`")
    try:
        provenance = json.loads((folder / PROVENANCE).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise damaged from None
    sources = (provenance.get("sources") or [provenance]) if isinstance(provenance, dict) else None
    if not isinstance(sources, list) or not all(
            isinstance(s, dict) and isinstance(s.get("tracking_uri"), str) and isinstance(s.get("study"), str)
            for s in sources):
        raise damaged
    return provenance, sources


def verify(folder: str | Path, tracking_uri: str | None = None) -> list[str]:
    """Every difference between the report in `folder` and what MLflow holds now; empty when none."""
    folder = Path(folder)
    provenance, sources = read_provenance(folder)
    studies = [collect(tracking_uri or s["tracking_uri"], s["study"], s.get("study_uid")) for s in sources]
    runs = studies[0] if len(studies) == 1 else combine(studies)
    with tempfile.TemporaryDirectory(prefix="verify-") as scratch:
        fresh = Path(scratch)
        build_report(runs, fresh, tuple(provenance.get("formats") or ("markdown", "latex", "csv")))
        problems = compare_folders(folder, fresh, runs.test_metric)
    changed = other_producer(provenance, sources, folder) if problems else None
    return problems + ([changed] if changed else [])


def other_producer(provenance: dict, sources: list[dict], folder: Path) -> str | None:
    """When another version or commit wrote the report, a line saying so: a column or a table's wording
    that differs may be what changed between them, not MLflow's numbers."""
    wrote, now = provenance.get("commit"), producer()
    if not isinstance(wrote, str) or wrote == now["commit"] or "unknown" in (wrote, now["commit"]):
        return None
    studies = " ".join(str(s["study"]) for s in sources)
    return (f"the report was written by version {provenance.get('version', '?')} at commit {wrote[:12]}, this is "
            f"{now['version']} at {now['commit'][:12]}: a column or wording that differs may be that change; "
            f"`orchestrator report {studies} --out {folder}` writes it again with this version")


def compare_folders(written: Path, fresh: Path, metric: str) -> list[str]:
    """Every difference between a written report and one built again: the cells' runs and numbers
    first (the clearest messages), then every value of every CSV, then the tables' text."""
    problems = []
    if (written / "cells.csv").exists() and (fresh / "cells.csv").exists():
        problems += compare_cells(pd.read_csv(written / "cells.csv"), pd.read_csv(fresh / "cells.csv"), metric)
    problems += compare_csvs(written, fresh, skip_cells=bool(problems))
    return problems + compare_text(written, fresh)


KEYS = {"cells.csv": ("cell",), "runs.csv": ("run_id",), "stats.csv": ("cell", "baseline")}


def compare_csvs(written: Path, fresh: Path, skip_cells: bool = False) -> list[str]:
    """Each CSV of the report against the fresh one, value by value, rows matched by their key
    (`run_id` in runs.csv, the cell in cells.csv, cell and baseline in stats.csv); the first
    difference of each row is named. cells.csv is skipped when its numbers already differ."""
    problems = []
    for path in sorted(written.glob("*.csv")):
        if skip_cells and path.name == "cells.csv":
            continue
        other = fresh / path.name
        if not other.exists():
            problems.append(f"{path.name}: MLflow's runs no longer give this table")
            continue
        try:
            old, new = pd.read_csv(path), pd.read_csv(other)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
            problems.append(f"{path.name}: cannot be read ({str(error).splitlines()[0][:120]})")
            continue
        if list(old.columns) != list(new.columns):
            problems.append(f"{path.name}: columns {', '.join(map(str, old.columns))} in the report, "
                            f"{', '.join(map(str, new.columns))} from MLflow")
            continue
        key = [k for k in KEYS.get(path.name, ()) if k in old.columns]
        if not key or old.duplicated(key).any() or new.duplicated(key).any():
            old, new = old.assign(_row=range(1, len(old) + 1)), new.assign(_row=range(1, len(new) + 1))
            key = ["_row"]
        old, new = old.set_index(key), new.set_index(key)
        for row in old.index.difference(new.index, sort=False):
            problems.append(f"{path.name} row {_name(key, row)}: in the report, not from MLflow")
        for row in new.index.difference(old.index, sort=False):
            problems.append(f"{path.name} row {_name(key, row)}: from MLflow, not in the report")
        for row in old.index.intersection(new.index, sort=False):
            a, b = old.loc[row], new.loc[row]
            for column in old.columns:
                if not _same(a[column], b[column]):
                    problems.append(f"{path.name} row {_name(key, row)}: {column} {a[column]} in the report, "
                                    f"{b[column]} from MLflow")
                    break
    return problems


def _name(key: list[str], row) -> str:
    values = row if isinstance(row, tuple) else (row,)
    return " · ".join(f"{k}={v}" if k != "_row" else str(v) for k, v in zip(key, values, strict=True))
