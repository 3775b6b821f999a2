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
    "store": 1,
    "operators": 2,
    "runtime": 3,
    "testing": 4,
    "observe": 4,
    "engine": 5,
    "demo": 6,
    "bench": 6,
    "cli": 6,
    "__init__": 6,
}
#: Floors that must run without pyspark (in a plain Python worker, or a user's unit test).
SPARK_FREE = {
    "exceptions", "functions", "console", "store", "operators", "runtime", "testing", "observe",
}  # fmt: skip


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
