"""What a study spent: every trial's wall time (the seconds its trial function ran on its worker, summed
over its attempts, as the journal's stamps record it) times the CPUs and GPUs it held (`resources`),
per cell, per phase (tuning, replicates) and in total, with the share spent on pruned trials, the
machines the trials ran on and the estimate that was made before the launch.

One function of a tidy frame (one row per trial: cell, phase, outcome, wall_s) serves both the driver,
which logs the totals onto the study's MLflow parent run, and the report."""

from __future__ import annotations

import math

import pandas as pd

from reports.store import HARDWARE_TAG

PHASES = ("tune", "replicate")
PHASE_NAMES = {"tune": "tuning", "replicate": "replicates"}


def trial_compute(wall_s: float | None, resources: dict[str, float]) -> dict[str, float]:
    """`wall_s`, `cpu_hours`, `gpu_hours` of one trial (empty when its wall time was not recorded)."""
    if wall_s is None or not math.isfinite(wall_s):
        return {}
    return {"wall_s": float(wall_s), "cpu_hours": wall_s * float(resources.get("cpu", 1.0)) / 3600,
            "gpu_hours": wall_s * float(resources.get("gpu", 0.0)) / 3600}


def with_hours(trials: pd.DataFrame, resources: dict[str, float]) -> pd.DataFrame:
    """The trials with `wall_h`, `cpu_hours` and `gpu_hours` from their wall time and the resources."""
    wall = pd.to_numeric(trials["wall_s"], errors="coerce") if "wall_s" in trials else pd.Series(
        math.nan, index=trials.index, dtype=float)
    return trials.assign(wall_h=wall / 3600, cpu_hours=wall * float(resources.get("cpu", 1.0)) / 3600,
                         gpu_hours=wall * float(resources.get("gpu", 0.0)) / 3600)


def spent(trials: pd.DataFrame, resources: dict[str, float]) -> pd.DataFrame:
    """One row per (cell, phase) and one `total` row per phase and overall: trials, trials with a
    recorded wall time, pruned trials, wall-, CPU- and GPU-hours and what of it went to pruned trials."""
    if trials.empty:
        return pd.DataFrame(columns=["cell", "phase", "trials", "timed", "pruned", "wall_hours", "cpu_hours",
                                     "gpu_hours", "pruned_cpu_hours", "pruned_gpu_hours"])
    frame = with_hours(trials, resources)
    frame = frame.assign(pruned=frame.outcome == "pruned")
    rows = []
    groups = [(cell, phase) for cell in dict.fromkeys(frame.cell) for phase in PHASES]
    groups += [("total", phase) for phase in PHASES] + [("total", "all")]
    for cell, phase in groups:
        part = frame[((frame.cell == cell) | (cell == "total")) & ((frame.phase == phase) | (phase == "all"))]
        if not len(part) and cell != "total":
            continue
        pruned = part[part.pruned]
        rows.append({"cell": cell, "phase": phase, "trials": len(part), "timed": int(part.wall_h.notna().sum()),
                     "pruned": len(pruned), "wall_hours": part.wall_h.sum(), "cpu_hours": part.cpu_hours.sum(),
                     "gpu_hours": part.gpu_hours.sum(), "pruned_cpu_hours": pruned.cpu_hours.sum(),
                     "pruned_gpu_hours": pruned.gpu_hours.sum()})
    return pd.DataFrame(rows)


def totals(trials: pd.DataFrame, resources: dict[str, float]) -> dict[str, float]:
    """The study's figures as MLflow metrics of its parent run (`compute.*`)."""
    table = spent(trials, resources).set_index(["cell", "phase"])
    if table.empty:
        return {}
    out = {}
    for phase in (*PHASES, "all"):
        row = table.loc[("total", phase)]
        prefix = "compute." if phase == "all" else f"compute.{phase}."
        out.update({f"{prefix}cpu_hours": row.cpu_hours, f"{prefix}gpu_hours": row.gpu_hours,
                    f"{prefix}wall_hours": row.wall_hours, f"{prefix}trials": float(row.trials)})
    everything = table.loc[("total", "all")]
    out["compute.pruned_share"] = (everything.pruned_cpu_hours / everything.cpu_hours
                                   if everything.cpu_hours > 0 else 0.0)
    return out


def hardware(trials: pd.DataFrame) -> dict[str, list[str]]:
    """The distinct machines' facts the trials' workers reported (cpu_model, gpu_model, cpus, ...)."""
    out: dict[str, list[str]] = {}
    for column in sorted(c for c in trials.columns if str(c).startswith(HARDWARE_TAG)):
        values = sorted({str(v) for v in trials[column].dropna()})
        if values:
            out[column.removeprefix(HARDWARE_TAG)] = values
    return out


def hours(value: float) -> str:
    """Hours as a table shows them: three significant digits (a laptop study spends thousandths)."""
    if value is None or not math.isfinite(value):
        return "—"
    return "0" if value == 0 else f"{value:.3g}"


def study_resources(runs) -> dict[str, float]:
    """What each trial held: the record's `resources`, else the study file's, else one CPU."""
    if runs.record is not None and runs.record.resources:
        return dict(runs.record.resources)
    declared = (getattr(runs, "study_file", None) or {}).get("resources") or {}
    return {"cpu": float(declared.get("cpu", 1.0)), "gpu": float(declared.get("gpu", 0.0))}


