"""Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow.

The public Python API (`orchestrator.api`, loaded on first use so the command line starts fast):

    import orchestrator as orc
    study = orc.load_study("examples/quickstart.yaml", overrides=["train.epochs=1"])
    study.launch()
    runs = study.results()

Everything else in the package is private by convention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.api import (
        Study,
        StudyInterrupted,
        Verification,
        doctor,
        launch,
        list_studies,
        load_study,
        plan,
        probe,
        report,
        reproduce,
        rerun,
        results,
        resume,
        schema,
        status,
        sync,
        verify,
    )
    from orchestrator.checks.validate import Plan
    from orchestrator.run.launcher import LaunchResult
    from orchestrator.run.progress import Status
    from orchestrator.run.ray_session import Stops
    from orchestrator.run.reproduce import Reproduction, Rerun
    from orchestrator.study.config import StudySpec
    from orchestrator.study.folder import StudyFolder
    from reports.build import Report
    from trainables.errors import UserInputError

__all__ = ["LaunchResult", "Plan", "Report", "Reproduction", "Rerun", "Status", "Stops", "Study", "StudyFolder",
           "StudyInterrupted", "StudySpec", "UserInputError", "Verification", "doctor", "launch", "list_studies",
           "load_study", "plan", "probe", "report", "reproduce", "rerun", "results", "resume", "schema", "status",
           "sync", "verify"]


HOMES = {"LaunchResult": "orchestrator.run.launcher", "Report": "reports.build",
         "Reproduction": "orchestrator.run.reproduce", "Rerun": "orchestrator.run.reproduce",
         "Plan": "orchestrator.checks.validate", "Status": "orchestrator.run.progress",
         "Stops": "orchestrator.run.ray_session",
         "StudyFolder": "orchestrator.study.folder", "StudySpec": "orchestrator.study.config",
         "UserInputError": "trainables.errors"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(HOMES.get(name, "orchestrator.api")), name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
