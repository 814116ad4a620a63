"""What a paper's supplementary material needs beside the tables: the compute spent per cell and
phase (`compute.csv`), the reproducibility section answering the ACL and NeurIPS checklists from the
study record (`reproducibility.md`, `.tex`, `.json`), and each replicate's exact config with its
reported scores (`replicates.json`, what `orchestrator reproduce` reruns)."""

from __future__ import annotations

import json
from pathlib import Path

from reports.compute import spent, study_resources, study_trials
from reports.evp import curves, tuning_budget
from reports.reproducibility import items, to_json, to_latex, to_markdown

COMPUTE_FILE = "compute.csv"
BUDGET_FILE = "budget.csv"  # each tuned cell's tuning budget and expected best dev at it
CURVES_FILE = "expected_dev.csv"  # each tuned cell's expected best dev for n = 1..N trials
SECTION = "reproducibility"  # .md, .tex, .json: the checklist answers


def write_supplement(context, out: Path, formats: tuple[str, ...]) -> tuple[list[Path], list[str]]:
    """Write the supplementary files; returns them and the Markdown sections report.md appends."""
    runs = context.runs
    written: list[Path] = []
    trials = study_trials(runs)
    if not trials.empty and "wall_s" in trials:
        spent(trials, study_resources(runs)).to_csv(out / COMPUTE_FILE, index=False)
        written.append(out / COMPUTE_FILE)
    budget = tuning_budget(runs)
    if not budget.empty:
        budget.to_csv(out / BUDGET_FILE, index=False)
        drawn = curves(runs)
        frames = [points.assign(cell=cell) for cell, points in drawn.items()]
        if frames:
            import pandas as pd

            pd.concat(frames, ignore_index=True)[["cell", "trials", "expected_best", "sd"]].to_csv(
                out / CURVES_FILE, index=False)
            written.append(out / CURVES_FILE)
        written.append(out / BUDGET_FILE)
    written += write_reproduction_inputs(runs, out)
    answers = items(runs, context.summary, context.stats)
    (out / f"{SECTION}.json").write_text(json.dumps(to_json(answers), indent=1, default=str))
    section = to_markdown(answers, runs.name)
    written.append(out / f"{SECTION}.json")
    if "markdown" in formats:
        (out / f"{SECTION}.md").write_text("\n".join(section))
        written.append(out / f"{SECTION}.md")
    if "latex" in formats:
        (out / f"{SECTION}.tex").write_text(to_latex(answers))
        written.append(out / f"{SECTION}.tex")
    return written, section


REPLICATES_FILE = "replicates.json"  # every completed replicate: its exact config and what it reported


def write_reproduction_inputs(runs, out: Path) -> list[Path]:
    """What `orchestrator reproduce` reads from a report folder: the replicates, the study record and the
    launch's locked environment (from the MLflow parent run)."""
    from reports.environment import LOCK_FILE
    from reports.record import RECORD_FILE

    if runs.record is None:  # a report across studies: reproduce each study from its own report
        return []
    written = [out / REPLICATES_FILE, out / RECORD_FILE]
    (out / REPLICATES_FILE).write_text(json.dumps(replicate_entries(runs), indent=1))
    (out / RECORD_FILE).write_text(runs.record.to_json())
    lock = runs.parent_artifact(LOCK_FILE)
    if lock is not None:
        (out / LOCK_FILE).write_text(lock)
        written.append(out / LOCK_FILE)
    return written


def replicate_entries(runs) -> list[dict]:
    """Each completed replicate run as `orchestrator reproduce` needs it: its cell and seed, the config
    its trial got (exact from the run's `orchestrator.config` tag; rebuilt from the record for runs from
    before the tag), its kind, the dev and test scores it reported and the machine it ran on."""
    record = runs.record
    if record is None:
        return []
    dev = f"best_{runs.metric}"
    out = []
    for _, row in runs.replicates().iterrows():
        if row.outcome != "completed":
            continue
        values = {axis: _json_value(row[axis]) for axis in runs.axes}
        config = runs.configs.get(row.run_id)
        source = "exact"
        if config is None:
            source = "rebuilt from the study record"
            config = {**record.base, **values, **{t: _json_value(row[t]) for t in runs.tuned if t in row},
                      "seed": int(row.seed), "score_test": True}
        reported = {name: float(row[name]) for name in [dev, *sorted(c for c in row.index if c.startswith("test_"))]
                    if name in row and _is_number(row[name])}
        out.append({"run_id": row.run_id, "trial_key": row.trial_key, "cell": row.cell, "values": values,
                    "seed": int(row.seed), "kind": record.kind.path, "metric": runs.metric, "config": config,
                    "config_source": source, "reported": reported,
                    "hardware": {k.removeprefix("hardware."): row[k] for k in row.index
                                 if str(k).startswith("hardware.") and isinstance(row[k], str)}})
    return out


def _json_value(value):
    return value.item() if hasattr(value, "item") else value


def _is_number(value) -> bool:
    import math

    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(float(value))