def study_trials(runs) -> pd.DataFrame:
    """Every trial run that spent compute: the report's runs and the superseded replicates."""
    frames = [runs.runs] + ([runs.superseded] if runs.superseded is not None and len(runs.superseded) else [])
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else runs.runs
    if frame.empty or "phase" not in frame:
        return pd.DataFrame(columns=["cell", "phase", "outcome", "wall_s"])
    return frame[frame.phase.isin(PHASES)]


def estimate_note(estimate: dict | None, table: pd.DataFrame) -> str | None:
    """The pilot's estimate beside what the study spent, in trial-hours (wall time, before × resources)."""
    if not estimate:
        return None
    total = table.set_index(["cell", "phase"])
    spent_tune, spent_rep = (total.loc[("total", p), "wall_hours"] for p in PHASES)
    how = "budget's pilot" if estimate.get("from_budget") else "plan --estimate"
    spent_all = spent_tune + spent_rep
    share = f" ({100 * spent_all / estimate['trial_hours']:.0f} % of the estimate)" if estimate["trial_hours"] else ""
    return (f"estimate ({how}, before the launch): tuning {hours(estimate['tuning_trial_hours'])}, replicates "
            f"{hours(estimate['replicate_trial_hours'])}, total {hours(estimate['trial_hours'])} trial-hours (wall "
            f"{hours(estimate['wall_hours'])} h on {estimate['slots']:g} slots); spent: tuning {hours(spent_tune)}, "
            f"replicates {hours(spent_rep)}, total {hours(spent_all)} trial-hours{share}")


def compute_grid(runs):
    """The report's compute table: per cell the tuning and replicate trials and their CPU-hours (and
    GPU-hours when trials held GPUs), the share of the cell's CPU-hours spent on pruned trials, totals."""
    from reports.captions import caption, cell_labels, varying
    from reports.render import Cell, Grid, Note

    resources = study_resources(runs)
    trials = study_trials(runs)
    if trials.empty or "wall_s" not in trials or pd.to_numeric(trials.wall_s, errors="coerce").isna().all():
        return None
    table = spent(trials, resources)
    indexed = table.set_index(["cell", "phase"])
    gpu = resources.get("gpu", 0.0) > 0
    axes = varying(runs, runs.axes) or runs.axes[:1]
    shown = cell_labels(runs, axes)
    rows = []
    for cell in [*dict.fromkeys(table.cell[table.cell != "total"]), "total"]:
        parts = {phase: indexed.loc[(cell, phase)] for phase in PHASES if (cell, phase) in indexed.index}
        cpu = sum(p.cpu_hours for p in parts.values())
        pruned = sum(p.pruned_cpu_hours for p in parts.values())
        cells = []
        for phase in PHASES:
            part = parts.get(phase)
            cells += [Cell(text=str(int(part.trials)) if part is not None else "0"),
                      Cell(text=hours(part.cpu_hours) if part is not None else "0")]
        cells += [Cell(text=hours(cpu)), Cell(text=f"{100 * pruned / cpu:.0f} %" if cpu > 0 else "—")]
        if gpu:
            cells.append(Cell(text=hours(sum(p.gpu_hours for p in parts.values()))))
        rows.append(("Total" if cell == "total" else shown.get(cell, cell), cells))
    everything = indexed.loc[("total", "all")]
    held = f"{resources.get('cpu', 1):g} CPU{'s' if resources.get('cpu', 1) != 1 else ''}" + (
        f" and {resources['gpu']:g} GPU{'s' if resources['gpu'] != 1 else ''}" if gpu else "")
    notes: list = [Note(f"CPU-h (GPU-h): each trial's wall time × the {held} it held (resources); wall time: the "
                        "seconds its trial function ran on its worker (building, training, evaluating, checkpoints), "
                        "summed over its attempts (retries and resumed launches included); Ray's scheduling, a fresh "
                        "worker's start and imports, and the driver are outside it",
                        f"CPU-h: trial wall time × {held} per trial"),
                   Note(f"Pruned: the share of CPU-hours spent on trials the cell's pruner stopped early "
                        f"({hours(everything.pruned_cpu_hours)} of {hours(everything.cpu_hours)} CPU-h in all)")]
    machines = hardware(trials)
    shown_facts = {k: v for k, v in machines.items() if k in ("cpu_model", "cpus", "memory_gib", "gpu_model", "gpus")}
    if shown_facts:
        text = "ran on: " + "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in shown_facts.items())
        notes.append(Note(text, text))
    if int(everything.timed) < int(everything.trials):
        notes.append(Note(f"{int(everything.trials - everything.timed)} of {int(everything.trials)} trials have no "
                          "recorded wall time (run before it was tracked): the sums leave them out",
                          "some trials have no recorded wall time"))
    note = estimate_note(runs.record.estimate if runs.record is not None else None, table)
    if note:
        notes.append(Note(note, note))
    columns = ["Tuning trials", "Tuning CPU-h", "Replicates", "Replicate CPU-h", "CPU-h", "Pruned"]
    what = "Compute spent per cell: trials and CPU-hours of tuning and of the replicates, in all, and the share of " \
           "pruned trials" + (", GPU-hours" if gpu else "")
    from reports.captions import axes_label, constants_phrase

    return Grid(caption(what, constants_phrase(runs, axes[0] if axes else None)), axes_label(runs, axes),
                columns + (["GPU-h"] if gpu else []), rows, notes, 3)
