"""Parameter types and presets of study search spaces (lands with the orchestration issue)."""
