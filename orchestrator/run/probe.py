"""`orchestrator probe` in this process: a model's every layer pooled and scored in one pass (or a suite),
its architecture, pooling and layers checked first as a study's are."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from trainables.errors import UserInputError


def probe(model: str, *, task: str = "stsb", language: str | None = None, split: str = "test",
          pooling: str = "mean", layers: Sequence[int] | None = None, data_dir: str | None = None,
          max_seq_length: int = 128, precision: str = "auto", device: str = "auto", suite: str | None = None,
          max_eval_samples: int | None = None) -> pd.DataFrame:
    """Zero-shot layer profile of an encoder, as `orchestrator probe`: every layer (or `layers`) pooled
    and scored in one forward pass per batch; one row per layer with its scores (Spearman x100) and
    parameter count. `suite="sts"` scores STS12-16, STS-B and SICK-R (test) and their average instead."""
    from trainables.contract import parse_config
    from trainables.evaluation.probe import probe_layers, probe_suite
    from trainables.evaluation.sts_suite import suite_tasks
    from trainables.kinds.probe import ProbeConfig

    if split not in ("dev", "test"):
        raise UserInputError("--split", split, "use dev or test")
    if suite is not None:
        suite_tasks(suite)
    cfg = parse_config(ProbeConfig, dict(
        model=model, task=task, language=language, layers=list(layers) if layers is not None else None,
        pooling=pooling, splits=[split], max_seq_length=max_seq_length, precision=precision, device=device,
        data_dir=data_dir, max_eval_samples=max_eval_samples))
    check_probed_model(model, pooling, layers)
    if suite is not None:
        return pd.DataFrame(probe_suite(cfg, suite))
    return pd.DataFrame([{k.removeprefix(f"{split}_"): v for k, v in row.items()} for row in probe_layers(cfg)])


def check_probed_model(model: str, pooling: str, layers: Sequence[int] | None) -> None:
    """The probe's model checked as a study's is, before any data is read: its architecture in the layer
    table, the pooling one it can take, its layers its entry's (cached once per model files)."""
    from trainables.models.architectures import refuse_pooling, require_architecture
    from trainables.models.files import model_config, model_depth
    from trainables.models.layer_check import check_model_layers

    require_architecture(model, "--model")
    refuse_pooling(model_config(model), pooling, "--pooling")
    depth = model_depth(model)  # a layer the model lacks is the probe's own one line, after this
    check_model_layers(model, [k for k in layers if 0 <= k <= depth] if layers is not None else None)
