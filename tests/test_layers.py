"""The import graph of the project's own packages has no circle, counting the imports made inside
functions too (a circle held together by function-local imports is still a circle), and the kinds'
stages sit below the kinds: no stage reaches a kind through the registry."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "trainables", "reports", "search_spaces")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Project modules `path` imports anywhere (module level or inside functions), except under
    `if TYPE_CHECKING:`; `from a.b import c` counts `a.b.c` when that is a module, else `a.b`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking_only(node)
               for child in node.body for n in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in modules else node.module)
    return found & modules


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    modules = set(files)
    return {name: imports_of(path, modules) - {name} for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_circle_held_by_a_function_local_import(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    modules = {"a", "b", "c"}
    edges = {m: imports_of(tmp_path / f"{m}.py", modules) for m in modules}
    assert cycles(edges) == [["a", "b"]] and edges["c"] == set()


def test_no_import_circle_in_the_project():
    assert cycles(graph()) == []


def test_stages_and_the_building_blocks_never_reach_the_registry():
    edges = graph()
    below = [m for m in edges if m.startswith(("trainables.stages", "trainables.training", "trainables.objectives",
                                                "trainables.models", "trainables.data", "trainables.evaluation"))]
    assert {m: sorted(edges[m] & {"trainables.kinds"}) for m in below if "trainables.kinds" in edges[m]} == {}


def test_the_estimate_and_the_reports_read_only_declarations():
    """They never reach into learners, data, models or the loop: what they need, the kinds declare
    (and the stage registry names its pilots)."""
    declarations = {"trainables.errors", "trainables.names", "trainables.kinds", "trainables.kinds.base",
                    "trainables.stages", "trainables.stages.fields"}
    edges = graph()
    readers = ["orchestrator.checks.estimate", *[m for m in edges if m.startswith("reports")]]
    reached = {m: sorted(t for t in edges[m] if t.startswith("trainables") and t not in declarations) for m in readers}
    assert {m: t for m, t in reached.items() if t} == {}


# orchestrator/'s packages, lowest first: each imports only those before it (and trainables, search_spaces,
# reports); `api` and the package's face sit on run/, the command line on top of everything.
ORCHESTRATOR_FLOORS = ("orchestrator.study", "orchestrator.checks", "orchestrator.run", "orchestrator.api",
                       "orchestrator.cli")


def floor_of(module: str) -> int | None:
    for number, package in enumerate(ORCHESTRATOR_FLOORS):
        if module == package or module.startswith(package + "."):
            return number
    return None


def test_orchestrator_s_packages_import_only_the_ones_below():
    edges = graph()
    upward = {m: sorted(t for t in targets if floor_of(t) is not None and floor_of(t) > floor_of(m))
              for m, targets in edges.items() if floor_of(m) is not None}
    assert {m: t for m, t in upward.items() if t} == {}
    # and every module of orchestrator/ is on a floor (a new module is placed, not left in the hall)
    loose = [m for m in edges if m.startswith("orchestrator.") and floor_of(m) is None
             and not m.startswith("orchestrator.testing")]
    assert loose == []


def test_the_floor_rule_sees_an_import_that_runs_back_up():
    assert floor_of("orchestrator.study.plan") < floor_of("orchestrator.run.launcher")
    assert floor_of("orchestrator.studyx") is None and floor_of("orchestrator") is None


# trainables/'s folders and modules, lowest first: each imports only those on its floor or below. The kinds sit on
# top, each in one folder (its declaration in `__init__.py`, its learner beside it), above the loop that drives
# every learner (`training/`), the stages a trial may build, and the building blocks.
TRAINABLES_FLOORS = (("trainables.errors", "trainables.hub", "trainables.names"),
                     ("trainables.registry", "trainables.contract"), ("trainables.data",), ("trainables.poolings",),
                     ("trainables.models",), ("trainables.runtime",), ("trainables.objectives",),
                     ("trainables.evaluation",), ("trainables.training",), ("trainables.stages",),
                     ("trainables.kinds",))


def trainables_floor(module: str) -> int | None:
    for number, floor in enumerate(TRAINABLES_FLOORS):
        if any(module == package or module.startswith(package + ".") for package in floor):
            return number
    return None


def test_trainables_folders_import_only_the_ones_below_and_a_kind_only_itself():
    edges = graph()
    ours = {m: targets for m, targets in edges.items() if m.startswith("trainables.")}
    assert [m for m in ours if trainables_floor(m) is None] == []  # every module on a floor
    upward = {m: sorted(t for t in targets if (trainables_floor(t) or 0) > trainables_floor(m))
              for m, targets in ours.items()}
    assert {m: t for m, t in upward.items() if t} == {}
    # a kind in one place: its modules import no other kind's (the registry and the shared base aside)
    crossing = {m: sorted(t for t in targets if t.startswith("trainables.kinds.") and t != "trainables.kinds.base"
                          and t.split(".")[2] != m.split(".")[2])
                for m, targets in ours.items() if m.startswith("trainables.kinds.") and m != "trainables.kinds.base"}
    assert {m: t for m, t in crossing.items() if t} == {}
    assert {p.name for p in (ROOT / "trainables" / "kinds").iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == {"finetune", "probe", "cross_encoder", "contrastive", "distill"}


def test_the_trainables_floor_rule_sees_an_import_that_runs_back_up():
    assert trainables_floor("trainables.stages.pretrain") < trainables_floor("trainables.kinds.contrastive.stage")
    assert trainables_floor("trainables.runtime") > trainables_floor("trainables.models.embedding_grad")
    assert trainables_floor("trainables.kindsx") is None
