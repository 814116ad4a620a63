"""Which installed plugins a study uses, as its record keeps them: the kind, and every value of a
config field whose names come from a registry (`TrainableKind.names`: poolings, objectives) that a
plugin's distribution provides — so the record says what to install to run the study again, while
`status`, `report` and `verify` read the record and need none of it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from reports.record import PluginRecord
from search_spaces.params import Choice, Fixed, Grid, Param
from trainables.errors import UserInputError
from trainables.kinds import KINDS, TrainableKind
from trainables.registry import Registry

if TYPE_CHECKING:
    from trainables.contract import TrialConfig


def _values(param: Param) -> list[Any]:
    """The names a tuned field can take (a range holds numbers, no names)."""
    return [param.value] if isinstance(param, Fixed) else list(param.values) if isinstance(param, Grid | Choice) \
        else []


def plugins_used(trainable: str, kind: TrainableKind, parsed: list[TrialConfig],
                 tuned: dict[str, Param]) -> tuple[PluginRecord, ...]:
    """The plugin entries behind the study's kind and the registered names its trial configs use."""
    uses: list[tuple[Registry, str]] = [(KINDS, trainable)]
    for field, registry in kind.names.items():
        if not isinstance(registry, Registry):
            continue
        uses += [(registry, getattr(cfg, field)) for cfg in parsed if isinstance(getattr(cfg, field, None), str)]
        uses += [(registry, value) for value in _values(tuned.get(field, Fixed(None))) if isinstance(value, str)]
    found: dict[tuple[str, str], PluginRecord] = {}
    for registry, name in uses:
        entries = registry.entries().get(name, [])
        if len(entries) == 1 and not entries[0].builtin:
            entry = entries[0]
            group = registry.group.rsplit(".", 1)[-1]
            found.setdefault((group, name), PluginRecord(group=group, name=name, distribution=entry.distribution,
                                                         version=entry.version, target=entry.target))
    return tuple(found[key] for key in sorted(found))


def check_installed(plugins: Iterable[PluginRecord], study: str) -> None:
    """Resuming runs the study's code again: a plugin it was launched with that is no longer installed
    is one line naming the distribution and version to install (not the list of names valid now)."""
    from trainables.objectives import OBJECTIVES
    from trainables.poolings import POOLINGS

    registries = {"kinds": KINDS, "objectives": OBJECTIVES, "poolings": POOLINGS}
    for plugin in plugins:
        registry = registries.get(plugin.group)
        if registry is None or registry.entries().get(plugin.name):
            continue
        raise UserInputError(registry.what, plugin.name, f"study {study} was launched with it from "
                                                         f"{plugin.distribution} {plugin.version}, which is not "
                                                         f"installed now: pip install '{plugin.distribution}=="
                                                         f"{plugin.version}', then resume it")
