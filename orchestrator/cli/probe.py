"""`orchestrator probe`: every layer of a model pooled and scored in one pass, as a table (or JSON)."""

from __future__ import annotations

import json
import math
from typing import Annotated

import typer

from orchestrator.cli.app import DEBUG, app, quiet_libraries, user_errors
from trainables.errors import UserInputError


def parse_layers(value: str) -> list[int] | None:
    """`all` (None) or a comma list such as `0,3,6`."""
    if value.strip().lower() == "all":
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UserInputError("--layers", value, "use `all` or layer numbers such as 0,3,6") from None


def parse_pooling_layers(value: str) -> str | list[int]:
    """A name (`first_last`) or a comma list of layers (`1,6`)."""
    if any(ch.isalpha() for ch in value):
        return value.strip()
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UserInputError("--pooling-layers", value, "use a name (last, first_last, top2, all) or layer numbers "
                                                        "such as 1,6") from None


@app.command()
@user_errors
def probe(
    model: Annotated[str, typer.Option(help="Hub id or local model folder.")],
    task: Annotated[str, typer.Option(help="Task name: stsb, stsb_multi_mt, korsts, sick, sick_full, mrpc.")] = "stsb",
    language: Annotated[str | None, typer.Option(help="Language of a multilingual task (stsb_multi_mt).")] = None,
    split: Annotated[str, typer.Option(help="dev or test.")] = "test",
    pooling: Annotated[str, typer.Option(help="mean, cls, max, mean_sqrt_len or last_token (a decoder's; cls is "
                                               "refused for causal models).")] = "mean",
    layers: Annotated[str, typer.Option(help="`all` or a comma list such as 0,3,6.")] = "all",
    data_dir: Annotated[str | None, typer.Option(help="Data folder (default: $ORCHESTRATOR_DATA_DIR, else "
                                                      "../shared/data beside the checkout, else the hub).")] = None,
    max_seq_length: Annotated[int, typer.Option(min=2, help="Tokens per sentence (at least 2: the special "
                                                           "tokens).")] = 128,
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto (bf16 where it is fast).")] = "fp32",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    suite: Annotated[str | None, typer.Option(help="Score a suite instead of one task: `sts` is STS12-16, STS-B "
                                                   "and SICK-R (test splits) and their average.")] = None,
    max_eval_samples: Annotated[int | None, typer.Option(min=1, help="Score at most this many pairs per set "
                                                              "(a fixed random subset).")] = None,
    postprocess: Annotated[str, typer.Option(help="none, whiten, abtt or zscore: each layer's vectors mapped by a "
                                                  "transform fitted on the task's train sentences.")] = "none",
    postprocess_dim: Annotated[int | None, typer.Option(min=1, help="whiten: dimensions kept; abtt: top "
                                                                   "directions removed (d/100).")] = None,
    max_train_samples: Annotated[int | None, typer.Option(min=1, help="Fit --postprocess on at most this many "
                                                                     "train pairs.")] = None,
    pooling_layers: Annotated[str, typer.Option(help="last, first_last (layers 1 and k, SimCSE's), top2 (k-1 and "
                                                     "k), all (0..k), or a comma list of layers scored as one "
                                                     "cut at its deepest, such as 1,6.")] = "last",
    prompt: Annotated[str, typer.Option(help="Text put before every sentence, as a study's prompt: (E5's "
                                             "'query: ', an instruction).")] = "",
    no_include_prompt: Annotated[bool, typer.Option("--no-include-prompt", help="Pool without the prompt's tokens "
                                                    "(sentence-transformers' include_prompt=False).")] = False,
    bidirectional: Annotated[bool, typer.Option("--bidirectional", help="A causal decoder attends both ways "
                                                "(LLM2Vec's first step).")] = False,
    skip_special: Annotated[bool, typer.Option("--skip-special", help="Pool without the special tokens (BOS, "
                                               "[CLS], [SEP], EOS), as pool_special_tokens: false.")] = False,
    append_eos: Annotated[bool, typer.Option("--append-eos", help="End every input with the tokenizer's EOS token "
                                             "(a decoder's recipe: last_token pools it).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per layer per line.")] = False,
    debug: bool = DEBUG,
) -> None:
    """Zero-shot layer profile of an encoder: every layer pooled and scored, one forward pass. The same
    vectors give label-free diagnostics per layer (RankMe, anisotropy, alignment, uniformity), the layer
    each would pick and its Spearman with the labelled ranking (a second table; keys in --json)."""
    from orchestrator import api
    from trainables.evaluation.sts_suite import LABELS, suite_tasks

    include_prompt = not no_include_prompt

    quiet_libraries()
    rows = api.probe(model, task=task, language=language, split=split, pooling=pooling, layers=parse_layers(layers),
                     data_dir=data_dir, max_seq_length=max_seq_length, precision=precision, device=device,
                     suite=suite, max_eval_samples=max_eval_samples, postprocess=postprocess,
                     postprocess_dim=postprocess_dim, max_train_samples=max_train_samples, prompt=prompt,
                     include_prompt=include_prompt, pooling_layers=parse_pooling_layers(pooling_layers),
                     append_eos=append_eos, bidirectional=bidirectional,
                     pool_special_tokens=not skip_special).to_dict("records")
    if suite is not None:
        if as_json:
            for row in rows:
                print(json.dumps({"model": model, "suite": suite, "split": "test", "pooling": pooling,
                              **({"prompt": prompt, "include_prompt": include_prompt} if prompt else {}),
                              **({"append_eos": True} if append_eos else {}),
                              **({"bidirectional": True} if bidirectional else {}),
                              **({"pool_special_tokens": False} if skip_special else {}), **row}))
            return
        shown = [{"layer": r["layer"], "params": r["params"], **{LABELS[t]: r[t] for t in suite_tasks(suite)},
                  "Avg.": r["avg"]} for r in rows]
        print_layer_table(shown, f"{model} · {suite} suite (test, Spearman ×100 of cosine) · {pooling} pooling",
                          unit="")
        return
    if as_json:  # an undefined correlation (constant vectors, e.g. CLS at layer 0) is null
        for row in rows:
            clean = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            print(json.dumps({"model": model, "task": task, "language": language, "split": split,
                              "pooling": pooling, "postprocess": postprocess,
                              **({"pooling_layers": parse_pooling_layers(pooling_layers)}
                                 if pooling_layers != "last" else {}),
                              **({"prompt": prompt, "include_prompt": include_prompt} if prompt else {}),
                              **({"append_eos": True} if append_eos else {}),
                              **({"bidirectional": True} if bidirectional else {}),
                              **({"pool_special_tokens": False} if skip_special else {}), **clean}))
        return
    mixed = "" if pooling_layers == "last" else f" · layers {pooling_layers} averaged"
    fitted = "" if postprocess == "none" else f" · {postprocess}{f' {postprocess_dim}' if postprocess_dim else ''} " \
                                              f"(fitted on train)"
    prompted = f" · prompt {prompt!r}{'' if include_prompt else ' (not pooled)'}" if prompt else ""
    prompted += (" · EOS appended" if append_eos else "") + (" · attending both ways" if bidirectional else "") + (
        " · special tokens not pooled" if skip_special else "")
    print_layer_table(rows, f"{model} · {task}{'/' + language if language else ''} · {split} · {pooling} pooling"
                            f"{mixed}{fitted}{prompted}")



