"""The streaming aggregation operator against a plain-Python model of Spark's semantics."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import random
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.aggregation.aggregate import (
    EVENT_TIME_COLUMN,
    EVENT_TIME_COUNT_COLUMN,
    EVENT_TIME_MIN_COLUMN,
    EVENT_TIME_SUM_COLUMN,
    GLOBAL_KEY,
    ROWS_COLUMN,
    AggregateFunction,
    AggregateOverflowError,
    StreamingAggregate,
    buffer_column,
)

from .conftest import OperatorRunner

Runner = Callable[[StreamingAggregate], OperatorRunner]
UTC = dt.UTC


def agg_op(**kwargs: Any) -> StreamingAggregate:
    return StreamingAggregate(
        pa.schema([("k", pa.string())]),
        [
            AggregateFunction("count", "n", pa.int64()),
            AggregateFunction("sum", "total", pa.int64(), pa.int32()),
            AggregateFunction("min", "lo", pa.int32(), pa.int32()),
            AggregateFunction("max", "hi", pa.int32(), pa.int32()),
            AggregateFunction("avg", "mean", pa.float64(), pa.int32()),
            AggregateFunction("count", "nv", pa.int64(), pa.int32()),
        ],
        **kwargs,
    )


def partial(rows: list[tuple[str | None, int | None]]) -> list[dict[str, Any]]:
    """What Spark's per-batch partial aggregation would hand the operator for (key, v) rows."""
    groups: dict[str | None, list[int | None]] = {}
    for k, v in rows:
        groups.setdefault(k, []).append(v)
    out = []
    for k, vs in groups.items():
        nn = [v for v in vs if v is not None]
        out.append(
            {
                "k": k,
                buffer_column(0, "count", 0): len(vs),
                buffer_column(1, "sum", 0): sum(nn) if nn else None,
                buffer_column(2, "min", 0): min(nn) if nn else None,
                buffer_column(3, "max", 0): max(nn) if nn else None,
                buffer_column(4, "avg", 0): float(sum(nn)) if nn else None,
                buffer_column(4, "avg", 1): len(nn),
                buffer_column(5, "count", 0): len(nn),
                ROWS_COLUMN: len(vs),
            }
        )
    return out


def model(
    all_rows: list[tuple[str | None, int | None]], keys: set[str | None]
) -> set[tuple[Any, ...]]:
    groups: dict[str | None, list[int | None]] = {}
    for k, v in all_rows:
        if k in keys:
            groups.setdefault(k, []).append(v)
    out = set()
    for k, vs in groups.items():
        nn = [v for v in vs if v is not None]
        out.add(
            (
                k,
                len(vs),
                sum(nn) if nn else None,
                min(nn) if nn else None,
                max(nn) if nn else None,
                sum(nn) / len(nn) if nn else None,
                len(nn),
            )
        )
    return out


def as_set(table: pa.Table) -> set[tuple[Any, ...]]:
    return {tuple(r.values()) for r in table.to_pylist()}


def test_update_and_complete_match_the_model(make_runner: Runner) -> None:
    rnd = random.Random(7)
    upd, comp = make_runner(agg_op()), make_runner(agg_op())
    seen: list[tuple[str | None, int | None]] = []
    for batch in range(6):
        rows: list[tuple[str | None, int | None]] = [
            (rnd.choice(["a", "b", "c", "d", None]), rnd.choice([None, -3, 0, 5, 2**31 - 1]))
            for _ in range(rnd.randint(0, 12))
        ]
        seen += rows
        out_u, m_u = upd.run(partial(rows), "update")
        out_c, m_c = comp.run(partial(rows), "complete")
        batch_keys = {k for k, _ in rows}
        assert as_set(out_u) == model(seen, batch_keys), batch
        assert as_set(out_c) == model(seen, {k for k, _ in seen}), batch
        assert m_u.num_input_rows == len(rows)
        assert m_u.num_rows_updated == len(batch_keys)
        assert m_u.num_output_rows == len(batch_keys)
        assert m_c.num_output_rows == len({k for k, _ in seen})


def test_result_types_and_all_null_sums(make_runner: Runner) -> None:
    runner = make_runner(agg_op())
    out, _ = runner.run(partial([("a", None), ("a", None)]), "update")
    assert out.schema.field("n").type == pa.int64()
    assert out.schema.field("total").type == pa.int64()
    assert out.schema.field("mean").type == pa.float64()
    assert out.to_pylist() == [
        {"k": "a", "n": 2, "total": None, "lo": None, "hi": None, "mean": None, "nv": 0}
    ]
    out, _ = runner.run(partial([("a", 4)]), "update")
    assert out.to_pylist() == [
        {"k": "a", "n": 3, "total": 4, "lo": 4, "hi": 4, "mean": 4.0, "nv": 1}
    ]


def test_empty_batch_emits_nothing_in_update_mode(make_runner: Runner) -> None:
    runner = make_runner(agg_op())
    runner.run(partial([("a", 1)]), "update")
    out, metrics = runner.run([], "update")
    assert out.num_rows == 0 and metrics.num_rows_updated == 0


