"""The verbs of a written report: report, reproduce and verify."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.app import DEBUG, STORAGE, app, quiet_libraries, user_errors
from trainables.errors import UserInputError


@app.command()
@user_errors
def report(names: Annotated[list[str], typer.Argument(help="One study, or several for one report across them.")],
           tracking_uri: str | None = typer.Option(None, help="MLflow store (default: each study's)."),
           out: str | None = typer.Option(None, help="Output folder (default: reports/NAME or reports/A+B)."),
           formats: str | None = typer.Option(None, "--format", help="Comma list of md, tex, csv (default: the "
                                                                      "study's report.formats)."),
           bundle: bool = typer.Option(False, "--bundle", help="Also write one archive for a paper's supplementary "
                                                               "material (NAME-bundle.tar.gz beside the report): the "
                                                               "report, study file, record, locked environment, data "
                                                               "hashes, the code and a README to reproduce any cell."),
           storage: str | None = STORAGE, debug: bool = DEBUG) -> None:
    """Paper tables (Markdown, LaTeX), plots and tidy CSVs from a study's MLflow runs; with several
    studies, one report whose tables have the study (its `report.label`) as an axis."""
    from orchestrator import api

    chosen = [f.strip() for f in (formats or "").split(",") if f.strip()]
    known = {"md": "markdown", "tex": "latex", "csv": "csv"}
    bad = [f for f in chosen if f not in known]
    if bad:
        raise UserInputError("--format", bad[0], "use a comma list of md, tex, csv")
    quiet_libraries()
    written = api.report(names, storage=storage, tracking_uri=tracking_uri, out=out,
                         formats=[known[f] for f in chosen] or None, bundle=bundle)
    typer.echo(f"report: {written.folder / 'report.md'} ({len(written.files)} files)")
    if written.bundle is not None:
        typer.echo(f"bundle: {written.bundle} ({written.bundle.stat().st_size / 2**20:.1f} MiB; its README says how "
                   "to reproduce any cell)")


@app.command()
@user_errors
def reproduce(folder: Annotated[str, typer.Argument(help="A folder written by `orchestrator report` (or an unpacked "
                                                         "--bundle).")],
              cell: Annotated[str, typer.Option(help="The cell's axis values, e.g. layer=3 or "
                                                     "'layer=3 pooling=mean'.")],
              seed: Annotated[int, typer.Option(help="The replicate seed.")],
              data_dir: Annotated[str | None, typer.Option(help="The folder holding the study's data (default: the "
                                                                "one the study used).")] = None,
              tolerance: Annotated[float, typer.Option(min=0.0, help="The largest difference that counts as the "
                                                                     "same score.")] = 1e-6,
              debug: bool = DEBUG) -> None:
    """Rerun one replicate of a report from its stored config and seed (the data's and the model's sha256
    checked first) and print the reported and recomputed dev and test scores side by side; exit 1, naming
    what of the environment differs from the launch's, when they differ."""
    from orchestrator import api
    from orchestrator.run.reproduce import render

    quiet_libraries()
    result = api.reproduce(folder, cell=cell, seed=seed, data_dir=data_dir, tolerance=tolerance)
    for line in render(result):
        typer.echo(line)
    if not result.matches:
        raise typer.Exit(1)


@app.command()
@user_errors
def verify(folder: Annotated[str, typer.Argument(help="A folder written by `orchestrator report`.")],
           tracking_uri: str | None = typer.Option(None, help="MLflow store (default: the report's)."),
           rerun: Annotated[int, typer.Option(min=0, help="Also rerun this many replicates drawn at random (as "
                                                           "`reproduce` does) and set each one's difference "
                                                           "against its cell's seed-to-seed sd: 0 on a CPU, a "
                                                           "GPU's nondeterminism elsewhere.")] = 0,
           rerun_seed: Annotated[int, typer.Option(help="The seed that draws the replicates to rerun.")] = 0,
           data_dir: Annotated[str | None, typer.Option(help="The folder holding the study's data, for --rerun "
                                                             "(default: the one the study used).")] = None,
           debug: bool = DEBUG) -> None:
    """Recompute every number of a written report from MLflow; exit 1 naming each cell that differs.
    With --rerun N, N replicates are also run again here, same seed, and their same-seed variation shown."""
    from orchestrator import api

    quiet_libraries()
    checked = api.verify(folder, tracking_uri=tracking_uri)
    for problem in checked.problems:
        typer.echo(f"differs: {problem}", err=True)
    if not checked.ok:
        raise typer.Exit(1)
    typer.echo(f"ok: every number of {checked.folder} ({checked.cells} cells) matches MLflow")
    if rerun:
        from orchestrator.run.reproduce import read_report, render_reruns

        total = len(read_report(Path(folder))[0])
        for line in render_reruns(api.rerun(folder, rerun, draw_seed=rerun_seed, data_dir=data_dir), total,
                                  rerun_seed):
            typer.echo(line)
