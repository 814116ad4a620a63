"""Closed names that configs and search spaces check against, importable without torch."""

from __future__ import annotations

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")
PRECISIONS = ("auto", "fp32", "bf16")  # training: bf16 autocast where fast, or forced
EVAL_PRECISIONS = ("fp32", "same")  # dev/test scoring: fp32, or as training
