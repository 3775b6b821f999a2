"""State schemas that change across restarts, and pickled state, through the Spark-free harness.

Each test runs a function or processor on a checkpoint directory, then a changed one on the same
directory (a restart with a new query), on the memory and rocksdb providers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import sparkstate
from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.operators.arbitrary.state_errors import (
    InvalidStateValueError,
    UnsupportedStateOperationError,
)
from sparkstate.testing import group_state_harness, processor_harness

from .conftest import PROVIDERS

INPUT = pa.schema([("k", pa.string()), ("v", pa.int64())])
PICKLED = sparkstate.PICKLED  # type: ignore[attr-defined]


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- GroupState -----------------------------------------------------------------------------------


def _counting(names: list[str]) -> Any:
    """A function keeping ``count`` (and ``last`` when the schema has it) per key; it outputs the
    state it found."""

    def func(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: Any) -> Iterator[Any]:
        old = dict(zip(names, state.get, strict=True)) if state.exists else {}
        count = (old.get("count") or 0) + len(rows)
        new = {"count": count, "last": rows[-1][1], "label": f"{key[0]}{count}"}
        state.update(tuple(new[n] for n in names))
        yield (key[0], count, repr(sorted(old.items())))

    return func


def _group_harness(directory: Path, provider: str, state_schema: Any, func: Any) -> Any:
    return group_state_harness(
        func,
        key_columns=["k"],
        output_schema="k string, count long, old string",
        state_schema=state_schema,
        input_schema=INPUT,
        directory=directory,
        provider=provider,
    )


def test_group_state_gains_reorders_and_drops_fields(tmp_path: Path, provider: str) -> None:
    rows = [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}]
    with _group_harness(tmp_path, provider, "count long", _counting(["count"])) as h:
        h.run(rows)
        assert h.group_state("a") == (2,)
    names = ["last", "count", "label"]
    schema = "last long, count long, label string"
    with _group_harness(tmp_path, provider, schema, _counting(names)) as h:
        out = h.run([{"k": "a", "v": 5}, {"k": "c", "v": 6}])
        assert out.sorted_rows("k") == [
            {"k": "a", "count": 3, "old": "[('count', 2), ('label', None), ('last', None)]"},
            {"k": "c", "count": 1, "old": "[]"},
        ]
        assert h.group_state("b") == (None, 1, None)
        assert h.group_state("a") == (5, 3, "a3")
    with _group_harness(
        tmp_path, provider, "label string, count long", _counting(["label", "count"])
    ) as h:
        out = h.run([{"k": "a", "v": 7}, {"k": "b", "v": 8}])
        assert out.sorted_rows("k") == [
            {"k": "a", "count": 4, "old": "[('count', 3), ('label', 'a3')]"},
            {"k": "b", "count": 2, "old": "[('count', 1), ('label', None)]"},
        ]
        assert h.batch_id == 3


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("count string", r"'count' changed type from int64 to string"),
        ("count long, n long not null", r"'n' \(int64\) is added but not nullable"),
        (PICKLED, "from schema-encoded values to pickled Python objects"),
    ],
)
def test_group_state_refuses_incompatible_changes(
    tmp_path: Path, provider: str, schema: Any, message: str
) -> None:
    with _group_harness(tmp_path, provider, "count long", _counting(["count"])) as h:
        h.run([{"k": "a", "v": 1}])
    with pytest.raises(SchemaMismatchError, match=f"{message}.*new checkpoint location"):
        _group_harness(tmp_path, provider, schema, _counting(["count"]))


def _collect(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: Any) -> Iterator[Any]:
    seen = state.getOption or {"values": [], "calls": 0}
    assert isinstance(seen, dict)
    seen = {"values": seen["values"] + [r[1] for r in rows], "calls": seen["calls"] + 1}
    state.update(seen)
    yield (key[0], seen["calls"], repr(state.get["values"]))


def test_pickled_group_state(tmp_path: Path, provider: str) -> None:
    def harness() -> Any:
        return _group_harness(tmp_path, provider, PICKLED, _collect)

    with harness() as h:
        h.run([{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 3}])
        assert h.group_state("a") == {"values": [1, 2], "calls": 1}
    with harness() as h:  # restart: the objects come back
        out = h.run([{"k": "a", "v": 4}])
        assert out.rows == [{"k": "a", "count": 2, "old": "[1, 2, 4]"}]
        assert h.group_state("b") == {"values": [3], "calls": 1}
    with pytest.raises(SchemaMismatchError, match="from pickled Python objects to schema-encoded"):
        _group_harness(tmp_path, provider, "calls long", _counting(["calls"]))


def test_pickled_group_state_only_on_request(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pass sparkstate.PICKLED"):
        _group_harness(tmp_path, "memory", dict, _collect)
    with pytest.raises(ConfigurationError, match="'__pickled' is reserved"):
        _group_harness(tmp_path, "memory", "__pickled binary", _collect)

    def none(key: Any, rows: Any, state: Any) -> Iterator[Any]:
        state.update(None)
        yield from ()

    with (
        _group_harness(tmp_path, "memory", PICKLED, none) as h,
        pytest.raises(InvalidStateValueError, match="None"),
    ):
        h.run([{"k": "a", "v": 1}])


def test_pickled_state_survives_pickling_the_sentinel() -> None:
    import pickle

    assert pickle.loads(pickle.dumps(PICKLED)) is PICKLED
    assert repr(PICKLED) == "sparkstate.PICKLED"


# --- StatefulProcessor ----------------------------------------------------------------------------


class Tracker(StatefulProcessor):
    """Keeps a value, a list and a map per key under the schemas it is given."""

    def __init__(self, value: Any, element: Any, map_value: Any, ttl: int | None = None) -> None:
        self.schemas = (value, element, map_value)
        self.ttl = ttl

    def init(self, handle: Any) -> None:
        value, element, map_value = self.schemas
        self.total = handle.getValueState("total", value)
        self.seen = handle.getListState("seen", element, self.ttl)
        self.by_v = handle.getMapState("by_v", "v long", map_value)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        values = [r[1] for r in rows]
        self.update(key[0], values)
        yield (key[0], len(values))

    def update(self, key: str, values: list[int]) -> None:
        old = self.total.get()
        self.total.update(((old[0] if old else 0) + sum(values),))
        self.seen.appendList([(v,) for v in values])
        for v in values:
            self.by_v.updateValue(v, (f"{key}{v}",))


class WideTracker(Tracker):
    """The same processor after the schemas grew (new nullable fields, reordered)."""

    def update(self, key: str, values: list[int]) -> None:
        old = self.total.get()
        self.total.update((f"n{len(values)}", (old[1] if old else 0) + sum(values)))
        self.seen.appendList([(v, v * 10) for v in values])
        for v in values:
            self.by_v.updateValue(v, (v, f"{key}{v}"))


class PickledTracker(Tracker):
    def update(self, key: str, values: list[int]) -> None:
        old = self.total.get() or {"sum": 0}
        self.total.update({"sum": old["sum"] + sum(values)})
        self.seen.appendList([{"v": v} for v in values])
        for v in values:
            self.by_v.updateValue(v, [key, v])


def _processor_harness(directory: Path, provider: str, processor: Any) -> Any:
    return processor_harness(
        processor,
        key_columns=["k"],
        output_schema="k string, n long",
        input_schema=INPUT,
        time_mode="ProcessingTime",
        row_format="tuple",
        directory=directory,
        provider=provider,
    )


@pytest.mark.parametrize("ttl", [None, 3_600_000])
def test_processor_state_variables_evolve(tmp_path: Path, provider: str, ttl: int | None) -> None:
    old = Tracker("total long", "v long", "label string", ttl)
    with _processor_harness(tmp_path, provider, old) as h:
        h.run([{"k": "a", "v": 1}, {"k": "a", "v": 2}])
        assert h.list_state("seen", "a") == [(1,), (2,)]
    wide = WideTracker("note string, total long", "v long, v10 long", "v long, label string", ttl)
    with _processor_harness(tmp_path, provider, wide) as h:
        h.run([{"k": "a", "v": 3}, {"k": "b", "v": 4}])
        assert h.value_state("total", "a") == ("n1", 6)
        assert h.value_state("total", "b") == ("n1", 4)
        assert h.list_state("seen", "a") == [(1, None), (2, None), (3, 30)]
        assert h.map_state("by_v", "a") == {(1,): (None, "a1"), (2,): (None, "a2"), (3,): (3, "a3")}
    # dropping the added fields again reads what the wider schema wrote
    with _processor_harness(tmp_path, provider, old) as h:
        h.run([{"k": "a", "v": 5}])
        assert h.value_state("total", "a") == (11,)
        assert h.list_state("seen", "a") == [(1,), (2,), (3,), (5,)]
        assert h.map_state("by_v", "a")[(3,)] == ("a3",)


@pytest.mark.parametrize(
    ("processor", "message"),
    [
        (Tracker("total string", "v long", "label string"), "'total'.*'total' changed type"),
        (Tracker("total long", "v int", "label string"), "'\\$elements_seen'.*'v' changed type"),
        (
            Tracker("total long", "v long", "label string, n long not null"),
            "'\\$elements_by_v'.*'n' \\(int64\\) is added but not nullable",
        ),
        (Tracker("total long", PICKLED, "label string"), "'\\$elements_seen'.*to pickled"),
    ],
)
def test_processor_refuses_incompatible_changes(
    tmp_path: Path, provider: str, processor: Any, message: str
) -> None:
    with _processor_harness(
        tmp_path, provider, Tracker("total long", "v long", "label string")
    ) as h:
        h.run([{"k": "a", "v": 1}])
    with pytest.raises(SchemaMismatchError, match=message):
        _processor_harness(tmp_path, provider, processor)


def test_pickled_processor_state(tmp_path: Path, provider: str) -> None:
    def harness() -> Any:
        return _processor_harness(tmp_path, provider, PickledTracker(PICKLED, PICKLED, PICKLED))

    with harness() as h:
        h.run([{"k": "a", "v": 1}, {"k": "a", "v": 2}])
    with harness() as h:
        h.run([{"k": "a", "v": 3}])
        assert h.value_state("total", "a") == {"sum": 6}
        assert h.list_state("seen", "a") == [{"v": 1}, {"v": 2}, {"v": 3}]
        assert h.map_state("by_v", "a") == {(1,): ["a", 1], (2,): ["a", 2], (3,): ["a", 3]}
    with pytest.raises(SchemaMismatchError, match="'total'.*from pickled Python objects"):
        _processor_harness(tmp_path, provider, Tracker("total long", PICKLED, PICKLED))


def test_pickled_processor_values_are_objects(tmp_path: Path) -> None:
    class Reader(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.value = handle.getValueState("value", PICKLED)
            self.items = handle.getListState("items", PICKLED)
            self.map = handle.getMapState("map", "k string", PICKLED)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
            n = len(list(rows))
            before = self.value.get()
            self.value.update((n, "a tuple is one object"))
            self.items.put([{"n": n}])
            if before is not None:
                self.items.appendValue(None)  # refused: None is no element
            self.map.updateValue("x", {1, 2})
            assert self.value.get() == (n, "a tuple is one object")
            assert list(self.items.get())[0] == {"n": n}
            assert self.map.getValue("x") == {1, 2}
            assert list(self.map.iterator()) == [(("x",), {1, 2})]
            yield (key[0], n)

    with _processor_harness(tmp_path, "memory", Reader()) as h:
        h.run([{"k": "a", "v": 1}])
        assert h.value_state("value", "a") == (1, "a tuple is one object")
        with pytest.raises(InvalidStateValueError, match="None"):
            h.run([{"k": "a", "v": 1}])  # a list element may not be None either


def test_init_declaring_different_variables_is_still_caught(tmp_path: Path) -> None:
    class Fickle(StatefulProcessor):
        calls = 0

        def init(self, handle: Any) -> None:
            Fickle.calls += 1
            self.v = handle.getValueState("v", "n long" if Fickle.calls == 1 else "n long, m long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
            yield (key[0], 1)

    with (
        _processor_harness(tmp_path, "memory", Fickle()) as h,
        pytest.raises(UnsupportedStateOperationError, match="'v' differs from the one init"),
    ):
        h.run([{"k": "a", "v": 1}])
