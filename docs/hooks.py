"""MkDocs hooks: the reference pages generated from the code at build time, so they cannot drift.

A page asks for a generated part with a marker line (an HTML comment, invisible on GitHub):
`<!-- generated: cli -->` (every verb from the typer/click app), `<!-- generated: study-file -->`
(the study file's sections from its JSON Schema, as `orchestrator schema` prints it) and
`<!-- generated: kind-configs -->` (the keys of `train`, `ablate` and `tune.params`, per kind).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_config(config, **kwargs):
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)  # the checkout's packages, whatever installed copy mkdocs runs beside
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda found: GENERATORS[found.group(1)](), markdown)


def cell(text: Any) -> str:
    """A value fit for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# --- the command line ---------------------------------------------------------------------------------


def cli_reference() -> str:
    import click
    import typer

    from orchestrator.cli import app

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="orchestrator")
    out = [f"`orchestrator --help`: {group.help}", "",
           *(f"- `{opts}`: {text}" for opts, text in filter(None, (p.get_help_record(root) for p in group.params))),
           ""]
    for name in group.list_commands(root):
        command = group.get_command(root, name)
        ctx = click.Context(command, info_name=name, parent=root)
        out += [f"## `orchestrator {name}`", "", (command.help or "").strip(), "", "```text",
                " ".join(command.collect_usage_pieces(ctx)).join(["Usage: orchestrator " + name + " ", ""]), "```", ""]
        rows = []
        for param in command.params:
            record = param.get_help_record(ctx)
            if record and "--help" not in record[0]:
                rows.append((f"`{record[0]}`", record[1]))
        if rows:
            out += ["| argument or option | what it does |", "|---|---|",
                    *(f"| {cell(a)} | {cell(b)} |" for a, b in rows), ""]
    return "\n".join(out)


# --- the study file ---------------------------------------------------------------------------------


def type_of(prop: dict, defs: dict) -> str:
    """A JSON Schema property as a short type: `int`, `tpe | random`, `list[str]`, a section name."""
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "enum" in prop:
        return " | ".join(str(v) for v in prop["enum"])
    if "const" in prop:
        return str(prop["const"])
    if "anyOf" in prop:
        return " or ".join(type_of(p, defs) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list[{type_of(prop.get('items', {}), defs)}]"
    if kind == "object":
        return "mapping"
    return {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}.get(kind, kind)


def section_of(prop: dict) -> str | None:
    """The section (a $defs name) a property holds, directly or as `Section or null`."""
    for option in [prop, *prop.get("anyOf", [])]:
        if "$ref" in option:
            return option["$ref"].rsplit("/", 1)[-1]
    return None


def schema_table(schema: dict, defs: dict) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| key | type | default | what it is |", "|---|---|---|---|"]
    for key, prop in schema.get("properties", {}).items():
        section = section_of(prop)
        if key in required:
            default = "required"
        elif section and isinstance(prop.get("default"), dict):  # a section's defaults are in its own table
            default = f"[below](#{section.lower()})"
        else:
            default = f"`{prop['default']!r}`" if "default" in prop else ""
        what = prop.get("description") or (defs.get(section, {}).get("description", "") if section else "")
        rows.append(f"| `{key}` | {cell(type_of(prop, defs))} | {default} | {cell(what)} |")
    return rows


def study_file_reference() -> str:
    from orchestrator.study.config import study_json_schema

    schema = study_json_schema()
    defs = schema.get("$defs", {})
    out = ["### The top level", "", *schema_table(schema, defs), ""]
    for name, section in defs.items():
        out += [f"### {name}", "", (section.get("description") or "").strip(), "", *schema_table(section, defs), ""]
    return "\n".join(out)


def kind_configs_reference() -> str:
    from orchestrator.study.plan import MANAGED
    from trainables.kinds import KINDS, load_kind

    out = []
    for name, path in KINDS.items():
        kind = load_kind(path)
        about = type(kind).__doc__ or sys.modules[type(kind).__module__].__doc__ or ""
        out += [f"### `trainable: {name}`", "", " ".join(about.strip().split("\n\n")[0].split()), "",
                "| key | type | default | what it is |", "|---|---|---|---|"]
        for key, field in kind.Config.model_fields.items():
            if key in MANAGED:
                continue
            annotation = re.sub(r"typing\.|<class '([^']+)'>", r"\1", str(field.annotation))
            default = "required" if field.is_required() else f"`{field.default!r}`"
            out.append(f"| `{key}` | {cell(annotation)} | {cell(default)} | {cell(field.description or '')} |")
        out.append("")
    return "\n".join(out)


GENERATORS = {"cli": cli_reference, "study-file": study_file_reference, "kind-configs": kind_configs_reference}
