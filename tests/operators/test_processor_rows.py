"""transformWithState's ``numRowsTotal`` as Spark counts it: a value state's keys, a list
state's keys, a map state's entries, and no timer or TTL index entry, kept in ``$rows_count``
without a scan (against Spark's own operator: tests/engine/test_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.operators.arbitrary.timers import TimerValues
from sparkstate.operators.arbitrary.transform_with_state import TransformWithState
from sparkstate.testing.harness import OperatorHarness, processor_harness

from .conftest import PROVIDERS

VARIABLES = ("total", "seen", "by_v")


def rows(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"k": k, "v": v} for k, v in pairs]


class Ledger(StatefulProcessor):
    """A value, a list and a map per key, and a timer per row; the row's value says what to
    do: a positive one is added everywhere, 0 clears the list and the map, a negative one
    removes its map entry."""

    def __init__(self, ttl_ms: int | None = None, delete: bool = False) -> None:
        self.ttl_ms = ttl_ms
        self.delete = delete

    def init(self, handle: Any) -> None:
        self.handle = handle
        if self.delete:
            handle.deleteIfExists("by_v")
        self.total = handle.getValueState("total", "n long", self.ttl_ms)
        self.seen = handle.getListState("seen", "v long", self.ttl_ms)
        self.by_v = handle.getMapState("by_v", "v long", "n long", self.ttl_ms)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        for row in rows:
            if row.v > 0:
                self.total.update(((self.total.get() or (0,))[0] + row.v,))
                self.seen.appendValue((row.v,))
                self.by_v.updateValue((row.v,), (1,))
                self.handle.registerTimer(now + 10_000 + row.v)
            elif row.v == 0:
                self.seen.clear()
                self.by_v.clear()
            else:
                self.by_v.removeKey((-row.v,))
        yield (key[0],)


def ledger(provider: str, **kwargs: Any) -> OperatorHarness:
    return processor_harness(
        Ledger(**kwargs),
        key_columns=["k"],
        output_schema="k string",
        time_mode="ProcessingTime",
        provider=provider,
    )


def counts(h: OperatorHarness) -> dict[str, int]:
    return {name: n for (name,), (n,) in h.state_rows("$rows_count").items()}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rows_are_the_variables_rows_as_spark_counts_them(provider: str) -> None:
    with ledger(provider) as h:
        out = h.run(rows(("a", 1), ("a", 2), ("a", 2), ("b", 3)), processing_time_ms=0)
        # total: a, b; seen: a, b; by_v: a's 1 and 2, b's 3 (a's timer at 10_002 is one)
        assert out.metrics.num_rows_total == 7
        assert counts(h) == {"total": 2, "seen": 2, "by_v": 3}
        assert len(h.state_rows("$timer_index")) == 3  # no rows of Spark's
        out = h.run(rows(("a", -1), ("b", 0), ("c", 5)), processing_time_ms=100)
        assert out.metrics.num_rows_total == 3 + 2 + 2
        assert counts(h) == {"total": 3, "seen": 2, "by_v": 2}
        h.restart()
        out = h.run(processing_time_ms=10_002)  # a's timers fire: no state changes
        assert out.metrics.num_rows_total == 7 and len(h.state_rows("$timer_index")) == 2
        out = h.run(rows(("c", 0), ("d", 4)), processing_time_ms=10_100)
        assert out.metrics.num_rows_total == 4 + 2 + 2
        assert counts(h) == {"total": 4, "seen": 2, "by_v": 2}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_version_without_the_count_is_counted_once(provider: str) -> None:
    """A checkpoint written before the rows were kept (or rescaled: they are not moved) is
    counted by a scan at its next batch, which keeps the count from then on."""
    with ledger(provider) as h:
        h.run(rows(("a", 1), ("a", 2), ("b", 3)), processing_time_ms=0)
        store = h.provider.get_store(h.batch_id)  # as written before the count was kept
        for name in VARIABLES:
            store.remove((name,), "$rows_count")
        store.commit()
        h.batch_id += 1
        assert counts(h) == {}
        store = h.provider.get_read_store(h.batch_id)
        try:
            assert TransformWithState.rows_in_state(store) == 7
        finally:
            store.abort()
        out = h.run(rows(("a", 4)), processing_time_ms=100)
        assert out.metrics.num_rows_total == 2 + 2 + 4
        assert counts(h) == {"total": 2, "seen": 2, "by_v": 4}
        h.restart()
        assert h.run(rows(("b", -3)), processing_time_ms=200).metrics.num_rows_total == 7


@pytest.mark.parametrize("provider", PROVIDERS)
def test_expired_and_deleted_state_leaves_the_count(provider: str) -> None:
    """What the TTL cleanup evicts is no row any more, nor is a deleted variable's."""
    with ledger(provider, ttl_ms=1_000) as h:
        h.run(rows(("a", 1), ("a", 2), ("b", 3)), processing_time_ms=0)
        out = h.run(rows(("c", 5)), processing_time_ms=500)
        assert out.metrics.num_rows_total == 7 + 3
        out = h.run(processing_time_ms=1_000)  # a's and b's expire: c's are left
        assert out.metrics.num_rows_total == 3 and out.metrics.num_rows_removed > 0
        assert counts(h) == {"total": 1, "seen": 1, "by_v": 1}
        h.operator.processor.delete = True  # type: ignore[union-attr]
        out = h.run(rows(("c", 6)), processing_time_ms=1_200)
        assert out.metrics.num_rows_total == 2 + 1  # c's map is new: its entry of 6
        assert counts(h) == {"total": 1, "seen": 1, "by_v": 1}
