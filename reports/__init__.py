"""Paper tables and plots from a study's MLflow runs (lands with the reports issue)."""
