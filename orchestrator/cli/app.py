"""The command line's frame: the Typer app, what every verb shares (its options, its one-line errors,
quiet libraries, the name the user called it by) and the entry point. The verbs register in
`orchestrator.cli`, in the order `--help` lists them."""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.usage import OrchestratorTyper
from trainables.errors import UserInputError, UserInputErrors

app = OrchestratorTyper(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow.")

DEBUG = typer.Option(False, "--debug", help="Show the full traceback of an error.")


def show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"orchestrator (ablation-orchestrator) {version('ablation-orchestrator')}")
        except PackageNotFoundError:
            typer.echo("orchestrator (ablation-orchestrator) 0+unknown")
        raise typer.Exit()


@app.callback()
def commands(_version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                           help="Print the version and exit.")) -> None:
    """Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow."""


def user_errors(command: Callable) -> Callable:
    """Turn a UserInputError into `error: <one line>` and exit code 2 (traceback with --debug), and a
    Ctrl-C that the verb does not handle itself into `interrupted: ...` and exit 130."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            if kwargs.get("debug"):
                traceback.print_exc()
            verb = next((c.name for c in app.registered_commands if c.name and c.callback is not None
                         and c.callback.__name__ == command.__name__), command.__name__.replace("_", "-"))
            typer.echo(f"interrupted: `{cli_name()} {verb}` stopped before it finished; run it again", err=True)
            raise typer.Exit(INTERRUPTED) from None
        except UserInputError as exc:
            if kwargs.get("debug"):
                traceback.print_exc()
            for line in exc.lines() if isinstance(exc, UserInputErrors) else [str(exc)]:  # every problem found
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None
        except OSError as exc:
            if exc.filename is None or exc.errno not in FILE_FIXES:  # not a path the user can put right
                raise
            if kwargs.get("debug"):
                traceback.print_exc()
            typer.echo(f"error: {exc.filename}: {exc.strerror or exc}; {FILE_FIXES[exc.errno]}", err=True)
            raise typer.Exit(2) from None

    return wrapper


# A path that is not what a verb expects (a state file of a study folder replaced by a folder, a storage path that
# is a file, a file it may not read): one line naming the path, whichever file of whichever verb it is
FILE_FIXES = {
    errno.EISDIR: "a folder stands where a file belongs: move it aside and run the command again (a study folder's "
                  "state files that can be rebuilt are rebuilt from its journal by `orchestrator resume`)",
    errno.ENOTDIR: "a file stands where a folder belongs: move it aside, or give --storage (storage_path) a folder",
    errno.EEXIST: "a file stands where a folder belongs: move it aside, or give --storage (storage_path) a folder",
    errno.EACCES: "make it readable (and writable for launch, resume and sync), or give another folder",
    errno.EPERM: "make it readable (and writable for launch, resume and sync), or give another folder",
    errno.ENOENT: "it is gone: check the path (a study folder moved or deleted while the command ran?)",
}


def quiet_libraries() -> None:
    """Progress bars and advice from transformers and MLflow's database chatter would bury the one
    line a user needs. Environment variables, so nothing heavy is imported to quiet it."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow resets its logger's level on import
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    for name in ("mlflow", "alembic", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow logs a refused SQL write with its traceback before raising it; the launch says it in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    own = logging.getLogger("orchestrator")  # our warnings (an MLflow outage, a replay) reach stderr whatever
    if not own.handlers:                     # other libraries did to the root logger
        handler = CurrentStderr()
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        own.addHandler(handler)
        own.setLevel(logging.INFO)
        own.propagate = False


class CurrentStderr(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is when it emits (a redirect, a test runner)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


STORAGE = typer.Option(None, "--storage", help="Folder of study folders (default: the study's storage_path "
                                                 "or ./studies).")
ADDRESS = typer.Option(None, "--address", help="Ray cluster: local (default), auto, or host:port; also RAY_ADDRESS.")
MAX_CONCURRENT = typer.Option(None, "--max-concurrent", min=1, help="At most this many trials at once.")
DATA_DIR = typer.Option(None, "--data-dir", help="Data folder in the layout of shared/data (default: "
                                                   "$ORCHESTRATOR_DATA_DIR, else ../shared/data beside the checkout, "
                                                   "else the hub); a study's own data_dir: must name the same.")
STUDY_FILE = typer.Argument(help="The study's YAML file (`orchestrator schema` prints its keys).")
NAME = typer.Argument(help="The study's name (its folder under --storage).")
Overrides = Annotated[list[str] | None, typer.Argument(
    metavar="KEY=VALUE", show_default=False,
    help="Changes to the study file, e.g. train.lr=3e-5 'replicate.seeds=[0,1,2]' ablate.layer=all (values are "
         "YAML; ~KEY removes a key); the study folder keeps the merged file.")]
NewName = Annotated[str | None, typer.Option("--name", help="Run the study under this name (a variation of the "
                                                            "file, in its own study folder and MLflow experiment).")]


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT; 143 for SIGTERM


def cli_name() -> str:
    """The CLI as the user called it (`.venv/bin/orchestrator`, or `orchestrator` from PATH), so that the
    commands it suggests paste as they are."""
    called = sys.argv[0] if sys.argv else ""
    if Path(called).name != "orchestrator" or not called or shutil.which("orchestrator") == called:
        return "orchestrator"
    return called


def study_options(storage: str | Path | None) -> str:
    """`--storage DIR` where the study folder is not under ./studies (which NAME alone finds)."""
    from orchestrator.study.folder import DEFAULT_STORAGE

    if storage is None or Path(storage).expanduser().resolve() == Path(DEFAULT_STORAGE).resolve():
        return ""
    return f" --storage {storage}"


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())


