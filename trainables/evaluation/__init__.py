"""Evaluation: evaluators (STS, pair classification), the STS suite and the layer probe."""
