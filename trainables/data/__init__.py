"""Data: the task registry, every data set as train/dev/test DataFrames with the same columns."""
