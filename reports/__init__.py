"""Paper tables, plots and tidy CSVs from a study's MLflow runs and its study record."""
