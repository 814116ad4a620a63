"""Closed names that configs and search spaces check against, importable without torch."""

from __future__ import annotations

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")
