"""Operators describe themselves: every operator class is found by the kind its checkpoint
records, and the code that reads stored state (``observe/``) asks the class, never a kind."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import sparkstate.operators
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.base import StatefulOperator
from sparkstate.operators.registry import OPERATORS, layout_of, operator_class
from sparkstate.operators.state_layout import StateLayout

OBSERVE = Path(sparkstate.operators.__file__).resolve().parents[1] / "observe"


def _operator_classes() -> set[type[StatefulOperator]]:
    for info in pkgutil.walk_packages(sparkstate.operators.__path__, "sparkstate.operators."):
        importlib.import_module(info.name)
    found: set[type[StatefulOperator]] = set()
    todo = list(StatefulOperator.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("sparkstate.operators.") and not inspect.isabstract(cls):
            found.add(cls)
    return found


def test_every_operator_class_is_found_by_its_kind() -> None:
    classes = _operator_classes()
    assert classes, "no operator class found"
    for cls in classes:
        assert operator_class(cls.kind) is cls
    assert set(OPERATORS.values()) == classes


def test_each_kind_has_its_spark_progress_name() -> None:
    names = {kind: cls.progress_name for kind, cls in OPERATORS.items()}
    assert all(names.values()), names
    assert len(set(names.values())) == len(names), "two kinds show as one Spark operator"


def test_an_unknown_kind_is_an_error_that_names_the_kinds() -> None:
    with pytest.raises(ConfigurationError, match="no stateful operator of kind 'nope'.*aggregate"):
        operator_class("nope")
    assert layout_of("nope") is StateLayout


def _strings(module: Path) -> list[tuple[int, str]]:
    tree = ast.parse(module.read_text(), str(module))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


@pytest.mark.parametrize("module", sorted(OBSERVE.glob("*.py")), ids=lambda m: m.name)
def test_observe_names_no_operator_kind(module: Path) -> None:
    """A kind, alone or opening a message, in observe/ is knowledge that belongs to its class."""
    for line, text in _strings(module):
        for kind in OPERATORS:
            assert text != kind and not text.startswith(f"{kind} "), f"{module.name}:{line}"
