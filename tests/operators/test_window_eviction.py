"""Eviction by the watermark reads what it evicts, not the state: time windows and sessions.

A state of many open windows (or sessions) and a batch whose watermark closes a handful: the rows
the operators' range scans return are counted, and must be the closed ones alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.operators.aggregation.aggregate import (
    EVENT_TIME_COLUMN,
    EVENT_TIME_COUNT_COLUMN,
    EVENT_TIME_MIN_COLUMN,
    EVENT_TIME_SUM_COLUMN,
    ROWS_COLUMN,
    AggregateFunction,
    StreamingAggregate,
    WindowKey,
    buffer_column,
)
from sparkstate.operators.aggregation.session_window import ENDS_CF, SessionWindowAggregate
from sparkstate.store.base import DEFAULT_CF, StateStore
from sparkstate.store.families import cf_prefix
from sparkstate.store.versions.versioned import VersionedProvider

from .conftest import OperatorRunner, at, ms

Runner = Callable[[Any], OperatorRunner]
TS = pa.timestamp("us", tz="UTC")
OPEN = 20_000  # windows the watermark leaves open: a full scan would read all of them
CLOSED = 7


def window_rows(ends: list[float], keys: range) -> list[dict[str, Any]]:
    """One partial row per (10 s window ending at ``end``, key)."""
    return [
        {
            "__ss_window_end": at(end),
            "__ss_window_start": at(end - 10),
            "k": k,
            buffer_column(0, "count", 0): 1,
            ROWS_COLUMN: 1,
            EVENT_TIME_COLUMN: at(end - 1),
            EVENT_TIME_MIN_COLUMN: at(end - 1),
            EVENT_TIME_SUM_COLUMN: (at(end - 1)).timestamp() * 1000,
            EVENT_TIME_COUNT_COLUMN: 1,
        }
        for end in ends
        for k in keys
    ]


def test_window_eviction_scans_only_the_closed_windows(
    make_runner: Runner, scanned: list[int]
) -> None:
    window = WindowKey.of("window")
    op = StreamingAggregate(
        pa.schema([(window.end, TS), (window.start, TS), ("k", pa.int64())]),
        [AggregateFunction("count", "n", pa.int64())],
        output_keys=[window, "k"],
        watermark_key=window.end,
        has_event_time=True,
    )
    runner = make_runner(op)
    runner.run(window_rows([100], range(OPEN)) + window_rows([20], range(CLOSED)), "append")
    scanned[0] = 0
    out, metrics = runner.run(window_rows([110], range(3)), "append", watermark_ms=ms(50))
    assert out.num_rows == CLOSED  # the windows ending at 20 s, emitted once
    assert {r["window"]["end"] for r in out.to_pylist()} == {at(20)}
    assert metrics.num_rows_removed == CLOSED
    assert scanned[0] == CLOSED


def session_rows(starts: list[float], keys: range, gap: float = 10) -> list[dict[str, Any]]:
    return [
        {
            "k": k,
            "__ss_session_start": at(s),
            "__ss_session_end": at(s + gap),
            buffer_column(0, "count", 0): 1,
            ROWS_COLUMN: 1,
            EVENT_TIME_COLUMN: at(s),
            EVENT_TIME_MIN_COLUMN: at(s),
            EVENT_TIME_SUM_COLUMN: (at(s)).timestamp() * 1000,
            EVENT_TIME_COUNT_COLUMN: 1,
        }
        for s in starts
        for k in keys
    ]


def session_op() -> SessionWindowAggregate:
    session = WindowKey.of("session")
    return SessionWindowAggregate(
        pa.schema([("k", pa.int64())]),
        session,
        [AggregateFunction("count", "n", pa.int64())],
        output_schema=pa.schema(
            [
                ("session", pa.struct([("start", TS), ("end", TS)])),
                ("k", pa.int64()),
                ("n", pa.int64()),
            ]
        ),
        output_keys=[session, "k"],
        watermarked=True,
        has_event_time=True,
    )


def test_session_eviction_scans_only_the_closed_sessions(
    make_runner: Runner, scanned: list[int]
) -> None:
    runner = make_runner(session_op())
    runner.run(
        session_rows([100], range(OPEN)) + session_rows([5], range(OPEN, OPEN + CLOSED)), "append"
    )
    scanned[0] = 0
    out, metrics = runner.run(session_rows([104], range(3)), "append", watermark_ms=ms(50))
    assert sorted(r["k"] for r in out.to_pylist()) == list(range(OPEN, OPEN + CLOSED))
    assert metrics.num_rows_removed == CLOSED + 3  # and the 3 sessions the batch extended
    assert scanned[0] == CLOSED


def test_sessions_merge_with_state_and_close_once(make_runner: Runner) -> None:
    """Two sessions of a key in state, bridged by a later row; a separate one stays apart."""
    runner = make_runner(session_op())
    out, m = runner.run(session_rows([0], range(1)) + session_rows([14], range(1)), "append")
    assert out.num_rows == 0 and m.num_rows_total == 2  # sessions: the index is no row
    # [9, 19) touches [0, 10) (9 <= 10) and [14, 24): one session [0, 24) of three rows
    out, m = runner.run(session_rows([9], range(1)) + session_rows([60], range(1)), "append")
    assert out.num_rows == 0 and m.num_rows_removed == 2 and m.num_rows_updated == 2
    assert m.num_rows_total == 2
    out, m = runner.run([], "append", watermark_ms=ms(30))
    assert m.num_rows_total == 1
    assert [(r["session"]["start"], r["session"]["end"], r["n"]) for r in out.to_pylist()] == [
        (at(0), at(24), 3)
    ]
    out, _ = runner.run([], "append", watermark_ms=ms(30))
    assert out.num_rows == 0  # emitted once
    out, _ = runner.run([], "complete")
    assert [(r["session"]["start"], r["n"]) for r in out.to_pylist()] == [(at(60), 1)]


def test_a_batch_reads_only_the_stored_sessions_it_may_merge_with(
    make_runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's stored sessions that end before the batch's begin or start after they end are
    not read, and stay: in the key's start list, so later rows still merge with them."""
    read: list[int] = []
    get = StateStore.get_encoded_many

    def counting(self: StateStore, keys: Any, cf: str = DEFAULT_CF) -> list[bytes | None]:
        if cf == DEFAULT_CF:
            read.append(len(keys))
        return get(self, keys, cf)

    monkeypatch.setattr(StateStore, "get_encoded_many", counting)
    runner = make_runner(session_op())
    runner.run(session_rows([0, 20, 40], range(1)), "append")  # [0, 10) [20, 30) [40, 50)
    for start in (22, 45, 5):  # each merges with one: [20, 32) [40, 55) [0, 15)
        read.clear()
        _, m = runner.run(session_rows([start], range(1)), "append")
        assert sum(read) == 1  # the one session it merges with
        assert m.num_rows_removed == 1 and m.num_rows_updated == 1 and m.num_rows_total == 3
    out, _ = runner.run([], "complete")
    sessions = [(r["session"]["start"], r["session"]["end"], r["n"]) for r in out.to_pylist()]
    assert sorted(sessions) == [(at(0), at(15), 2), (at(20), at(32), 2), (at(40), at(55), 2)]
    # A row bridging two of them reads both and merges the three.
    read.clear()
    out, m = runner.run(session_rows([14], range(1)), "append")
    assert sum(read) == 2 and m.num_rows_removed == 2 and m.num_rows_total == 2


def test_session_eviction_removes_the_index_entries_as_one_range(make_runner: Runner) -> None:
    """The index of ends loses the evicted sessions' entries in one range deletion: the
    version's changelog has no row for them, and the sessions left are counted right."""
    runner = make_runner(session_op())
    runner.run(session_rows([100], range(50)) + session_rows([5], range(50, 80)), "append")
    out, m = runner.run([], "append", watermark_ms=ms(50))
    assert out.num_rows == 30 and m.num_rows_removed == 30 and m.num_rows_total == 50
    provider = runner.provider
    assert isinstance(provider, VersionedProvider)
    log = provider.read_changelog(provider.index().resolve(2, None, provider.delta_ext, "test"))
    ends = cf_prefix(ENDS_CF)
    assert [lo for lo, _ in log.delete_ranges] == [ends]
    keys = [k for chunk, _ in log.chunks() for k in chunk]
    assert not [k for k in keys if k.startswith(ends)]
    out, m = runner.run(session_rows([104], range(2)), "append", watermark_ms=ms(50))
    assert out.num_rows == 0 and m.num_rows_total == 50
