"""Nested state (arrays, structs, maps, nested) in ``StatefulProcessor`` variables and
``GroupState``, through the Spark-free harness on both providers and across a restart: values
come back as PySpark hands them (lists, Rows, dicts), whatever form the user wrote them in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa
import pytest

from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.testing import group_state_harness, processor_harness

from .conftest import PROVIDERS

INPUT = pa.schema([("k", pa.string()), ("v", pa.int64())])
OBJ = (
    "ids array<int>, tags array<array<string>>, "
    "metadata array<struct<key: string, value: string>>, "
    "address array<struct<road_id:int,city:string>>"
)
MAP_VALUE = "id int, attributes map<string, array<int>>, confs map<string, map<string, int>>"


class Address(NamedTuple):
    road_id: int
    city: str


TAGS = [["dummy1", "dummy2"], ["dummy3"]]
METADATA = [{"key": "env", "value": "prod"}, {"key": "region", "value": None}]
ADDRESS = [Address(1, "Seattle"), Address(3, "SF")]


class Composite(StatefulProcessor):
    """Keeps nested values in all three kinds of state and reports what it read back."""

    def init(self, handle: Any) -> None:
        self.obj = handle.getValueState("obj", OBJ)
        self.items = handle.getListState("items", OBJ)
        self.maps = handle.getMapState("maps", "name string", MAP_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        total = sum(r[1] for r in rows)
        if self.obj.exists():
            ids, tags, metadata, address = self.obj.get()
            assert tags == TAGS
            assert [m.asDict() for m in metadata] == METADATA  # structs are Rows
            assert [(a.road_id, a["city"]) for a in address] == [tuple(a) for a in ADDRESS]
            ids.append(-1)  # a value read is the user's own: this changes no state
            assert self.obj.get()[0] == ids[:-1]
            ids = [x + total for x in ids[:-1]]
        else:
            ids = [0]
        self.obj.update((ids, TAGS, METADATA, ADDRESS))
        kept = [(list(i) + [total], t, m, a) for i, t, m, a in self.items.get()]
        self.items.put(kept or [(ids, None, [None], [])])
        name = key[0]
        if not self.maps.containsKey(name):
            self.maps.updateValue(name, (0, {"key1": [1], "key2": None}, {"e1": {"e2": 5}}))
        else:
            n, attributes, confs = self.maps.getValue(name)
            attributes[name] = [total]
            confs.setdefault("e1", {})[name] = total
            self.maps.updateValue(name, (n + 1, attributes, confs))
        n, attributes, confs = self.maps.getValue(name)
        flat = [x for i, _, _, _ in self.items.get() for x in i]
        yield (name, ids, flat, sorted(attributes), {"n": n, "confs": confs["e1"]})


def _harness(directory: Path, provider: str) -> Any:
    return processor_harness(
        Composite(),
        key_columns=["k"],
        output_schema=(
            "k string, ids array<int>, flat array<int>, attrs array<string>, "
            "info struct<n: int, confs: map<string, int>>"
        ),
        input_schema=INPUT,
        time_mode="None",
        row_format="tuple",
        directory=directory,
        provider=provider,
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_composite_state_round_trips_across_a_restart(tmp_path: Path, provider: str) -> None:
    with _harness(tmp_path, provider) as h:
        first = h.run([{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 5}])
        second = h.run([{"k": "a", "v": 3}])
    with _harness(tmp_path, provider) as h:  # a restart on the same directory
        third = h.run([{"k": "a", "v": 4}, {"k": "b", "v": 1}])
        assert h.value_state("obj", "a")[0] == [7]
        assert h.map_state("maps", "b")[("b",)] == (
            1,
            [("key1", [1]), ("key2", None), ("b", [1])],
            [("e1", [("e2", 5), ("b", 1)])],
        )
    assert _plain(first) == [
        ("a", [0], [0], ["key1", "key2"], {"n": 0, "confs": [("e2", 5)]}),
        ("b", [0], [0], ["key1", "key2"], {"n": 0, "confs": [("e2", 5)]}),
    ]
    assert _plain(second) == [
        ("a", [3], [0, 3], ["a", "key1", "key2"], {"n": 1, "confs": [("e2", 5), ("a", 3)]}),
    ]
    assert _plain(third) == [
        ("a", [7], [0, 3, 4], ["a", "key1", "key2"], {"n": 2, "confs": [("e2", 5), ("a", 4)]}),
        ("b", [1], [0, 1], ["b", "key1", "key2"], {"n": 1, "confs": [("e2", 5), ("b", 1)]}),
    ]


def _plain(rows: Any) -> list[tuple[Any, ...]]:
    """A batch's output rows, as Python values (maps as lists of pairs), sorted."""
    return sorted(tuple(r.values()) for r in rows.table.to_pylist())


