"""CLI, study validation, planning, Ray launch and MLflow tracking."""
