"""GroupState semantics (PySpark's applyInPandasWithState, Scala's flatMapGroupsWithState).

Each timeout mode, removal, the write rule, late rows and restarts, through the Spark-free harness
on the memory and rocksdb providers.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.flat_map_groups import FlatMapGroupsWithState
from sparkstate.operators.arbitrary.group_state import (
    GroupState,
    GroupStateClock,
    GroupStateTimeout,
    parse_duration_ms,
)
from sparkstate.operators.arbitrary.state_errors import (
    InvalidOutputError,
    InvalidStateValueError,
    StateNotExistsError,
    UnsupportedStateOperationError,
)
from sparkstate.testing.harness import OperatorHarness, group_state_harness

from .conftest import PROVIDERS

PT = GroupStateTimeout.ProcessingTimeTimeout
ET = GroupStateTimeout.EventTimeTimeout
INPUT = pa.schema([("k", pa.string()), ("v", pa.int64())])
EVENTS = pa.schema([("k", pa.string()), ("t", pa.timestamp("ms"))])


def _state(timeout: str = GroupStateTimeout.NoTimeout, **kw: Any) -> GroupState:
    clock = GroupStateClock(
        timeout=timeout,
        processing_time_ms=kw.pop("now", 1000),
        watermark_ms=kw.pop("watermark", -1),
        watermark_present=kw.pop("present", False),
    )
    return GroupState(clock, kw.pop("value", None), 1, **kw)


# --- GroupState on its own ---------------------------------------------------------------------


def test_value_access_and_errors() -> None:
    state = _state()
    assert not state.exists and state.getOption is None and str(state) == "GroupState(<undefined>)"
    with pytest.raises(StateNotExistsError) as info:
        _ = state.get
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidStateValueError, match="None"):
        state.update(None)
    with pytest.raises(InvalidStateValueError, match="1 fields|2 fields"):
        state.update((1, 2))
    state.update([5])
    assert state.exists and state.get == (5,) and state.decision(-1) == ("put", (5,), -1)
    state.remove()
    assert not state.exists and state.decision(-1) == ("remove", None, -1)


def test_timeout_calls_follow_the_timeout_mode() -> None:
    none = _state()
    with pytest.raises(UnsupportedStateOperationError, match="processing time timeout"):
        none.setTimeoutDuration(1000)
    with pytest.raises(UnsupportedStateOperationError, match="event time timeout"):
        none.setTimeoutTimestamp(1000)
    with pytest.raises(UnsupportedStateOperationError, match="watermark"):
        none.getCurrentWatermarkMs()
    assert none.getCurrentProcessingTimeMs() == 1000

    pt = _state(PT, now=5000)
    with pytest.raises(InvalidStateValueError, match="positive"):
        pt.setTimeoutDuration(0)
    pt.setTimeoutDuration("1 minute 2 seconds")
    assert pt.timeout_timestamp_ms == 5000 + 62_000
    pt.setTimeoutDuration(datetime.timedelta(seconds=1))
    assert pt.timeout_timestamp_ms == 6000
    with pytest.raises(UnsupportedStateOperationError):
        pt.setTimeoutTimestamp(10_000)

    et = _state(ET, watermark=2000, present=True)
    assert et.getCurrentWatermarkMs() == 2000
    with pytest.raises(InvalidStateValueError, match="earlier than the current watermark"):
        et.setTimeoutTimestamp(1999)
    with pytest.raises(InvalidStateValueError, match="positive"):
        et.setTimeoutTimestamp(0)
    et.setTimeoutTimestamp(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))
    assert et.timeout_timestamp_ms == 1_704_067_200_000
    with pytest.raises(UnsupportedStateOperationError):
        et.setTimeoutDuration(10)


def test_duration_strings() -> None:
    assert parse_duration_ms("interval 1 hour 30 minutes") == 5_400_000
    assert parse_duration_ms("250 ms") == 250
    with pytest.raises(InvalidStateValueError, match="cannot parse"):
        parse_duration_ms("soon")


def test_bad_configuration_is_refused() -> None:
    def f(key: Any, rows: Any, state: GroupState) -> list[Any]:
        return []

    with pytest.raises(ConfigurationError, match="watermark"):
        FlatMapGroupsWithState(f, INPUT, ["k"], "k string", "n long", "update", ET)
    with pytest.raises(ConfigurationError, match="no grouping column"):
        FlatMapGroupsWithState(f, INPUT, ["nope"], "k string", "n long")
    with pytest.raises(ConfigurationError, match="unknown timeout"):
        FlatMapGroupsWithState(f, INPUT, ["k"], "k string", "n long", "update", "Sometimes")
    with pytest.raises(ConfigurationError, match="complete"):
        FlatMapGroupsWithState(f, INPUT, ["k"], "k string", "n long", "complete")
    with pytest.raises(ConfigurationError, match="reserved"):
        FlatMapGroupsWithState(f, INPUT, ["k"], "k string", "__timeout_ms long")


# --- functions used below ------------------------------------------------------------------------


def count_rows(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
    """Running count per key; a timed-out key reports -1 and drops its state."""
    if state.hasTimedOut:
        assert rows == [] and state.exists
        state.remove()
        return [(key[0], -1)]
    count = (state.getOption or (0,))[0] + len(rows)
    state.update((count,))
    if state._clock.timeout == PT:
        state.setTimeoutDuration(1000)
    return [(key[0], count)]


def count_frames(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[Any]:
    """The same function for applyInPandasWithState."""
    frames = list(frames)
    for f in frames:
        f["seen"] = True  # the frame is the function's own: no SettingWithCopyWarning
        assert list(f.index) == list(range(len(f)))
    if state.hasTimedOut:
        assert len(frames) == 1 and frames[0].empty and list(frames[0].columns)[:2] == ["k", "v"]
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "n": [-1]})
        return
    count = (state.getOption or (0,))[0] + sum(len(f) for f in frames)
    state.update((count,))
    if state._clock.timeout == PT:
        state.setTimeoutDuration(1000)
    yield pd.DataFrame({"k": [key[0]], "n": [count]})


def make(pandas: bool, provider: str, timeout: str = PT) -> OperatorHarness:
    return group_state_harness(
        count_frames if pandas else count_rows,
        key_columns=["k"],
        output_schema="k string, n long",
        state_schema="n long",
        timeout=timeout,
        pandas=pandas,
        input_schema=INPUT,
        provider=provider,
    )


def rows(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"k": k, "v": v} for k, v in pairs]


# --- through the operator ----------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("pandas", [False, True], ids=["rows", "pandas"])
def test_processing_time_timeout_and_restart(pandas: bool, provider: str) -> None:
    with make(pandas, provider) as h:
        assert h.operator.time_trigger() == "processing"  # type: ignore[union-attr]
        out = h.run(rows(("b", 1), ("a", 1), ("a", 2)), processing_time_ms=100)
        assert out.rows == [{"k": "a", "n": 2}, {"k": "b", "n": 1}]  # key order
        assert out.metrics.num_rows_updated == 2 and out.metrics.num_input_rows == 3
        assert out.metrics.num_rows_total == 2  # the keys' states; index entries are not rows
        assert h.group_state("a") == (2,) and h.group_state_timeout("a") == 1100
        assert h.run(rows(("a", 3)), processing_time_ms=600).rows == [{"k": "a", "n": 3}]
        assert h.group_state_timeout("a") == 1600
        h.restart()
        # b's timeout (1100) is not before 1100: nothing fires yet (Spark: timeout < now)
        assert h.run(processing_time_ms=1100).rows == []
        out = h.run(processing_time_ms=1101)
        assert out.rows == [{"k": "b", "n": -1}] and out.metrics.num_rows_removed == 1
        assert out.metrics.num_rows_total == 1
        assert h.group_state("b") is None and h.state_rows("$timeout_index") == {
            (1600, "a"): (True,)
        }
        assert h.state_rows("$timeout_count") == {("$timeout_index",): (1,)}
        assert h.run(processing_time_ms=5000).rows == [{"k": "a", "n": -1}]
        assert h.state_rows() == {} and h.state_rows("$timeout_index") == {}
        assert h.state_rows("$timeout_count") == {("$timeout_index",): (0,)}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_timeout_index_keeps_its_count(provider: str) -> None:
    """numRowsTotal subtracts the index's entries as counted at each write, not by a scan; a
    version without the count (an older checkpoint's) is counted once, then keeps it."""
    with make(False, provider) as h:
        h.run(rows(("a", 1), ("b", 1), ("c", 1)), processing_time_ms=0)
        h.run(rows(("a", 2), ("d", 1)), processing_time_ms=500)  # a moves, d comes
        assert h.state_rows("$timeout_count") == {("$timeout_index",): (4,)}
        store = h.provider.get_store(h.batch_id)  # as written before the count was kept
        store.remove(("$timeout_index",), "$timeout_count")
        store.commit()
        h.batch_id += 1
        out = h.run(processing_time_ms=1001)  # b and c time out
        assert out.metrics.num_rows_total == 2 and out.metrics.num_rows_removed == 2
        assert h.state_rows("$timeout_count") == {("$timeout_index",): (2,)}
        h.restart()
        out = h.run(rows(("e", 1)), processing_time_ms=1200)
        assert out.metrics.num_rows_total == 3
        assert h.state_rows("$timeout_count") == {("$timeout_index",): (3,)}
        assert len(h.state_rows("$timeout_index")) == 3


@pytest.mark.parametrize("pandas", [False, True], ids=["rows", "pandas"])
def test_no_timeout_keeps_state_forever(pandas: bool) -> None:
    with make(pandas, "memory", GroupStateTimeout.NoTimeout) as h:
        assert h.operator.time_trigger() is None  # type: ignore[union-attr]
        h.run(rows(("a", 1)), processing_time_ms=1)
        assert h.run(processing_time_ms=10**9).rows == []
        assert h.run(rows(("a", 1))).rows == [{"k": "a", "n": 2}]
        assert h.state_rows("$timeout_index") == {}


def test_data_in_the_batch_a_key_would_time_out_resets_its_timeout() -> None:
    with make(False, "memory") as h:
        h.run(rows(("a", 1)), processing_time_ms=0)
        out = h.run(rows(("a", 1)), processing_time_ms=5000)
        assert out.rows == [{"k": "a", "n": 2}]  # input first, and the new timeout is 6000
        assert h.group_state_timeout("a") == 6000


def _session(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
    """Event-time sessions: close a key 10 s after its latest event."""
    if state.hasTimedOut:
        (count,) = state.get
        state.remove()
        return [(key[0], count, True)]
    latest = max(r[1] for r in rows)
    millis = int(latest.replace(tzinfo=datetime.UTC).timestamp() * 1000)
    count = (state.getOption or (0,))[0] + len(rows)
    state.update((count,))
    state.setTimeoutTimestamp(millis + 10_000)
    return [(key[0], count, False)]


def _events(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    epoch = datetime.datetime(1970, 1, 1)
    return [{"k": k, "t": epoch + datetime.timedelta(seconds=s)} for k, s in pairs]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_event_time_timeout_follows_the_watermark(provider: str) -> None:
    h = group_state_harness(
        _session,
        key_columns=["k"],
        output_schema="k string, n long, closed boolean",
        state_schema="n long",
        timeout=ET,
        input_schema=EVENTS,
        event_time_column="t",
        watermark_delay_ms=5000,
        provider=provider,
    )
    with h:
        assert h.run(_events(("a", 1), ("b", 20))).rows == [
            {"k": "a", "n": 1, "closed": False},
            {"k": "b", "n": 1, "closed": False},
        ]
        assert h.watermark_ms == 15_000  # max event time 20 s minus the 5 s delay
        out = h.run(_events(("a", 3), ("b", 21)))  # a's row at 3 s is late: dropped
        assert out.metrics.num_rows_dropped_by_watermark == 1
        # a's timeout (11 s) is before the watermark (15 s): a closes after b's input
        assert out.rows == [
            {"k": "b", "n": 2, "closed": False},
            {"k": "a", "n": 1, "closed": True},
        ]
        assert h.watermark_ms == 16_000
        assert h.run(watermark_ms=31_000).rows == []  # b's timeout is 31 s: not before 31 s
        assert h.run(watermark_ms=31_001).rows == [{"k": "b", "n": 2, "closed": True}]
        assert h.state_rows() == {}


def _remove_but_wait(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
    if state.hasTimedOut:
        return [(key[0], "timed out", state.exists)]
    state.remove()
    state.setTimeoutDuration(100)
    return [(key[0], "removed", state.exists)]


def test_removed_state_can_keep_a_timeout() -> None:
    h = group_state_harness(
        _remove_but_wait,
        key_columns=["k"],
        output_schema="k string, what string, present boolean",
        state_schema="n long",
        timeout=PT,
        input_schema=INPUT,
    )
    with h:
        out = h.run(rows(("a", 1)), processing_time_ms=0)
        assert h.group_state("a") is None and h.group_state_timeout("a") == 100
        assert out.metrics.num_rows_total == 1  # Spark keeps the row of a timeout too
        out = h.run(processing_time_ms=200)
        assert out.rows == [{"k": "a", "what": "timed out", "present": False}]
        # the timed-out call set no timeout and did not touch the state: Scala's rule (the old
        # timeout is the stored one) clears the row
        assert h.state_rows() == {} and h.state_rows("$timeout_index") == {}
        assert h.run(processing_time_ms=400).rows == []


def _touch_only(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[Any]:
    n = sum(len(f) for f in frames)
    if state.hasTimedOut:
        yield pd.DataFrame({"k": [key[0]], "n": [-1]})
        return
    if not state.exists:
        state.update((n,))
        state.setTimeoutDuration(1000)
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def test_pandas_write_rule_compares_with_no_timestamp() -> None:
    """PySpark sends oldTimeoutTimestamp = -1: a call that neither updates the state nor sets a
    timeout writes nothing, so the stored timeout stays and fires again (unlike Scala)."""
    h = group_state_harness(
        _touch_only,
        key_columns=["k"],
        output_schema="k string, n long",
        state_schema="n long",
        timeout=PT,
        pandas=True,
        input_schema=INPUT,
    )
    with h:
        h.run(rows(("a", 1)), processing_time_ms=0)
        h.run(rows(("a", 1)), processing_time_ms=500)
        assert h.group_state_timeout("a") == 1000
        assert h.run(processing_time_ms=2000).rows == [{"k": "a", "n": -1}]
        assert h.run(processing_time_ms=3000).rows == [{"k": "a", "n": -1}]
        assert h.group_state("a") == (1,)


def test_pandas_function_must_return_an_iterator_of_dataframes() -> None:
    def f(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Any:
        return pd.DataFrame({"k": [key[0]], "n": [1]})

    h = group_state_harness(
        f, key_columns=["k"], output_schema="k string, n long", state_schema="n long", pandas=True
    )
    with h, pytest.raises(InvalidOutputError, match="function must return an iterator of Data"):
        h.run(rows(("a", 1)))


def test_row_formats_and_output_forms() -> None:
    def f(key: Any, rows: list[Any], state: GroupState) -> Iterator[Any]:
        yield {"k": key[0], "n": len(rows)}
        yield (key[0], rows[0]["v"] if isinstance(rows[0], dict) else rows[0].v)

    for fmt in ("dict", "row"):
        h = group_state_harness(
            f,
            key_columns=["k"],
            output_schema="k string, n long",
            state_schema="n long",
            row_format=fmt,
        )
        with h:
            assert h.run(rows(("a", 7), ("a", 8))).rows == [
                {"k": "a", "n": 2},
                {"k": "a", "n": 7},
            ]


def test_wrong_output_is_reported_with_the_key() -> None:
    def f(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
        return [(key[0],)]

    h = group_state_harness(
        f, key_columns=["k"], output_schema="k string, n long", state_schema="n long"
    )
    with h, pytest.raises(InvalidOutputError, match="1 values for the 2 output fields"):
        h.run(rows(("a", 1)))

    def g(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
        state.update(("not a number",))
        return []

    h = group_state_harness(
        g, key_columns=["k"], output_schema="k string, n long", state_schema="n long"
    )
    with h, pytest.raises(ValueError, match="expects an int"):
        h.run(rows(("a", 1)))


def test_user_errors_name_the_key() -> None:
    def f(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
        msg = "boom"
        raise KeyError(msg)

    h = group_state_harness(
        f, key_columns=["k"], output_schema="k string, n long", state_schema="n long"
    )
    with h, pytest.raises(KeyError) as info:
        h.run(rows(("zz", 1)))
    assert "('zz',)" in "".join(getattr(info.value, "__notes__", []))


def test_null_and_composite_keys() -> None:
    schema = pa.schema([("a", pa.string()), ("b", pa.int32()), ("v", pa.int64())])

    def f(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
        state.update(((state.getOption or (0,))[0] + len(rows),))
        return [(*key, state.get[0])]

    h = group_state_harness(
        f,
        key_columns=["a", "b"],
        output_schema="a string, b int, n long",
        state_schema="n long",
        input_schema=schema,
    )
    data = [{"a": None, "b": 1, "v": 0}, {"a": "x", "b": None, "v": 0}, {"a": None, "b": 1, "v": 0}]
    with h:
        assert h.run(data).rows == [
            {"a": None, "b": 1, "n": 2},  # nulls first, as Spark sorts
            {"a": "x", "b": None, "n": 1},
        ]
        assert h.run(data[:1]).rows == [{"a": None, "b": 1, "n": 3}]


def test_pandas_output_types_nan_and_column_order() -> None:
    def f(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[Any]:
        for _frame in frames:
            yield pd.DataFrame(
                {
                    "x": [float("nan"), 1.5],
                    "at": pd.to_datetime(["2024-01-01 00:00:01", None]),
                    "k": [key[0], key[0]],
                }
            )
        yield pd.DataFrame([[key[0], 2.0, pd.Timestamp("2024-01-02")]])  # labels 0, 1, 2

    h = group_state_harness(
        f,
        key_columns=["k"],
        output_schema="k string, x double, at timestamp_ntz",
        state_schema="n long",
        pandas=True,
    )
    with h:
        assert h.run(rows(("a", 1))).rows == [
            {"k": "a", "x": None, "at": datetime.datetime(2024, 1, 1, 0, 0, 1)},
            {"k": "a", "x": 1.5, "at": None},
            {"k": "a", "x": 2.0, "at": datetime.datetime(2024, 1, 2)},  # by position
        ]


def test_each_key_frame_is_typed_as_pyspark_types_it_in_the_session_time_zone() -> None:
    def f(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[Any]:
        for frame in frames:
            kinds = ",".join(f"{c}:{t}" for c, t in frame.dtypes.items())
            yield pd.DataFrame(
                {
                    "k": [key[0]],
                    "kinds": [kinds],
                    "secs": [int(frame["ts"].astype("int64").iloc[0] // 10**9)],
                    "later": [frame["ts"].iloc[0] + pd.Timedelta(hours=1)],
                }
            )

    h = group_state_harness(
        f,
        key_columns=["k"],
        output_schema="k string, kinds string, secs long, later timestamp",
        state_schema="n long",
        pandas=True,
        input_schema="k string, ts timestamp, n int, flag boolean",
        time_zone="America/Los_Angeles",
    )
    utc = datetime.UTC
    noon = datetime.datetime(2024, 7, 1, 19, 0, tzinfo=utc)  # 12:00 in Los Angeles
    data = pa.table(
        {
            "k": ["a", "b", "b"],
            "ts": pa.array([noon, noon, noon], pa.timestamp("us", tz="UTC")),
            "n": pa.array([1, None, 2], pa.int32()),
            "flag": [True, None, False],
        }
    )
    with h:
        out = {r["k"]: r for r in h.run(data).rows}
    assert out["a"]["kinds"] == "k:object,ts:datetime64[ns],n:int32,flag:bool"
    assert out["b"]["kinds"] == "k:object,ts:datetime64[ns],n:float64,flag:object"
    wall_clock = datetime.datetime(2024, 7, 1, 12, 0, tzinfo=utc)
    assert out["a"]["secs"] == int(wall_clock.timestamp())
    # a naive timestamp returned is wall clock in the session zone: 13:00 there, 20:00 UTC
    assert out["a"]["later"].astimezone(utc) == datetime.datetime(2024, 7, 1, 20, 0, tzinfo=utc)