def print_layer_table(rows: list[dict], title: str, unit: str = " ×100") -> None:
    """One row per layer, the best value of each metric in bold; a collapsed layer's scores (every
    cosine within 1e-4 of the others) carry a ° and its cosine spread is said under the table. Rows
    with label-free diagnostics get a second table of them (each one's pick in bold) and one line per
    diagnostic: the layer it picks and its Spearman with the labelled ranking of layers."""
    from rich.console import Console
    from rich.table import Table

    from trainables.evaluation.diagnostics import DIRECTIONS

    diagnostics = [d for d in DIRECTIONS if d in rows[0]]
    summaries = {f"{d}_{end}" for d in diagnostics for end in ("pick", "rho")}
    metrics = [k for k in rows[0] if k not in ("layer", "params", "threshold", "cosine_spread", *diagnostics,
                                               *summaries)]
    best = {m: max((r[m] for r in rows if not math.isnan(r[m])), default=None) for m in metrics}
    collapsed = {r["layer"]: r["cosine_spread"] for r in rows if is_number(r.get("cosine_spread"))
                 and not math.isnan(r[metrics[0]])}  # a table's rows carry the key as NaN where a layer has none
    table = Table(title=title)
    table.add_column("layer", justify="right")
    for metric in metrics:
        table.add_column(f"{metric}{unit}", justify="right")
    table.add_column("params (M)", justify="right")
    for row in rows:
        mark = "°" if row["layer"] in collapsed else ""
        cells = ["—" if math.isnan(row[m]) else f"[bold]{row[m]:.2f}{mark}[/bold]" if row[m] == best[m]
                 else f"{row[m]:.2f}{mark}" for m in metrics]
        table.add_row(str(row["layer"]), *cells, f"{row['params'] / 1e6:.1f}")
    console = Console()
    console.print(table)
    if collapsed:  # under the table, not a caption squeezed to its width
        console.print("° collapsed (every cosine within 1e-4 of the others), cosine spread: " + ", ".join(
            f"layer {layer} {spread:.1e}".replace("e-0", "e-") for layer, spread in collapsed.items()), soft_wrap=True)
    if diagnostics:
        print_diagnostics(console, rows, diagnostics)


DIAGNOSTIC_FORMATS = {"rankme": ".1f", "anisotropy": ".3f", "alignment": ".3f", "uniformity": ".3f"}


def print_diagnostics(console, rows: list[dict], diagnostics: list[str]) -> None:
    """The label-free diagnostics as their own small table (raw values, not x100) and one line each."""
    from rich.table import Table

    from trainables.evaluation.diagnostics import DIRECTIONS

    table = Table(title="label-free diagnostics (the split's sentences and pairs, no scores)")
    table.add_column("layer", justify="right")
    for name in diagnostics:
        table.add_column(f"{name} ({'max' if DIRECTIONS[name] > 0 else 'min'})", justify="right")
    for row in rows:
        cells = ["—" if not is_number(row[d]) else f"[bold]{row[d]:{DIAGNOSTIC_FORMATS[d]}}[/bold]"
                 if row["layer"] == row[f"{d}_pick"] else f"{row[d]:{DIAGNOSTIC_FORMATS[d]}}" for d in diagnostics]
        table.add_row(str(row["layer"]), *cells)
    console.print(table)
    for name in diagnostics:
        pick, rho = rows[0][f"{name}_pick"], rows[0][f"{name}_rho"]
        picked = f"layer {int(pick)}" if is_number(pick) else "no layer"
        agreement = f"{rho:+.2f}" if is_number(rho) else "— (under 3 scored layers, or constant)"
        console.print(f"{name} picks {picked}; Spearman with the labelled layer ranking {agreement}",
                      soft_wrap=True)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)
