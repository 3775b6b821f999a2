"""The floors of the package: imports flow down only, and only the engine (and what sits on it)
imports pyspark. Read from the source, so a function-level import counts as well."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sparkstate"

#: Floor of each top-level part of the package, lowest first; a module may import its own
#: floor and those below it.
FLOORS = {
    "exceptions": 0,
    "functions": 0,
    "console": 0,
    "files": 1,
    "store": 2,
    "operators": 3,
    "runtime": 4,
    "testing": 5,
    "observe": 5,
    "engine": 6,
    "demo": 7,
    "bench": 7,
    "cli": 7,
    "__init__": 7,
}
#: Floors that must run without pyspark (in a plain Python worker, or a user's unit test).
SPARK_FREE = {
    "exceptions",
    "functions",
    "console",
    "files",
    "store",
    "operators",
    "runtime",
    "testing",
    "observe",
}


def _part(module: Path) -> str:
    return module.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(module: Path) -> list[str]:
    """Every module name imported anywhere in ``module`` (``from sparkstate import x`` gives the
    package root, which runs the lazy public API)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(module.read_text(), str(module))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_has_a_floor() -> None:
    assert {_part(m) for m in MODULES} <= set(FLOORS)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: str(m.relative_to(PACKAGE)))
def test_imports_flow_down_only(module: Path) -> None:
    part = _part(module)
    for name in _imports(module):
        top, _, rest = name.partition(".")
        if top == "pyspark":
            assert part not in SPARK_FREE, f"{part} must not import pyspark ({name})"
        if top != "sparkstate":
            continue
        target = rest.split(".")[0] if rest else "__init__"
        assert FLOORS[target] <= FLOORS[part], f"{part} (floor {FLOORS[part]}) imports {name}"
        if part != "__init__" and FLOORS[part] < FLOORS["demo"]:
            assert rest, f"{part} imports the package root ({name}); import the module instead"


#: The engine's rooms, lowest first: what touches Spark's internals, planning, running a batch,
#: the one-off jobs over a checkpoint, and what the user calls.
ENGINE_FLOORS = {"spark": 0, "plan": 1, "run": 2, "jobs": 3, "api": 4, "__init__": 5}


def _room(module: str) -> str:
    """The engine room of a dotted module name under ``sparkstate.engine``."""
    rest = module.removeprefix("sparkstate.engine").lstrip(".")
    return rest.split(".")[0] if rest else "__init__"


ENGINE = [m for m in MODULES if _part(m) == "engine"]


@pytest.mark.parametrize("module", ENGINE, ids=lambda m: str(m.relative_to(PACKAGE)))
def test_engine_rooms_import_down_only(module: Path) -> None:
    room = _room(_module_name(module))
    assert room in ENGINE_FLOORS, f"{module.name} is in no room of the engine"
    for name in _imports(module):
        if name.startswith("sparkstate.engine."):
            target = _room(name)
            floors = ENGINE_FLOORS[target], ENGINE_FLOORS[room]
            assert floors[0] <= floors[1], f"engine/{room} imports {name} (engine/{target})"


def _module_name(module: Path) -> str:
    name = ".".join(module.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def test_no_import_circles() -> None:
    """No module imports, by any way round (a function-level import too), one that imports it:
    each module can be read knowing only the modules below it."""
    names = {_module_name(m) for m in MODULES}
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        name = _module_name(module)
        targets = set()
        for imported in _imports(module):
            # the longest known module that the name is or lies in (``from a.b import c``
            # names the module a.b, or a.b.c when c is a module)
            while imported and imported not in names:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and module.name != "__init__.py":
                targets.add(imported)
        graph[name] = targets
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
