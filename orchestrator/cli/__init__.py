"""The `orchestrator` command line (`orchestrator.cli:app`). Bad input ends in one line on stderr and
exit code 2. Each verb lives with its kin; importing them here registers them in the order `--help`
lists them (so the imports keep that order, not an alphabetical one)."""
# ruff: noqa: I001

from orchestrator.cli.app import app, main
from orchestrator.cli import probe  # noqa: F401
from orchestrator.cli import study  # noqa: F401
from orchestrator.cli import ui  # noqa: F401
from orchestrator.cli import report  # noqa: F401

__all__ = ["app", "main"]
