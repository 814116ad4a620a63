"""The plugin's source importable without installing it (the orchestrator's own suite runs these tests
too); installed, the same modules are found either way."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
