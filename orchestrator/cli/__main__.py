"""`python -m orchestrator.cli`: the `orchestrator` command."""

from orchestrator.cli import main

main()
