"""`save:` models you can load: a replicate that exported its model (sentence-transformers format,
`model/` beside its last checkpoint) has it copied to `studies/NAME/models/<cell>/seed<k>/` before
the checkpoint is removed. `all_replicates` keeps and logs every one; `best_per_cell` keeps, once
all of a cell's replicates are finished, only the one with the best dev score (test never decides)
and logs that one to MLflow as the run's `model/` artifacts, its path tagged `orchestrator.model_path`.
Each kept model's card (the README.md sentence-transformers writes, its layout kept) gets a section on how it
was trained: the study, cell and seed, the trial's settings, the data with their hashes, dev and test scores
and the trial's wall time, and the tags a hub page reads.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from orchestrator.study.journal import Outcome, TrialRecord
from orchestrator.study.state import StudyState
from trainables.training.checkpoints import MODEL_DIR

MODEL_PATH = "orchestrator.model_path"
logger = logging.getLogger("orchestrator.models")


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
    try:
        write_card(target, state.plan, record, state._value(record))
    except (OSError, ValueError, yaml.YAMLError) as exc:  # the card says how it was trained; the model stands
        logger.warning("the model card of %s was not written: %s", target, exc)
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


CARD_SECTION = "## Training (ablation-orchestrator)"
CARD_TAG = "ablation-orchestrator"
SHOWN = ("layer", "pooling", "pooling_layers", "loss", "lr", "epochs", "batch_size", "max_seq_length", "warmup_ratio",
         "weight_decay", "layer_lr_decay", "lora_rank", "lora_alpha", "postprocess", "postprocess_dim", "prompt",
         "include_prompt", "append_eos", "projection_dim", "max_train_samples", "max_eval_samples", "precision",
         "device")


def write_card(folder: Path, plan: Any, record: TrialRecord, best_dev: float | None) -> Path:
    """`folder`'s README.md (sentence-transformers' card) with how this model was trained, before its `Usage`
    section: study, cell, seed, settings, data (rows and sha256 per split), dev (the selection's) and test
    scores, wall time; the front matter gains the project's tag and the base model where it is a hub id."""
    card = folder / "README.md"
    text = card.read_text(encoding="utf-8") if card.is_file() else ""
    front, body = _front_matter(text)
    config = record.config
    model = str(config.get("model", ""))
    tags = front.get("tags")
    front["tags"] = [*(tags if isinstance(tags, list) else [tags] if tags else [])]
    if CARD_TAG not in front["tags"]:
        front["tags"].append(CARD_TAG)
    if model and not Path(model).expanduser().exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        front["base_model"] = model
    else:  # a local folder is no hub id a page could link
        front.pop("base_model", None)
    test_metric = plan.metric.replace("dev_", "test_", 1)
    test = record.last.get(test_metric)
    lines = [CARD_SECTION, "",
             f"Trained by a study of [ablation-orchestrator](https://pypi.org/project/ablation-orchestrator/): "
             f"study `{plan.study.name}`, cell `{record.cell_key or plan.cells[record.cell].key}`, seed "
             f"{record.seed}, kind `{plan.study.trainable}`.",
             "", f"- **Base model:** `{model}`",
             f"- **Dev {plan.metric.removeprefix('dev_')} (best epoch, what selection read):** "
             + (f"{best_dev:.4f}" if best_dev is not None else "none"),
             f"- **Test {test_metric.removeprefix('test_')} (scored once, never selected on):** "
             + (f"{test:.4f}" if isinstance(test, int | float) else "not scored"),
             "- **Wall time of the trial:** " + (f"{record.wall_s:.0f} s" if record.wall_s is not None
                                                   else "not recorded"),
             "- **Hardware:** " + (", ".join(f"{k} {v}" for k, v in record.hardware.items()) or "not recorded"),
             "", "| setting | value |", "|---|---|"]
    lines += [f"| `{name}` | `{config[name]!r}` |" for name in SHOWN if name in config]
    data = list(getattr(plan, "data", ()) or ())
    if data:
        lines += ["", "| data | split | rows | sha256 |", "|---|---|---:|---|"]
        lines += [f"| {d.name} ({d.language}) | {split} | {info.rows:,} | `{info.sha256[:16]}` |"
                  for d in data for split, info in d.splits.items()]
    section = "\n".join(lines) + "\n"
    body = _without_section(body)
    at = body.find("\n## Usage")
    body = body + "\n" + section if at < 0 else body[:at + 1] + section + "\n" + body[at + 1:]
    card.write_text(_with_front_matter(front, body), encoding="utf-8")
    return card


def _front_matter(text: str) -> tuple[dict, str]:
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end > 0:
            front = yaml.safe_load(text[4:end]) or {}
            if isinstance(front, dict):
                return front, text[end + 5:]
    return {}, text


def _with_front_matter(front: dict, body: str) -> str:
    return "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n" + body.lstrip("\n")


def _without_section(body: str) -> str:
    """The body without an earlier training section (a card written again keeps one)."""
    start = body.find(CARD_SECTION)
    if start < 0:
        return body
    end = body.find("\n## ", start + len(CARD_SECTION))
    return body[:start] + (body[end + 1:] if end >= 0 else "")
