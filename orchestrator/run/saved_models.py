"""`save:` models you can load: a replicate that exported its model (sentence-transformers format,
`model/` beside its last checkpoint) has it copied to `studies/NAME/models/<cell>/seed<k>/` before
the checkpoint is removed. `all_replicates` keeps and logs every one; `best_per_cell` keeps, once
all of a cell's replicates are finished, only the one with the best dev score (test never decides)
and logs that one to MLflow as the run's `model/` artifacts, its path tagged `orchestrator.model_path`.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from orchestrator.study.journal import Outcome, TrialRecord
from orchestrator.study.state import StudyState
from trainables.training.checkpoints import MODEL_DIR

MODEL_PATH = "orchestrator.model_path"


def model_folder(models_dir: str | Path, cell_key: str, record: TrialRecord) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", cell_key)
    rerun = re.search(r"-r\d+$", record.key)  # a replicate rerun after more tuning: c0-s5-r1
    return Path(models_dir) / slug / (f"seed{record.seed}" + (rerun.group(0) if rerun else ""))


def publish(tracker, record: TrialRecord, folder: Path) -> None:
    tracker.set_tag(record.key, MODEL_PATH, str(folder))
    log = getattr(tracker, "log_artifacts", None)
    if log is not None:
        log(record.key, str(folder), MODEL_DIR)


def keep_model(state: StudyState, tracker, record: TrialRecord, models_dir: str | Path) -> Path | None:
    """Copy the finished replicate's model out of its checkpoint; apply the study's `save:` policy."""
    if record.phase != "replicate" or record.outcome != Outcome.COMPLETED:
        return None
    cell = state.plan.cells[record.cell]
    target = model_folder(models_dir, cell.key, record)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(Path(record.checkpoint) / MODEL_DIR, target)
    if state.plan.study.save == "all_replicates":
        publish(tracker, record, target)
        return target
    if not state.cell_done(cell):  # more seeds may come (adaptive seeds): choose when the cell is done
        return target
    replicates = state.replicates(cell)
    kept = [r for r in replicates if r.outcome == Outcome.COMPLETED
            and model_folder(models_dir, cell.key, r).exists() and state._value(r) is not None]
    if not kept:
        return target
    sign = 1 if state.plan.mode == "max" else -1
    best = max(kept, key=lambda r: sign * state._value(r))
    for other in kept:
        if other is not best:
            shutil.rmtree(model_folder(models_dir, cell.key, other), ignore_errors=True)
    publish(tracker, best, model_folder(models_dir, cell.key, best))
    return model_folder(models_dir, cell.key, best)
