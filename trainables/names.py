"""Closed names that configs and search spaces check against, importable without torch."""

from __future__ import annotations

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")
PRECISIONS = ("auto", "fp32", "bf16")  # training: bf16 autocast where fast, or forced
EVAL_PRECISIONS = ("fp32", "same")  # dev/test scoring: fp32, or as training
DROPOUT_MASKS = ("fast", "torch")  # trainables.models.dropout's masks, or torch's bernoulli_
SELECTS = ("accuracy", "f1")  # what pair classification selects on (STS tasks select on Spearman)
# training objectives of `finetune`: name -> the task kind it trains (the modules live in `objectives`)
LOSS_TASKS = {"cosine_mse": "sts", "cosent": "sts", "angle": "sts",
              "softmax": "classification", "cosine_bce": "classification", "cosine_bce_affine": "classification"}
CROSS_LOSSES = ("bce", "mse")  # a cross-encoder's objective on its logit
METHODS = ("simcse", "micse")  # unsupervised contrastive objectives
ATTENTION_LOSSES = ("mi", "correlation")  # miCSE's attention alignment term


def primary_metric(task_kind: str, select: str | None = None) -> tuple[str, bool]:
    """(metric, greater is better) that selects rounds, trials and layers on a task of this kind:
    the name its evaluator reports (`trainables.evaluation.evaluators`), without building one."""
    return ("spearman", True) if task_kind == "sts" else (select or "accuracy", True)
