"""The documentation: a short README whose links resolve, fenced blocks that say whether they run, and
reference pages generated from the code that cover all of it. The runnable blocks themselves run in
tests/test_docs_run.py (slow)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
import pytest
import typer
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
QUIET = {"text", "yaml", "json", "python", "latex", "tex", "toml", "csv", "markdown", "md", "ini"}


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def fences(path: Path) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return [(m.group(1).strip().split()[0] if m.group(1).strip() else "", m.group(2))
            for m in FENCE.finditer(path.read_text(encoding="utf-8"))]


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short_and_every_link_in_it_resolves():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    targets = [t for t in LINK.findall(readme) if not t.startswith(("http://", "https://", "#"))]
    assert len(targets) >= 20  # the two commands, a screenshot and the map of the site
    missing = [t for t in targets if not (REPO / t.split("#")[0]).exists()]
    assert missing == []


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python", "#"))

    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    listed = set(walk(config["nav"]))
    assert {str(p.relative_to(DOCS)) for p in pages()} == listed


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_fenced_block_says_whether_it_runs(page):
    """`bash` runs in the tests, `shell` does not and says why on its first line, other languages are not
    commands; a fence without a language would leave it unsaid."""
    for language, body in fences(page):
        assert language in QUIET | {"bash", "shell"}, f"{page.name}: a block fenced {language!r}"
        if language == "shell":
            assert body.lstrip().startswith("#"), f"{page.name}: a shell block without its reason: {body[:80]}"
        if language == "bash":
            assert body.strip(), f"{page.name}: an empty bash block"


def test_the_cli_reference_has_every_verb_and_every_option():
    from orchestrator.cli import app

    text = hooks().cli_reference()
    group = typer.main.get_command(app)
    root = click.Context(group, info_name="orchestrator")
    for name in group.list_commands(root):
        assert f"## `orchestrator {name}`" in text
        for param in group.get_command(root, name).params:
            if param.param_type_name == "option" and "--help" not in param.opts:
                assert f"`{param.opts[0]}" in text or any(f"`{o}" in text for o in param.opts), (name, param.opts)
    assert text.count("## `orchestrator ") == len(group.list_commands(root))


def test_the_study_file_reference_has_every_key_of_every_section():
    from orchestrator.study.config import study_json_schema

    text = hooks().study_file_reference()
    schema = study_json_schema()
    for section in [schema, *schema["$defs"].values()]:
        for key in section["properties"]:
            assert f"| `{key}` |" in text
    assert "| `tune` | TuneSection or null |" in text
    assert "| `sampler` | tpe \\| random \\| gp \\| cmaes \\| qmc \\| bruteforce \\| nsga2 | `'tpe'` |" in text


def test_the_kind_reference_lists_each_kinds_own_keys_and_not_the_managed_ones():
    text = hooks().kind_configs_reference()
    for name in ("finetune", "probe", "cross_encoder", "contrastive", "distill"):
        assert f"### `trainable: {name}`" in text
    assert "| `pooling` |" in text and "| `cycles` |" in text and "| `temperature` |" in text
    assert "| `seed` |" not in text and "| `data_dir` |" not in text



def layout_section() -> str:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    return text.split("## Layout", 1)[1].split("\n## ", 1)[0]


def layout_paths(section: str) -> set[str]:
    """Every path the section names: whole ones, and a bullet's bare `name.py` under the folder it opens with."""
    whole = re.compile(r"`((?:orchestrator|trainables|reports|search_spaces)/[\w/]*?(?:\.py|/))`")
    named = set(whole.findall(section))
    for bullet in re.split(r"(?:^|\n)- ", section)[1:]:
        bullet = bullet.split("\n\n", 1)[0]  # a list ends at a blank line
        folder = whole.match(bullet)
        if folder and folder.group(1).endswith("/"):
            named |= {folder.group(1) + name for name in re.findall(r"`(\w+\.py)`", bullet)}
    return named


def test_the_design_page_s_layout_names_only_what_exists_and_every_package_and_module():
    """docs/design.md's layout is drawn from the code: every path it names exists, every package (a folder with
    an __init__.py) is named, and so is every module of orchestrator/: a new or moved one updates the page."""
    named = layout_paths(layout_section())
    assert sorted(p for p in named if not (REPO / p).exists()) == []
    packages = {f"{init.parent.relative_to(REPO).as_posix()}/" for top in ("orchestrator", "trainables")
                for init in (REPO / top).rglob("__init__.py") if init.parent != REPO / top}
    assert sorted(packages - named) == []
    modules = {f.relative_to(REPO).as_posix() for f in (REPO / "orchestrator").rglob("*.py")
               if f.name not in ("__init__.py", "__main__.py") and "testing" not in f.parts}
    assert sorted(modules - named) == []


def test_the_layout_reader_sees_a_module_the_page_leaves_out():
    section = "- `orchestrator/study/`: `config.py` and `plan.py`\n- `orchestrator/api.py`: the API\n"
    assert layout_paths(section) == {"orchestrator/study/", "orchestrator/study/config.py",
                                     "orchestrator/study/plan.py", "orchestrator/api.py"}
