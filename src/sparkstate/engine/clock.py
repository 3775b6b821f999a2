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

The driver writes, after every batch (:func:`write_clock`):

- ``requested_at_ms``: set when the watermark moved past one that event-time timeouts or timers
  use; a batch is wanted if it is later than the source's current tick;
- ``due_ms``: the earliest processing-time timeout or timer of any partition; a batch is wanted
  once the clock passes it (so, unlike Spark, an idle query with nothing due runs no batch).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from sparkstate.engine.logs import local_path
from sparkstate.exceptions import MissingVersionError
from sparkstate.store.durable import DurableDir

__all__ = ["CLOCK_FILE", "SOURCE_NAME", "ClockSource", "read_clock", "with_clock", "write_clock"]

SOURCE_NAME = "sparkstate_clock"
CLOCK_FILE = "clock.json"
#: Spark polls an idle source about every 10 ms: a local ``clock.json`` is read at every poll
#: (so the batch right after the request sees it), one on an object store at most once a second.
REMOTE_REFRESH_S = 1.0


def read_clock(directory: DurableDir) -> dict[str, Any]:
    """The driver's last request; ``{}`` before the first one."""
    try:
        data = json.loads(directory.read(CLOCK_FILE))
    except (MissingVersionError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_clock(directory: DurableDir, requested_at_ms: int | None, due_ms: int | None) -> None:
    body = {"requested_at_ms": requested_at_ms, "due_ms": due_ms}
    directory.write_atomic(CLOCK_FILE, json.dumps(body, sort_keys=True).encode("utf-8"))


def wants_batch(request: dict[str, Any], tick_ms: int, now_ms: int) -> bool:
    """Whether the driver's ``request`` asks for a batch after the one at ``tick_ms``."""
    requested = request.get("requested_at_ms")
    if requested is not None and int(requested) > tick_ms:
        return True
    due = request.get("due_ms")
    return due is not None and now_ms > int(due)


class ClockReader(DataSourceStreamReader):
    """Offsets ``{"tick": ms}``; no partitions, no rows."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._dir: DurableDir | None = None
        self._request: dict[str, Any] = {}
        self._read_at = 0.0
        self._refresh_s = 0.0 if local_path(root) else REMOTE_REFRESH_S

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - PySpark's name
        return {"tick": 0}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
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
        return ClockReader(str(self.options["path"]))


def with_clock(df: DataFrame, engine_root: str) -> DataFrame:
    """``df`` with the clock source unioned in (same schema, never a row from the clock)."""
    spark = df.sparkSession
    spark.dataSource.register(ClockSource)
    clock = (
        spark.readStream.format(SOURCE_NAME)
        .schema(df.schema)
        .option("path", engine_root)
        .load()
    )
    return df.union(clock)
