"""No-data batches: a source that makes Spark run a batch when state needs one and no data came.

Spark runs its own stateful queries a *no-data batch* when a stateful operator asks for one
(``shouldRunAnotherBatch``): after the watermark moved, so that event-time timeouts and timers
fire, and on every trigger with processing-time timeouts and timers. A sparkstate query is a
stateless ``foreachBatch`` query to Spark, so Spark would never run one, and on an idle stream
nothing would time out. The engine therefore unions the input with this source, whose only data is
its offset: ``{"tick": ms}``, advanced when the driver asked for another batch in ``clock.json``
under the engine's checkpoint directory. A new offset is new data to Spark, so the next trigger
runs a batch, with the next batch id, through the whole per-batch protocol; the source never
yields a row.

What the driver writes to ``clock.json`` after every batch, and when it wants a batch, is
:mod:`sparkstate.runtime.triggers`.

Under ``trigger(availableNow=True)`` the source supports Spark's available-now contract, so Spark
keeps every source's own read limit (``maxFilesPerTrigger``, ...) and runs the same data batches
as for the query without sparkstate (a source without the contract makes Spark read everything in
one batch). The clock still adds the no-data batches the driver asks for, reading the request at
every call, so the query runs Spark's no-data batch after its last data batch when that batch
moved the watermark, and then ends. One difference: with processing-time timeouts or timers Spark
runs no-data batches without end under ``availableNow`` and the query never finishes; a sparkstate
query runs one when a timeout is already due and otherwise finishes (what comes due later fires in
the next run).

Spark starts a new interpreter for the source at every start of the query; the source is
registered so that it imports PySpark compiled, not from Spark's zip
(:mod:`sparkstate.engine.spark.python_launch`): about 0.8 s less of every start.

PySpark 4.0 and 4.1 ask a Python source for its latest offset without the start (Spark's offset
of the last batch): the reader keeps the offset it answered last, and a new reader (a start or
restart of the query) takes the clock's line of the newest batch in Spark's offset log. They also
lack the available-now contract: Spark would read the clock once at the start of the run and run
no batch without data after the last data batch, so a query that needs the clock is refused
under ``availableNow`` there (:func:`sparkstate.engine.api.writer.needs_clock`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from sparkstate.engine.spark.python_launch import register_with_launcher
from sparkstate.exceptions import StateFileError
from sparkstate.files.durable import DurableDir, local_path
from sparkstate.runtime.spark_checkpoint import source_offsets, spark_batches
from sparkstate.runtime.triggers import read_clock, wants_batch

try:  # Python sources take the available-now contract from PySpark 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # 4.0, 4.1: such a query under availableNow is refused at start()

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """The contract's stand-in where PySpark has none: the module imports, never runs."""


__all__ = ["SOURCE_NAME", "ClockReader", "ClockSource", "is_clock_source", "with_clock"]

SOURCE_NAME = "sparkstate_clock"
#: Spark polls an idle source about every 10 ms: a local ``clock.json`` is read at every poll
#: (so the batch right after the request sees it), one on an object store at most once a second.
REMOTE_REFRESH_S = 1.0


class ClockReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"tick": ms}``; no partitions, no rows."""

    def __init__(self, root: str, checkpoint: str) -> None:
        self.root = root
        self.checkpoint = checkpoint
        self._at: dict[str, Any] | None = None  # the offset answered last
        self._dir: DurableDir | None = None
        self._request: dict[str, Any] = {}
        self._read_at = 0.0
        self._refresh_s = 0.0 if local_path(root) else REMOTE_REFRESH_S

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - PySpark's name
        """``availableNow``: Spark ends the query at the first call that returns ``start``, so
        the driver's request is read at every call, even on an object store."""
        self._refresh_s = 0.0

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - PySpark's name
        return {"tick": 0}

    def latestOffset(  # noqa: N802 - PySpark's name
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        if start is None:  # PySpark 4.0, 4.1 (see the module)
            start = self._at if self._at is not None else self._spark_position()
        self._at = self._latest(start)
        return self._at

    def _latest(self, start: dict[str, Any]) -> dict[str, Any]:
        tick = int(start["tick"])
        now = time.time()
        if now - self._read_at >= self._refresh_s:
            if self._dir is None:
                self._dir = DurableDir(self.root)
            self._request = read_clock(self._dir)
            self._read_at = now
        now_ms = int(now * 1000)
        if wants_batch(self._request, tick, now_ms):
            return {"tick": max(now_ms, tick + 1)}
        return start

    def _spark_position(self) -> dict[str, Any]:
        """The clock's offset in the newest batch of Spark's offset log (where Spark starts
        from); the initial offset before the first batch."""
        spark = DurableDir(self.checkpoint)
        try:
            batches, _ = spark_batches(spark)
            lines = source_offsets(spark, batches[-1]) if batches else []
        except StateFileError:
            lines = []
        for line in reversed(lines):  # the clock is the last source of the union
            try:
                offset = json.loads(line)
            except ValueError:
                continue
            if isinstance(offset, dict) and set(offset) == {"tick"}:
                return {"tick": int(offset["tick"])}
        return self.initialOffset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())


class ClockSource(DataSource):
    """``spark.readStream.format("sparkstate_clock").schema(...).option("path", root)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return "tick long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - PySpark's name
        return ClockReader(str(self.options["path"]), str(self.options["checkpoint"]))


_REGISTER_LOCK = threading.Lock()


def with_clock(df: DataFrame, engine_root: str, checkpoint: str) -> DataFrame:
    """``df`` with the clock source unioned in (same schema, never a row from the clock);
    ``checkpoint``: Spark's checkpoint location of the query."""
    spark = df.sparkSession
    with _REGISTER_LOCK:  # Spark's registry checks, then adds: two at once may both add
        try:
            if not register_with_launcher(spark, ClockSource):
                spark.dataSource.register(ClockSource)
        except Exception as exc:
            # Another client of the same Spark Connect server registered it a moment ago.
            if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                raise
    clock = (
        spark.readStream.format(SOURCE_NAME)
        .schema(df.schema)
        .option("path", engine_root)
        .option("checkpoint", checkpoint)
        .load()
    )
    return df.union(clock)


def is_clock_source(source: dict[str, Any]) -> bool:
    """Whether a source of Spark's progress is the clock (its offsets are only a tick)."""
    for field in ("endOffset", "startOffset", "latestOffset"):
        offset = source.get(field)
        if isinstance(offset, str):
            try:
                offset = json.loads(offset)
            except ValueError:
                continue
        if isinstance(offset, dict) and set(offset) == {"tick"}:
            return True
    return False
