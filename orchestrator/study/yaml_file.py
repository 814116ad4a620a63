"""A study file read as plain YAML (bounded: a file of aliases that expands to billions of nodes is refused;
a tag is refused, nothing is constructed; an exponent without a dot is a float, as a researcher means 3e-5) and
the command line's KEY=VALUE overrides applied to it, each problem one line naming the key."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trainables.errors import UserInputError

MAX_NODES = 100_000  # a study file expands to a few hundred values; a "billion laughs" file to billions


class TooManyAliases(yaml.YAMLError):  # type: ignore[misc]  # PyYAML has no type stubs here: its classes are Any
    pass


class BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type stubs here: its classes are Any
    """YAML's safe loader with a bound on what aliases (`*name`) expand to, counted on the composed
    graph before anything is built, so a few hundred bytes cannot become gigabytes of study."""

    def construct_document(self, node: yaml.Node) -> Any:
        sizes: dict[int, int] = {}

        def expanded(current: yaml.Node) -> int:
            if id(current) not in sizes:
                sizes[id(current)] = 0  # a recursive alias counts once while it is being measured
                children = (current.value if isinstance(current, yaml.SequenceNode) else
                            [part for pair in current.value for part in pair]
                            if isinstance(current, yaml.MappingNode) else [])
                sizes[id(current)] = min(MAX_NODES + 1, 1 + sum(expanded(child) for child in children))
            return sizes[id(current)]

        if expanded(node) > MAX_NODES:
            raise TooManyAliases(f"its YAML aliases expand to more than {MAX_NODES:,} values")
        return super().construct_document(node)


# YAML 1.1 (PyYAML) reads `3e-5` as a string (a float needs a dot: `3.0e-5`); YAML 1.2 and every user
# read it as a number. A study file and a command-line override (`train.lr=3e-5`) both mean the number.
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                    list("-+0123456789"))


def read_study_file(path: Path) -> tuple[str, Any]:
    """A study file's text and its YAML as written (validated by `parse_study`)."""
    if not path.is_file():
        raise UserInputError("study file", str(path), "give the path of an existing YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError("study file", str(path), f"it is not UTF-8 text (byte {exc.start}); a study file is "
                                                      "YAML: write it anew or restore it from a copy") from None
    try:
        return text, yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader)
    except TooManyAliases as exc:
        raise UserInputError("study file", str(path), f"{exc}; write the values out instead") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = re.sub(r"\s+", " ", str(getattr(exc, "problem", exc)))
        if isinstance(exc, yaml.constructor.ConstructorError) and "for the tag" in problem:
            tag = problem.rsplit("for the tag", 1)[1].strip()
            raise UserInputError("study file", str(path), f"YAML tag {tag} at {where}: a study file is plain YAML "
                                                          "(mappings, lists, strings, numbers); remove the tag "
                                                          "and write the value itself") from None
        raise UserInputError("study file", str(path), f"YAML syntax error at {where}: {problem}") from None


OVERRIDE_FORM = "write KEY=VALUE (a dotted key, a YAML value), e.g. train.lr=3e-5 or 'replicate.seeds=[0,1,2]'"
OVERRIDE_KEY = re.compile(r"[^\s.=~]+(\.[^\s.=]+)*")
REMOVE = object()  # the value of `~KEY`: the key is taken out of the study


def parse_override(text: str) -> tuple[list[str], Any]:
    """One command-line override: `train.lr=3e-5` -> (["train", "lr"], 3e-05), the value read as YAML
    (`[0,1,2]` a list, `null` None, an empty value None); `~tune` -> (["tune"], REMOVE)."""
    if text.startswith("~") and "=" not in text:
        key, value = text[1:], REMOVE
    elif "=" in text:
        key, raw = text.split("=", 1)
        try:
            value = yaml.load(raw, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader)
        except TooManyAliases as exc:
            raise UserInputError(key or "override", raw, f"{exc}; write the values out instead") from None
        except yaml.YAMLError as exc:
            problem = re.sub(r"\s+", " ", str(getattr(exc, "problem", None) or exc))
            raise UserInputError(key or "override", raw, f"the value is not YAML ({problem}); quote a value "
                                                         "with spaces or brackets for the shell, e.g. "
                                                         "'replicate.seeds=[0,1,2]'") from None
    else:
        raise UserInputError("override", text, OVERRIDE_FORM)
    if not OVERRIDE_KEY.fullmatch(key):
        raise UserInputError("override", text, OVERRIDE_FORM)
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of a study file's mapping with the overrides applied in order (a later one wins), each
    setting one key and creating the mappings above it; validation is the study file's own, so an
    unknown key gets the same did-you-mean line as in a file."""
    merged = copy.deepcopy(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = merged
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None and value is not REMOVE:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[:depth + 1])
                raise UserInputError(where, child, f"it is not a mapping, so {'.'.join(path)} cannot be "
                                                   f"{'removed' if value is REMOVE else 'set'}; override {where} "
                                                   "itself")
            node = child
        if value is REMOVE:
            if path[-1] not in node:
                raise UserInputError(".".join(path), None, "the study file has no such key to remove (~KEY removes "
                                                           "a key; KEY=VALUE sets one)")
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return merged
