"""The registries a study file names things from — kinds, objectives, poolings — and how installed
packages add to them.

Every entry is a name and a `module:attribute` reference, imported on first use. The built-in entries
are this package's table; a plugin declares its entries under an entry-point group
(`ablation_orchestrator.kinds`, `.objectives`, `.poolings`) in its own `pyproject.toml`, and its names
become valid in the study file exactly like the built-in ones: the same lookup, the same checks, the
same contract tests. The study file holds names only, never a dotted path: what is not registered by
an installed distribution cannot be named. A name that two distributions register is refused where it
is used, naming both, rather than one of them winning silently.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any

from trainables.errors import UserInputError

GROUP_PREFIX = "ablation_orchestrator"
GROUPS = ("kinds", "objectives", "poolings", "architectures")
SELF = "ablation-orchestrator"  # this distribution: its entries are the built-in tables, not entry points


@dataclass(frozen=True)
class Entry:
    """One registered name: what it refers to and the distribution that provides it."""

    name: str
    target: str  # module:attribute
    distribution: str = SELF
    version: str = ""

    @property
    def builtin(self) -> bool:
        return self.distribution == SELF

    @property
    def package(self) -> str:
        """`name version` of the distribution, as an error message or a study record names it."""
        return f"{self.distribution} {self.version}".strip()


# Where plugins are looked for: None is every installed distribution (sys.path, what a user has); a list of
# folders reads only the distributions installed there (the test suite's fixtures: the built-ins plus exactly
# the plugins a test installs, whatever else is installed in the environment it runs in).
PLUGIN_PATH: list[str] | None = None


@cache
def _installed_entries() -> dict[str, tuple[Entry, ...]]:
    """Every installed distribution's entries under this project's groups, read once per process."""
    found: dict[str, list[Entry]] = {}
    seen: set[str] = set()
    distributions = metadata.distributions() if PLUGIN_PATH is None else metadata.distributions(path=PLUGIN_PATH)
    for dist in distributions:
        name = dist.metadata["Name"] or "unknown"
        if _normalized(name) in seen or _normalized(name) == _normalized(SELF):
            continue  # the first of a name on the path is the one imported, as importlib's entry_points reads it
        seen.add(_normalized(name))
        for point in dist.entry_points:
            if point.group in {f"{GROUP_PREFIX}.{group}" for group in GROUPS}:
                found.setdefault(point.group, []).append(Entry(point.name, point.value, name, dist.version))
    return {group: tuple(entries) for group, entries in found.items()}


def _normalized(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def refresh() -> None:
    """Forget what was read from the installed distributions (after a plugin is installed in-process)."""
    _installed_entries.cache_clear()
    _loaded.clear()


_loaded: dict[str, Any] = {}


def load_target(target: str) -> Any:
    """The object a `module:attribute` reference names, imported once per process."""
    if target not in _loaded:
        module, _, attribute = target.partition(":")
        value: Any = importlib.import_module(module)
        for part in attribute.split(".") if attribute else ():
            value = getattr(value, part)
        _loaded[target] = value
    return _loaded[target]


class Registry(MutableMapping[str, str]):
    """Names -> `module:attribute` references: the built-in table, then what installed plugins
    declare under `ablation_orchestrator.<group>`. As a mapping it reads like the closed dicts it
    replaces (`name in KINDS`, `KINDS[name]`, `list(KINDS)`); setting a name registers it in this
    process only, as a built-in (what tests do with a toy kind)."""

    def __init__(self, group: str, what: str, builtins: dict[str, str]):
        self.group, self.what, self.builtins = f"{GROUP_PREFIX}.{group}", what, dict(builtins)

    def entries(self) -> dict[str, list[Entry]]:
        """Every name with the entries that register it (more than one: a clash)."""
        out: dict[str, list[Entry]] = {name: [Entry(name, target)] for name, target in self.builtins.items()}
        for entry in sorted(_installed_entries().get(self.group, ()), key=lambda e: (e.distribution, e.name)):
            out.setdefault(entry.name, []).append(entry)  # the same order wherever they are installed
        return out

    def entry(self, name: str, key: str) -> Entry:
        """The one entry of `name`; an unknown name lists the valid ones (plugins with their
        package), a name two distributions register names both."""
        found = self.entries().get(name) if isinstance(name, str) else None
        if not found:
            raise self.unknown(key, name)
        if len(found) > 1:
            raise UserInputError(key, name, f"{self.what} {name} is registered by " + " and by ".join(
                e.package for e in found) + f" ({self.group}): uninstall one of them")
        return found[0]

    def load(self, name: str, key: str) -> Any:
        return load_target(self.entry(name, key).target)

    def declared(self, name: str, key: str, expected: type, what: str) -> Any:
        """The declaration registered as `name`, checked to be an `expected` (`what` names it, "an
        Objective (trainables.objectives.base)"); a plugin that cannot be imported, or registers something
        else, is one line naming it and why."""
        entry = self.entry(name, key)
        try:
            declared = load_target(entry.target)
        except Exception as exc:  # a plugin that cannot be imported
            raise UserInputError(key, name, f"{entry.target} ({entry.package}) cannot be imported: "
                                            f"{type(exc).__name__}: {exc}") from None
        if not isinstance(declared, expected):
            raise UserInputError(key, name, f"{entry.target} ({entry.package}) is not {what}: fix or uninstall "
                                            "the plugin")
        return declared

    def unknown(self, key: str, value: object) -> UserInputError:
        return UserInputError(key, value, "use one of: " + self.listing())

    def listing(self, names: list[str] | None = None, sort: bool = True) -> str:
        """The valid names (sorted, or in registry order); a plugin's with the distribution it comes from."""
        entries = self.entries()
        shown = []
        chosen = list(names if names is not None else entries)
        for name in sorted(chosen) if sort else chosen:
            plugins = [e.package for e in entries[name] if not e.builtin]
            shown.append(f"{name} ({', '.join(plugins)})" if plugins else name)
        return ", ".join(shown)

    def plugins(self) -> list[Entry]:
        return [e for entries in self.entries().values() for e in entries if not e.builtin]

    def __getitem__(self, name: str) -> str:
        found = self.entries()[name]
        return found[0].target

    def __setitem__(self, name: str, target: str) -> None:
        self.builtins[name] = target

    def __delitem__(self, name: str) -> None:
        del self.builtins[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self.entries())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.entries()


def build_module(build: Any, dim: int, key: str, name: str, target: str, what: str, where: str) -> Any:
    """`build(dim)` for the registered `name` (a plugin's `target` class), which must make a torch module: a
    class that cannot be made from the size, or makes something else, is one line naming the key, the name and
    the class, and saying what `what` (a PairLoss, a pooling: declared in `where`) must be."""
    from torch import nn

    try:
        module = build(dim)
    except UserInputError:
        raise
    except Exception as exc:  # a plugin's class that cannot be made from the size
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserInputError(key, name, f"its module {target}({dim}) could not be built ({type(exc).__name__}: "
                                        f"{first}); {what} is Class(dim), a torch module ({where})") from exc
    if not isinstance(module, nn.Module):
        raise UserInputError(key, name, f"its module {target}({dim}) is a {type(module).__name__}, not a torch "
                                        f"module; {what} is an nn.Module ({where})")
    return module

