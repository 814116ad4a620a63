"""The example studies' reports from synthetic runs: each example's own plan (axes, `layer: all`
expanded per model, seeds, tuning, `report:` block) read from its YAML, with made-up but plausible
scores, so the report's tables can be laid out and compiled without running a study."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from orchestrator.study.config import StudyConfig
from reports.collect import StudyRuns
from reports.record import StudyRecord

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEPTHS = {"sentence-transformers/all-MiniLM-L6-v2": 6, "sentence-transformers/all-mpnet-base-v2": 12}
PARAMS_PER_LAYER = {6: 1.78e6, 12: 7.09e6}  # a MiniLM block, an MPNet block
EMBEDDINGS = {6: 11.9e6, 12: 23.8e6}
PAIRS = 200  # test pairs of the synthetic prediction files


@dataclass(frozen=True)
class SyntheticRuns(StudyRuns):
    """StudyRuns whose per-pair test predictions are made up from the run's score (no MLflow)."""

    noise: dict = field(default_factory=dict)  # run id -> the prediction noise of its test pairs

    def predictions(self, run_id: str) -> pd.DataFrame | None:
        if run_id not in self.noise:
            return None
        gold = np.random.default_rng(0).uniform(0, 5, PAIRS)
        noise = np.random.default_rng(abs(hash(run_id)) % 2**32).normal(0, self.noise[run_id], PAIRS)
        return pd.DataFrame({"pair": range(PAIRS), "prediction": gold + noise, "score": gold})


def expand_cells(study: StudyConfig) -> list[dict]:
    """The plan's cells in the YAML's axis order, `layer: all` as 0..depth of each cell's model."""
    axes = {name: value if isinstance(value, list) else [value] for name, value in study.ablate.items()}
    cells = []
    others = [name for name in axes if name != "layer"]
    for combo in itertools.product(*[axes[name] for name in others]):
        values = dict(zip(others, combo, strict=True))
        depth = DEPTHS[values.get("model", study.model)]
        raw = study.ablate.get("layer")
        layers = list(range(depth + 1)) if raw == "all" else axes.get("layer", [depth])
        for layer in layers:
            cells.append({name: layer if name == "layer" else values[name] for name in study.ablate})
    return cells


def score(layer: int, depth: int) -> float:
    """A truncation curve: the full model near 85, the embedding layer near 58."""
    return 58.0 + 27.5 * (layer / depth) ** 1.6


def example_runs(name: str) -> SyntheticRuns:
    """The report input of `examples/<name>.yaml` after a complete launch, with synthetic scores."""
    raw = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    study = StudyConfig.model_validate(raw)
    seeds = study.replicate.seeds if isinstance(study.replicate.seeds, list) else list(range(study.replicate.seeds))
    cells = expand_cells(study)
    epochs = int(study.train.get("epochs", 1))
    rng = np.random.default_rng(7)
    rows, noise = [], {}
    for index, values in enumerate(cells):
        key = StudyRecord.cell_key(values)
        depth = DEPTHS[values.get("model", study.model)]
        layer = values["layer"]
        mean = score(layer, depth)
        common = {"cell": key, **values, "status": "FINISHED", "error": None, "epoch": epochs,
                  "params": EMBEDDINGS[depth] + layer * PARAMS_PER_LAYER[depth]}
        if study.tune:
            for trial in range(study.tune.trials):
                pruned = trial == study.tune.trials - 1
                rows.append({**common, "run_id": f"t{index}-{trial}", "trial_key": f"c{index}-t{trial}",
                             "phase": "tune", "seed": study.tune.seed, "outcome": "pruned" if pruned else "completed",
                             "lr": float(2e-5 * 3 ** trial), "best_dev_spearman": mean + 2 + trial * 0.3,
                             "best_epoch": 1})
        for seed in seeds:
            run_id = f"r{index}-{seed}"
            test = mean + rng.normal(0, 0.25)
            noise[run_id] = 0.4 + (100 - test) / 25
            rows.append({**common, "run_id": run_id, "trial_key": f"c{index}-s{seed}", "phase": "replicate",
                         "seed": seed, "outcome": "completed", "lr": study.train.get("lr", 1e-4),
                         "test_spearman": test, "test_pearson": test + 0.4, "best_dev_spearman": mean + 4,
                         "best_epoch": epochs if layer < depth else max(1, epochs - 1)})
    runs = pd.DataFrame(rows)
    return SyntheticRuns(study.name, runs, list(study.ablate), "dev_spearman", raw.get("report") or {},
                         planned_seeds=len(seeds), tuned=list(study.tune.params) if study.tune else [],
                         planned_cells=[(StudyRecord.cell_key(c), c) for c in cells], noise=noise)

