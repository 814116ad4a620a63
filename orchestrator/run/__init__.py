"""A study running: the launcher and Ray Tune's side of the plan, MLflow tracking, progress, saved
models, reruns (`reproduce`) and the UI's proxy."""
