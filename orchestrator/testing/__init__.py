"""A kit for plugin authors: the checks every built-in kind, objective and pooling passes, importable
by a plugin's own test suite.

- `orchestrator.testing.kind_contract`: the trainable-kind contract (the example config runs and
  reports the metric the kind declares; same seed same numbers, another seed other numbers; resume
  from a checkpoint to the uninterrupted numbers; a damaged checkpoint restarts the trial to the same
  numbers; test scored once, with the best-dev round's weights; selection never looks at test), as
  functions and as `KindContract`, a pytest class to subclass.
- `orchestrator.testing.components`: `check_objective` and `check_pooling` (shapes, gradients flow,
  deterministic under a seed, padding ignored, the task's targets).
- `orchestrator.testing.fixtures`: a tiny random encoder saved as a model folder and a synthetic data
  folder in the layout of the built-in tasks, so none of it needs a download.
"""
