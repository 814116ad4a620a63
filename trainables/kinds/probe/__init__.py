"""`probe`: every layer of an encoder scored zero-shot, no training; one report with the
dev-selected layer's metrics as `dev_*`/`test_*` and every layer's as `layer{k}_*`."""

from __future__ import annotations

import math

from pydantic import Field

from trainables.contract import PoolingLayersFields, PostprocessFields, PromptFields, Report, TrialConfig
from trainables.data.declaration import TASK_HELP, TaskRef
from trainables.kinds.base import TrainableKind, check_pooling_layers, check_postprocess, check_special_tokens
from trainables.poolings import POOLINGS


class ProbeConfig(TrialConfig, PromptFields, PostprocessFields, PoolingLayersFields):
    model: str
    task: TaskRef = Field("stsb", description=TASK_HELP)
    language: str | None = None
    layers: list[int] | None = Field(None, description="layers to score; null scores 0..L")
    pooling: str = "mean"
    splits: list[str] = ["dev", "test"]
    max_seq_length: int = Field(128, ge=2)
    precision: str = Field("fp32", description="fp32 (the default, as every training kind scores), bf16 or auto "
                                               "(bf16 where the hardware runs it fast)")
    device: str = "auto"
    num_threads: int | None = Field(None, ge=1)
    data_dir: str | None = None
    max_eval_samples: int | None = Field(None, ge=1)
    max_train_samples: int | None = Field(None, ge=1, description="the train pairs a post-processing is fitted on")


class ProbeKind(TrainableKind):
    example = {"layers": [0, 2], "max_eval_samples": 40}
    Config = ProbeConfig

    def num_reports(self, cfg) -> int:
        return 1

    names = {"pooling": POOLINGS}

    def layer_bounds(self, cfg):
        return [("layers", cfg.layers, cfg.model)]

    def check_names(self, cfg, key_of) -> None:
        super().check_names(cfg, key_of)
        check_postprocess(cfg, key_of)
        check_pooling_layers(cfg, key_of, sorted(set(cfg.layers)) if cfg.layers is not None else [])
        check_special_tokens(cfg, key_of)

    def run(self, config: dict, report: Report, checkpoint_dir: str | None = None) -> dict:
        from trainables.evaluation.probe import probe_layers

        cfg = self.parse({**config, "splits": ["dev", "test"]})
        rows = probe_layers(cfg)
        primary, _ = self.metric(cfg)
        scored = [r for r in rows if math.isfinite(r[primary])] or rows  # a constant layer has no score
        best = max(scored, key=lambda r: r[primary])
        metrics = {f"layer{r['layer']}_{k}": v for r in rows for k, v in r.items() if k != "layer"}
        metrics.update({k: v for k, v in best.items() if k != "layer"})
        metrics["best_layer"] = best["layer"]
        report(metrics, checkpoint_dir=None)
        return metrics
