"""Each watermark's own event times, where a stateful step's rows cannot tell them.

Spark keeps one watermark per ``withWatermark`` (per ``EventTimeWatermark`` node): the largest
event time of the rows read there, minus its delay; the query's watermark is their min (or
max, ``spark.sql.streaming.multipleWatermarkPolicy``). Once two watermarked streams are unioned,
the rows of the stateful step no longer tell whose they are; two watermarks on two columns read
two times. So each watermark gets a column of its own in the query's input,
:func:`input_time_column`: the event time its ``withWatermark`` reads, on the rows of the input
that declared it, null on the union's other inputs' rows. The driver reads each column's
statistics from the batch in a small job of their own (:func:`input_event_times`), then drops
the columns before the stateful steps see the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkstate.engine.plan.carried_time import carry_event_time
from sparkstate.engine.spark.schema import quote
from sparkstate.operators.base import OperatorMetrics

__all__ = [
    "input_event_times",
    "input_time_column",
    "null_time",
    "with_input_times",
]


#: A column name while the event time is added.
_carried = "__ss_input_time"


def input_time_column(index: int) -> str:
    """The column of the event time the query's watermark number ``index`` reads."""
    return f"__ss_input_time_{index}"


def null_time() -> Column:
    """An event time of no row (another input's rows)."""
    return F.lit(None).cast("timestamp")


def with_input_times(
    df: DataFrame, column: str, indexes: Sequence[int], timed: DataFrame | None, carrier: str
) -> DataFrame | None:
    """``df`` with the columns of watermarks ``indexes``, all on ``column`` (one input's
    ``withWatermark`` calls): the time read where Spark's ``EventTimeWatermark`` reads it,
    carried past projections that dropped it (``timed``, its ``carrier``, or the plan
    rebuilt, :func:`carry_event_time`); None where it cannot be carried."""
    if column in df.columns:
        time: DataFrame | None = df.withColumn(_carried, quote(column))
    elif timed is not None and carrier in timed.columns:
        time = timed.withColumnRenamed(carrier, _carried)
    else:
        time = carry_event_time(df, _carried)
    if time is None:
        return None
    out = time.withColumns({input_time_column(i): F.col(_carried) for i in indexes})
    return out.drop(_carried)


def input_event_times(df: DataFrame, columns: Sequence[str]) -> list[OperatorMetrics]:
    """Per column of ``columns``: the event-time statistics of batch ``df``'s rows (largest,
    earliest, sum and count in epoch milliseconds, as Spark's ``EventTimeStats``), from one
    small Spark job over those columns."""
    aggregates = []
    for name in columns:
        millis = F.unix_millis(quote(name).cast("timestamp"))
        aggregates += [F.max(millis), F.min(millis), F.sum(millis), F.count(millis)]
    row = df.agg(*aggregates).collect()[0]
    out = []
    for i in range(len(columns)):
        largest, earliest, total, count = row[4 * i : 4 * i + 4]
        stats = OperatorMetrics()
        if count:
            stats.max_event_time_ms = int(largest)
            stats.min_event_time_ms = int(earliest)
            stats.event_time_sum_ms = float(total)
            stats.event_time_count = int(count)
        out.append(stats)
    return out
