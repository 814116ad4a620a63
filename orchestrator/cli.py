"""The `orchestrator` command line. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import json
import math
import sys
import traceback
from collections.abc import Callable
from typing import Annotated

import typer

from trainables.errors import UserInputError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow.")

DEBUG = typer.Option(False, "--debug", help="Show the full traceback of an error.")


@app.callback()
def commands() -> None:
    """Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow."""


def user_errors(command: Callable) -> Callable:
    """Turn a UserInputError into `error: <one line>` and exit code 2 (traceback with --debug)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserInputError as exc:
            if kwargs.get("debug"):
                traceback.print_exc()
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def quiet_libraries() -> None:
    """Progress bars and advice from transformers would bury the one line a user needs."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def parse_layers(value: str) -> list[int] | None:
    """`all` (None) or a comma list such as `0,3,6`."""
    if value.strip().lower() == "all":
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UserInputError("--layers", value, "use `all` or layer numbers such as 0,3,6") from None


@app.command()
@user_errors
def probe(
    model: Annotated[str, typer.Option(help="Hub id or local model folder.")],
    task: Annotated[str, typer.Option(help="Task name: stsb, stsb_multi_mt, korsts, sick, sick_full, mrpc.")] = "stsb",
    language: Annotated[str | None, typer.Option(help="Language of a multilingual task (stsb_multi_mt).")] = None,
    split: Annotated[str, typer.Option(help="dev or test.")] = "test",
    pooling: Annotated[str, typer.Option(help="mean, cls, max or mean_sqrt_len.")] = "mean",
    layers: Annotated[str, typer.Option(help="`all` or a comma list such as 0,3,6.")] = "all",
    data_dir: Annotated[str | None, typer.Option(help="Data folder (default: $ORCHESTRATOR_DATA_DIR).")] = None,
    max_seq_length: Annotated[int, typer.Option(help="Tokens per sentence.")] = 128,
    precision: Annotated[str, typer.Option(help="auto, fp32 or bf16.")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per layer per line.")] = False,
    debug: bool = DEBUG,
) -> None:
    """Zero-shot layer profile of an encoder: every layer pooled and scored, one forward pass."""
    from trainables.contract import parse_config
    from trainables.probe import ProbeConfig, probe_layers

    if split not in ("dev", "test"):
        raise UserInputError("--split", split, "use dev or test")
    quiet_libraries()
    cfg = parse_config(ProbeConfig, dict(
        model=model, task=task, language=language, layers=parse_layers(layers), pooling=pooling, splits=[split],
        max_seq_length=max_seq_length, precision=precision, device=device, data_dir=data_dir))
    rows = [{k.removeprefix(f"{split}_"): v for k, v in row.items()} for row in probe_layers(cfg)]
    if as_json:  # an undefined correlation (constant vectors, e.g. CLS at layer 0) is null
        for row in rows:
            clean = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            print(json.dumps({"model": model, "task": task, "language": language, "split": split,
                              "pooling": pooling, **clean}))
        return
    print_layer_table(rows, f"{model} · {task}{'/' + language if language else ''} · {split} · {pooling} pooling")


def print_layer_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    metrics = [k for k in rows[0] if k not in ("layer", "params", "threshold")]
    best = {m: max((r[m] for r in rows if not math.isnan(r[m])), default=None) for m in metrics}
    table = Table(title=title)
    table.add_column("layer", justify="right")
    for metric in metrics:
        table.add_column(f"{metric} ×100", justify="right")
    table.add_column("params (M)", justify="right")
    for row in rows:
        cells = ["—" if math.isnan(row[m]) else f"[bold]{row[m]:.2f}[/bold]" if row[m] == best[m] else f"{row[m]:.2f}"
                 for m in metrics]
        table.add_row(str(row["layer"]), *cells, f"{row['params'] / 1e6:.1f}")
    Console().print(table)


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