def count_points(key: tuple[Any, ...], rows: list[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState-style state with a struct and a map."""
    if state.exists:
        point, seen = state.get
        assert point.x == point["x"]  # a Row
    else:
        point, seen = {"x": 0, "tags": []}, {}
    for _, v in rows:
        seen[str(v)] = seen.get(str(v), 0) + 1
    new = {"x": point["x"] + len(rows), "tags": [*point["tags"], key[0]]}
    state.update((new, seen))
    yield (key[0], new["x"], len(seen))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_group_state_with_nested_values(tmp_path: Path, provider: str) -> None:
    def harness() -> Any:
        return group_state_harness(
            count_points,
            key_columns=["k"],
            output_schema="k string, x long, distinct long",
            state_schema="point struct<x: long, tags: array<string>>, seen map<string, long>",
            input_schema=INPUT,
            directory=tmp_path,
            provider=provider,
        )

    with harness() as h:
        h.run([{"k": "a", "v": 1}, {"k": "a", "v": 1}])
    with harness() as h:
        out = h.run([{"k": "a", "v": 2}])
        assert _plain(out) == [("a", 3, 2)]


class SeededNested(StatefulProcessor):
    """Initial state of nested columns (an array and a struct) seeds a ValueState."""

    def init(self, handle: Any) -> None:
        self.seed = handle.getValueState("seed", "vs array<long>, who struct<name: string>")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802, N803
        if hasattr(initialState, "iloc"):  # pandas mode: a numpy array and a dict per cell
            vs, who = initialState["vs"].iloc[0], initialState["who"].iloc[0]
        else:
            vs, who = initialState.vs, initialState.who
        self.seed.update((vs, who))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        items = list(rows)
        frames = bool(items) and hasattr(items[0], "iloc")
        n = sum(len(r) for r in items) if frames else len(items)
        vs, who = self.seed.get() if self.seed.exists() else ([], None)
        vs = [*vs, n]
        self.seed.update((vs, who))
        out = (key[0], vs, None if who is None else who.name)
        if frames:
            yield pd.DataFrame([out], columns=["k", "vs", "name"])
        else:
            yield out


@pytest.mark.parametrize("mode", ["rows", "pandas"])
def test_nested_initial_state(tmp_path: Path, mode: str) -> None:
    initial = pa.table(
        {
            "k": ["a", "c"],
            "vs": pa.array([[1, 5], []], pa.list_(pa.int64())),
            "who": pa.array([{"name": "x"}, None], pa.struct([("name", pa.string())])),
        }
    )
    h = processor_harness(
        SeededNested(),
        key_columns=["k"],
        output_schema="k string, vs array<bigint>, name string",
        mode=mode,
        input_schema=INPUT,
        initial_state=initial,
        initial_state_schema="k string, vs array<bigint>, who struct<name: string>",
        directory=tmp_path,
    )
    with h:
        out = h.run([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}])
        assert _plain(out) == [("a", [1, 5, 2], "x"), ("b", [1], None)]
        assert h.value_state("seed", "c") == ([], None)