def test_global_aggregation_keeps_its_state_through_a_batch_without_rows(
    make_runner: Runner,
) -> None:
    """A global aggregation (no keys, the constant state key) gets one partial row even for a
    batch without rows, as Spark's aggregate without keys gives: it leaves ``last`` and every
    other buffer as they were, and is the key's row of the batch (update mode), as in Spark."""
    op = StreamingAggregate(
        pa.schema([(GLOBAL_KEY, pa.int32())]),
        [
            AggregateFunction("last", "l", pa.int64(), pa.int64()),
            AggregateFunction("count", "n", pa.int64()),
        ],
        output_keys=[],
    )
    runner = make_runner(op)

    def batch(last: int | None, rows: int) -> list[dict[str, Any]]:
        return [
            {
                GLOBAL_KEY: 0,
                buffer_column(0, "last", 0): last,
                buffer_column(1, "count", 0): rows,
                ROWS_COLUMN: rows,
            }
        ]

    out, _ = runner.run(batch(3, 3), "update")
    assert out.to_pylist() == [{"l": 3, "n": 3}]
    out, metrics = runner.run(batch(None, 0), "update")
    assert out.to_pylist() == [{"l": 3, "n": 3}] and metrics.num_rows_updated == 1
    out, _ = runner.run(batch(None, 1), "complete")
    assert out.to_pylist() == [{"l": None, "n": 4}]


def test_decimal_sum_float_extremes_and_string_min_max(make_runner: Runner) -> None:
    op = StreamingAggregate(
        pa.schema([("k", pa.int64())]),
        [
            AggregateFunction("sum", "d", pa.decimal128(20, 2), pa.decimal128(10, 2)),
            AggregateFunction("max", "x", pa.float64(), pa.float64()),
            AggregateFunction("min", "y", pa.float64(), pa.float64()),
            AggregateFunction("min", "s", pa.string(), pa.string()),
            AggregateFunction(
                "max", "t", pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="UTC")
            ),
        ],
    )
    runner = make_runner(op)
    t0 = dt.datetime(2024, 1, 1, tzinfo=UTC)

    def row(d: str | None, x: float | None, s: str | None, t: dt.datetime | None) -> dict[str, Any]:
        return {
            "k": 1,
            buffer_column(0, "sum", 0): None if d is None else decimal.Decimal(d),
            buffer_column(1, "max", 0): x,
            buffer_column(2, "min", 0): x,
            buffer_column(3, "min", 0): s,
            buffer_column(4, "max", 0): t,
            ROWS_COLUMN: 1,
        }

    runner.run([row("1.25", 1.0, "pear", t0)], "update")
    out, _ = runner.run([row(None, float("nan"), "apple", None)], "update")
    got = out.to_pylist()[0]
    assert got["d"] == decimal.Decimal("1.25")
    assert math.isnan(got["x"])  # NaN is the largest double in Spark
    assert got["y"] == 1.0
    assert got["s"] == "apple"
    assert got["t"] == t0
    out, _ = runner.run([row("2.50", -math.inf, None, t0 + dt.timedelta(1))], "update")
    got = out.to_pylist()[0]
    assert got["d"] == decimal.Decimal("3.75") and got["y"] == -math.inf
    assert got["t"] == t0 + dt.timedelta(1)


def test_watermark_key_drops_late_rows_and_evicts_in_update_mode(make_runner: Runner) -> None:
    ts = pa.timestamp("us", tz="UTC")
    op = StreamingAggregate(
        pa.schema([("t", ts)]),
        [AggregateFunction("count", "n", pa.int64())],
        watermark_key="t",
        has_event_time=True,
    )
    runner = make_runner(op)
    base = dt.datetime(2024, 1, 1, tzinfo=UTC)

    def rows(*secs: int) -> list[dict[str, Any]]:
        return [
            {
                "t": base + dt.timedelta(seconds=s),
                buffer_column(0, "count", 0): 1,
                ROWS_COLUMN: 1,
                EVENT_TIME_COLUMN: base + dt.timedelta(seconds=s),
                EVENT_TIME_MIN_COLUMN: base + dt.timedelta(seconds=s),
                EVENT_TIME_SUM_COLUMN: (base + dt.timedelta(seconds=s)).timestamp() * 1000,
                EVENT_TIME_COUNT_COLUMN: 1,
            }
            for s in secs
        ]

    out, m = runner.run(rows(1, 2, 3), "update")
    assert out.num_rows == 3
    assert m.max_event_time_ms == int((base.timestamp() + 3) * 1000)
    wm = int((base.timestamp() + 2) * 1000)
    out, m = runner.run(rows(2, 4), "update", watermark_ms=wm)
    assert [r["t"] for r in out.to_pylist()] == [base + dt.timedelta(seconds=4)]
    assert m.num_rows_dropped_by_watermark == 1
    assert m.num_rows_removed == 2  # keys 1 s and 2 s are at or below the watermark
    out, _ = runner.run([], "complete")
    assert sorted(r["t"].second for r in out.to_pylist()) == [3, 4]


def test_unmergeable_aggregate_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="cannot be merged"):
        AggregateFunction("regr_slope", "x", pa.int64())
    with pytest.raises(ConfigurationError, match="at least one"):
        StreamingAggregate(pa.schema([("k", pa.int64())]), [])


def test_long_sum_overflow_fails_in_ansi_mode_and_wraps_otherwise(make_runner: Runner) -> None:
    def op(ansi: bool) -> StreamingAggregate:
        return StreamingAggregate(
            pa.schema([("k", pa.int64())]),
            [AggregateFunction("sum", "total", pa.int64(), pa.int64())],
            ansi=ansi,
        )

    big = {"k": 1, buffer_column(0, "sum", 0): 2**62, ROWS_COLUMN: 1}
    strict = make_runner(op(True))
    strict.run([big], "update")
    with pytest.raises(AggregateOverflowError, match="'total' overflowed int64"):
        strict.run([big, {**big, "k": 2}], "update")
    lenient = make_runner(op(False))
    lenient.run([big], "update")
    out, _ = lenient.run([big], "update")
    assert out.column("total").to_pylist() == [-(2**63)]
