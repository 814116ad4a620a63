"""What tables and plots call the built-in axes, values and metrics (`Layer`, `CLS`,
`all-MiniLM-L6-v2`, `Test Spearman`); `report.labels` overrides any of them by its study name."""

from __future__ import annotations

import math

AXES = {"layer": "Layer", "pooling": "Pooling", "model": "Model", "epochs": "Epochs", "lr": "LR",
        "batch_size": "Batch size", "loss": "Loss", "method": "Method", "language": "Language", "task": "Task",
        "study": "Study", "mode": "Mode", "pretrain": "Pretraining", "pretrain_steps": "DAPT steps",
        "max_seq_length": "Max. length", "projection_dim": "Projection", "random_init": "Random init",
        "warmup_ratio": "Warmup", "weight_decay": "Weight decay", "temperature": "Temperature",
        "partner_layer": "Partner layer", "bi_lr": "Bi-encoder LR", "cross_lr": "Cross-encoder LR",
        "cycles": "Cycles", "select": "Selection"}
VALUES = {"cls": "CLS", "mean_sqrt_len": "mean/√len", "simcse": "SimCSE", "micse": "miCSE",
          "cosine_mse": "cosine MSE", "cosent": "CoSENT", "angle": "AnglE", "cosine_bce": "cosine BCE",
          "cosine_bce_affine": "cosine BCE (affine)", "mlm": "MLM", "rtd": "RTD", "bce": "BCE", "mse": "MSE"}
METRICS = {"spearman": "Spearman", "pearson": "Pearson", "accuracy": "Accuracy", "f1": "F1"}
SPLITS = {"test": "Test", "dev": "Dev", "best_dev": "Dev"}


def axis_label(name: str, labels: dict | None = None) -> str:
    """`layer` -> `Layer`; an axis of no built-in name: its words (`warmup_steps` -> `Warmup steps`)."""
    if labels and str(name) in labels:
        return str(labels[str(name)])
    return AXES.get(str(name)) or str(name).replace("_", " ").capitalize()


def value_label(value, labels: dict | None = None) -> str:
    """`cls` -> `CLS`; a hub model id or a model folder -> its last part; numbers as they are; an empty
    string (no prompt) -> `none`; text over several lines (an instruction) on one line; text with spaces
    (a prompt) is not cut at a `/` as a path is."""
    text = str(value)
    if labels and text in labels:
        return str(labels[text])
    if isinstance(value, str) and not text.strip():
        return "none" if not text else repr(text)
    if isinstance(value, str) and "/" in text and not any(c.isspace() for c in text):
        return text.rstrip("/").rsplit("/", 1)[-1]
    if isinstance(value, str) and "\n" in text:
        return " ".join(text.split())
    return VALUES.get(text, text)


def metric_label(metric: str, labels: dict | None = None, split: bool = True) -> str:
    """`test_spearman` -> `Test Spearman` (`Spearman` with split=False); unknown parts keep their words."""
    if labels and metric in labels:
        return str(labels[metric])
    for prefix, name in sorted(SPLITS.items(), key=lambda item: -len(item[0])):
        if metric.startswith(prefix + "_"):
            rest = metric[len(prefix) + 1:]
            shown = METRICS.get(rest, rest.replace("_", " "))
            return f"{name} {shown}" if split else shown
    return METRICS.get(metric, metric.replace("_", " "))


def in_sentence(label: str) -> str:
    """A label inside a caption: `Layer` -> `layer`, while `DAPT steps` and `LR` stay."""
    return label[0].lower() + label[1:] if len(label) > 1 and label[1].islower() else label


def format_value(value) -> str:
    """A tuned value as a table shows it: learning rates in scientific notation, others plainly."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:.2e}" if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4) else f"{value:g}"
    return str(value)
