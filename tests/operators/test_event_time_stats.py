"""The event-time statistics a batch's progress shows (Spark's ``EventTimeStats``): ``max``,
``min`` and ``avg`` of the input rows' event times, merged over partitions."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from sparkstate.operators._arrow import EventTimeStats, event_time_stats
from sparkstate.operators.base import OperatorMetrics


def seconds(*values: int | None) -> pa.Array:
    epoch = dt.datetime(1970, 1, 1)
    times = [None if v is None else epoch + dt.timedelta(seconds=v) for v in values]
    return pa.array(times, pa.timestamp("us"))


def test_stats_of_a_column_skip_nulls() -> None:
    assert event_time_stats(seconds(10, 12, None, 14)) == EventTimeStats(14_000, 10_000, 36_000, 3)
    assert event_time_stats(seconds()) is None
    assert event_time_stats(seconds(None)) is None


def test_stats_merge_over_partitions_as_spark_merges_them() -> None:
    # EventTimeSuite's merge: the earliest, the largest, the average over every row
    first, second = OperatorMetrics(), OperatorMetrics()
    first.observe_event_times(event_time_stats(seconds(20, 30)))
    second.observe_event_times(event_time_stats(seconds(5, 100, 15)))
    first.merge(second)
    assert (first.min_event_time_ms, first.max_event_time_ms) == (5_000, 100_000)
    assert first.event_time_sum_ms / first.event_time_count == 34_000
    empty = OperatorMetrics()
    empty.merge(OperatorMetrics.from_dict(first.to_dict()))
    assert (empty.min_event_time_ms, empty.event_time_count) == (5_000, 5)
