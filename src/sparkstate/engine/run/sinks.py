"""Where a batch's output goes. Every sink runs exactly one Spark action over the output.

That one action is also what runs the stateful tasks, so a sink must consume every partition of
the output: the file sink writes it, the console and memory sinks collect it as Arrow, the noop
sink drains it, and ``foreachBatch`` first materializes it (persist + count) so that the user's
function may run as many actions as it likes without running the stateful stage again.

The console and memory sinks give the collected Arrow table back to Spark as it is: through
pandas, a double's NaN and NULL would both become NaN, and then NULL.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.readwriter import DataStreamWriter as SparkDataStreamWriter

from sparkstate.engine.spark.conf import FILE_SINK_COMPACT_INTERVAL, file_sink_compact_interval
from sparkstate.engine.spark.errors import SparkAnalysisError
from sparkstate.exceptions import ConfigurationError, StateFileError
from sparkstate.files.durable import DurableDir, FileEntry, local_path

__all__ = [
    "FILE_FORMATS",
    "FOREACH",
    "FOREACH_BATCH",
    "ConsoleSink",
    "FileSink",
    "ForeachBatchSink",
    "MemorySink",
    "NoopSink",
    "Sink",
    "check_output_mode",
    "check_partitioning",
    "foreach_rows",
    "make_sink",
]

log = logging.getLogger("sparkstate.engine")

FILE_FORMATS = ("parquet", "json", "csv", "orc")
#: The writer's format once ``foreach(f)`` or ``foreachBatch(fn)`` chose the sink, as Spark's
#: writer keeps it (a later ``format()`` chooses another sink, as in Spark).
FOREACH = "foreach"
FOREACH_BATCH = "foreachBatch"
#: The sinks Spark refuses to partition.
UNPARTITIONED = ("memory", FOREACH, FOREACH_BATCH)
#: The local property by which PySpark's ``foreach`` code finds the batch id (its epoch).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
METADATA_DIR = "_spark_metadata"
STAGING_DIR = "_sparkstate_staging"
#: Spark's default ``spark.sql.streaming.fileSink.log.compactInterval``.
COMPACT_INTERVAL = 10


class Sink(ABC):
    """Receives each batch's output DataFrame; exactly one action per call."""

    description: str = "Sink"

    @abstractmethod
    def add_batch(self, batch_id: int, df: DataFrame, output_mode: str) -> None:
        """Run the batch's output into the sink (the stateful tasks run inside this call)."""

    def committed(self, batch_id: int) -> bool:
        """True if the sink durably holds the batch's output (only the file sink can say)."""
        return False

    def finish_batch(self, batch_id: int) -> None:  # noqa: B027 - optional hook
        """Runs after ``add_batch`` under the user's own session settings (for user code)."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Release what the sink holds (nothing by default)."""


class NoopSink(Sink):
    """Runs the output and throws it away (Spark's ``noop`` format): for benchmarks."""

    description = "NoopSink"

    def add_batch(self, batch_id: int, df: DataFrame, output_mode: str) -> None:
        df.write.format("noop").mode("overwrite").save()


class FileSink(Sink):
    """Exactly-once files: a batch's files become visible with its manifest, and only then.

    The manifest is Spark's own file-sink log (``<path>/_spark_metadata/<batch>``, compacted every
    ``compact_interval`` batches, or every interval the log was written with, by Spark's rule),
    so ``spark.read.<format>(path)`` sees exactly the committed files, as it does for Spark's
    file sink. A replayed batch whose manifest exists writes nothing (its stateful stage
    still runs, to reproduce the state); files of a failed attempt are never listed.
    """

    def __init__(
        self,
        fmt: str,
        path: str,
        options: dict[str, str],
        partition_by: tuple[str, ...] = (),
        compact_interval: int = COMPACT_INTERVAL,
    ) -> None:
        if fmt not in FILE_FORMATS:
            msg = f"file sink format must be one of {FILE_FORMATS}, got {fmt!r}"
            raise ConfigurationError(msg)
        #: The session's interval; the log's own, if it was written with another, wins.
        self._default_interval = compact_interval
        self._interval: int | None = None
        self.fmt = fmt
        self.options = options
        #: ``partitionBy``'s columns: a batch's files go under ``<column>=<value>/`` directories.
        self.partition_by = partition_by
        self.dir = DurableDir(path)
        self.meta = self.dir.child(METADATA_DIR)
        self.local = local_path(path) is not None
        #: How the manifest names a file: a URI of the file system the sink writes to.
        self.uri_prefix = "file://" if self.local else path[: path.index("://") + 3]
        self.description = f"FileSink[{path}]"
        #: The staging directory of the batch being written, until its files are committed.
        self._staging: DurableDir | None = None

    def committed(self, batch_id: int) -> bool:
        return self.meta.exists(self._log_name(batch_id))

    @property
    def compact_interval(self) -> int:
        """Every how many batches the log is compacted: the session's interval, unless the log's
        newest compaction was written with another (Spark's ``CompactibleFileStreamLog``)."""
        if self._interval is None:
            latest = max(_compactions(e.name for e in self.meta.list()), default=None)
            self._interval = self._default_interval
            if latest is not None and (latest + 1) % self._default_interval != 0:
                self._interval = derive_compact_interval(self._default_interval, latest)
                log.warning(
                    "%s: the file sink's log was compacted at batch %d, so it is compacted every "
                    "%d batches, not every %d (%s)",
                    self.description,
                    latest,
                    self._interval,
                    self._default_interval,
                    FILE_SINK_COMPACT_INTERVAL,
                )
        return self._interval

    def _log_name(self, batch_id: int) -> str:
        compact = (batch_id + 1) % self.compact_interval == 0
        return f"{batch_id}.compact" if compact else str(batch_id)

    def add_batch(self, batch_id: int, df: DataFrame, output_mode: str) -> None:
        if self.committed(batch_id):
            df.write.format("noop").mode("overwrite").save()  # reproduce the state only
            return
        check_output_mode(self.fmt, output_mode)
        staging = self.dir.child(STAGING_DIR, f"{batch_id}-{uuid.uuid4().hex}")
        self._staging = staging
        where = staging.path if self.local else staging.uri
        writer = df.write.format(self.fmt).options(**self.options)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.mode("overwrite").save(where)
        entries = []
        for folder, name, size in self._data_files(staging):
            source, target = (
                (staging.child(folder), self.dir.child(folder))
                if folder
                else (
                    staging,
                    self.dir,
                )
            )
            source.move_to(name, target)
            entries.append(
                {
                    "path": self.uri_prefix + _uri_path(self.dir.path, folder, name),
                    "size": size,
                    "isDir": False,
                    "modificationTime": int(time.time() * 1000),
                    "blockReplication": 1,
                    "blockSize": 33554432,
                    "action": "add",
                }
            )
        self._write_log(batch_id, entries)
        staging.delete_all()
        self._staging = None

    def _data_files(self, staging: DurableDir) -> list[tuple[str, str, int]]:
        """The data files Spark's writer left in ``staging``: (the partition directories they
        are in, ``k=a/d=1`` with two partition columns, ``""`` with none; name; size)."""
        out = []
        for entry in staging.walk():
            folder, _, name = entry.name.rpartition("/")
            parts = folder.split("/") if folder else []
            if not name.startswith("part-") or len(parts) != len(self.partition_by):
                continue  # Spark's _SUCCESS, its checksums (.part-*.crc)
            if any(p.startswith(("_", ".")) or "=" not in p for p in parts):
                continue  # not a partition directory (a job's leftover _temporary/)
            out.append((folder, name, entry.size))
        return out

    def stop(self) -> None:
        """Remove the files of a batch that was not committed (a stop or a failure mid-write)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            try:
                staging.delete_all()
            except StateFileError as exc:
                log.warning("could not remove the uncommitted files in %s: %s", staging.uri, exc)

    def _write_log(self, batch_id: int, entries: list[dict[str, Any]]) -> None:
        name = self._log_name(batch_id)
        if name.endswith(".compact"):
            entries = self._all_entries_before(batch_id) + entries
        body = "v1\n" + "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)
        self.meta.write_atomic(name, body.encode("utf-8"))

    def _entries(self, batch_id: int) -> list[dict[str, Any]]:
        lines = self.meta.read(self._log_name(batch_id)).decode("utf-8").splitlines()[1:]
        return [json.loads(line) for line in lines if line.strip()]

    def _all_entries_before(self, batch_id: int) -> list[dict[str, Any]]:
        start = batch_id - self.compact_interval  # the previous compaction, or -1
        out: list[dict[str, Any]] = []
        for b in range(max(start, 0), batch_id):
            if self.committed(b):
                out.extend(self._entries(b))
        return out

    def read_committed_files(self) -> list[str]:
        """Paths of the files the manifests list (what a manifest-following reader sees)."""
        names = [e.name for e in self.meta.list() if not e.name.startswith(".")]
        ids = sorted({int(n.split(".")[0]) for n in names})
        if not ids:
            return []
        latest = ids[-1]
        first = max(_compactions(names), default=0)
        return [e["path"] for b in range(first, latest + 1) for e in self._entries(b)]


def _compactions(names: Iterable[str]) -> list[int]:
    """The batches of a file sink log's compactions, among its files' ``names``."""
    return [int(n.removesuffix(".compact")) for n in names if n.endswith(".compact")]


def derive_compact_interval(default: int, latest_compaction: int) -> int:
    """The interval of a log whose newest compaction is batch ``latest_compaction``, which the
    session's ``default`` does not fall on (Spark's ``deriveCompactInterval``): the smallest
    divisor of ``latest_compaction + 1`` from ``default`` up, the batch count itself if none."""
    batches = latest_compaction + 1
    if batches <= default:
        return batches
    if default < batches // 2:
        return next((i for i in range(default, batches // 2 + 1) if batches % i == 0), batches)
    return batches


def _data_files(staging: DurableDir, depth: int) -> list[tuple[str, FileEntry]]:
    """The data files Spark wrote under ``staging``: (the partition folder they are in, ``""``
    without partitions, ``k=a/d=1`` with two; their entry)."""
    if depth == 0:
        return [("", e) for e in staging.list() if e.name.startswith("part-")]
    selector = pafs.FileSelector(staging.path, recursive=True, allow_not_found=True)
    out = []
    for info in staging.fs.get_file_info(selector):
        rel = info.path[len(staging.path) :].strip("/")
        folder, _, name = rel.rpartition("/")
        if info.type != pafs.FileType.File or not name.startswith("part-"):
            continue
        if folder.count("/") + 1 == depth:
            out.append((folder, FileEntry(name, info.size or 0, 0.0)))
    return out


def _uri_path(*parts: str) -> str:
    """A path as a manifest names it: Hadoop's ``Path.toUri`` quotes what a URI's path cannot
    hold (``k=b c`` as ``k=b%20c``; ``%`` of an escaped partition value, ``k=d%2Fe``, as
    ``%25``), and Spark's reader decodes it back."""
    return quote("/".join(p for p in parts if p), safe="/!$&'()*+,;=:@")


class ConsoleSink(Sink):
    """Prints each batch as Spark's console sink does."""

    description = "ConsoleSink"

    def __init__(self, spark: SparkSession, options: dict[str, str]) -> None:
        self.spark = spark
        self.num_rows = int(options.get("numRows", "20"))
        self.truncate = options.get("truncate", "true").lower() == "true"

    def add_batch(self, batch_id: int, df: DataFrame, output_mode: str) -> None:
        table = df.toArrow()
        print("-------------------------------------------")
        print(f"Batch: {batch_id}")
        print("-------------------------------------------")
        local = self.spark.createDataFrame(table, schema=df.schema)
        local.show(self.num_rows, self.truncate)


class MemorySink(Sink):
    """A temp view named by ``queryName`` holding the output (as Spark's memory sink)."""

    def __init__(self, spark: SparkSession, name: str) -> None:
        self.spark = spark
        self.name = name
        self.description = f"MemorySink[{name}]"
        self._tables: list[pa.Table] = []
        self._schema: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles for Spark Connect, where the sink runs in the server's foreachBatch process
        and publishes the view through the client's session (``spark``), visible to it."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def add_batch(self, batch_id: int, df: DataFrame, output_mode: str) -> None:
        table = df.toArrow()
        with self._lock:
            if output_mode == "complete":
                self._tables = [table]
            else:
                self._tables.append(table)
            self._schema = df.schema
            self._publish()

    def _publish(self) -> None:
        tables = [t for t in self._tables if t.num_rows] or self._tables[:1]
        frame = self.spark.createDataFrame(pa.concat_tables(tables), schema=self._schema)
        frame.createOrReplaceTempView(self.name)

    def rows(self) -> pa.Table | None:
        with self._lock:
            return pa.concat_tables(self._tables) if self._tables else None


class ForeachBatchSink(Sink):
    """Calls the user's ``fn(df, batch_id)`` with the materialized output of the batch."""

    description = "ForeachBatchSink"

    def __init__(self, fn: Callable[[DataFrame, int], Any]) -> None:
        self.fn = fn
        self._cached: DataFrame | None = None

    def add_batch(self, batch_id: int, df: DataFrame, output_mode: str) -> None:
        cached = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # The one run of the stateful stage, as the job's last stage: Spark keeps one attempt
            # of each of its tasks, and its accumulators tell which (``engine.attempts``).
            cached.write.format("noop").mode("overwrite").save()
        except BaseException:
            cached.unpersist()
            raise
        self._cached = cached

    def finish_batch(self, batch_id: int) -> None:
        cached, self._cached = self._cached, None
        if cached is None:
            return
        try:
            self.fn(cached, batch_id)
        finally:
            cached.unpersist()


def check_output_mode(fmt: str, mode: str) -> None:
    """Refuse, as Spark does at ``start()``, an output mode the sink ``fmt`` does not take: a
    file sink only adds files, so it takes append mode only; the others take every mode."""
    if fmt in FILE_FORMATS and mode != "append":
        msg = (
            f"Invalid streaming output mode: {mode}. This output mode is not supported in Data "
            f"Source {fmt} (as in Spark: a file sink only adds files, so it takes append mode "
            "only); use outputMode('append'), or .foreachBatch(fn) to write each batch's rows "
            "yourself"
        )
        parameters = {"className": fmt, "outputMode": mode}
        raise SparkAnalysisError(msg, "STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE", parameters)


def check_partitioning(
    fmt: str, partition_by: tuple[str, ...], columns: list[str], *, case_sensitive: bool
) -> tuple[str, ...]:
    """Refuse ``partitionBy`` as Spark's ``start()`` does: on a sink that cannot partition its
    rows, or by a column the output does not have. The columns as the output names them (as
    Spark's resolver finds them, ignoring case unless ``spark.sql.caseSensitive``)."""
    if not partition_by:
        return ()
    if fmt in UNPARTITIONED:
        msg = (
            f"'{fmt}' does not support partitioning. (As in Spark; partitionBy lays out a file "
            "sink's output)"
        )
        raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_1197", {"operation": fmt})
    if fmt not in FILE_FORMATS:
        return partition_by  # Spark's console and noop sinks take and ignore it
    out = []
    for col in partition_by:
        found = [c for c in columns if (c == col if case_sensitive else c.lower() == col.lower())]
        if not found:
            valid = ", ".join(columns)
            msg = f"Partition column {col} not found in existing columns ({valid})."
            parameters = {"columnType": "Partition", "columnName": col, "validColumnNames": valid}
            raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_1196", parameters)
        out.append(found[0])
    return tuple(out)


def foreach_rows(writer: Any) -> Callable[[DataFrame, int], None]:
    """The function of a ``foreachBatch`` sink that gives each row of a batch to ``writer``, as
    Spark's ``foreach`` sink does: a function of a row, or an object with ``process(row)`` and
    optionally ``open(partition_id, epoch_id)`` and ``close(error)``, wrapped and checked by
    PySpark's own ``foreach`` code, once per partition of the batch, the batch id the epoch.
    A classic session's only: it runs on the batch's RDD."""
    per_partition = SparkDataStreamWriter._construct_foreach_function(writer)  # noqa: SLF001

    def each_row(df: DataFrame, batch_id: int) -> None:
        context = df.sparkSession.sparkContext
        previous = context.getLocalProperty(BATCH_ID_PROPERTY)
        context.setLocalProperty(BATCH_ID_PROPERTY, str(batch_id))  # where PySpark reads it
        try:
            df.rdd.mapPartitionsWithIndex(per_partition).count()  # type: ignore[arg-type]
        finally:
            context.setLocalProperty(BATCH_ID_PROPERTY, previous)  # type: ignore[arg-type]

    return each_row


def make_sink(
    fmt: str,
    options: dict[str, str],
    spark: SparkSession,
    query_name: str | None,
    batch_function: Callable[[DataFrame, int], Any] | None,
    partition_by: tuple[str, ...] = (),
) -> Sink:
    """The sink for ``writeStream.format(fmt)``; ``foreach`` and ``foreachBatch`` (``fmt``
    :data:`FOREACH` or :data:`FOREACH_BATCH`) run ``batch_function``; a file sink lays its files
    out by the ``partition_by`` columns."""
    if fmt in (FOREACH, FOREACH_BATCH):
        assert batch_function is not None
        return ForeachBatchSink(batch_function)
    if fmt in FILE_FORMATS:
        path = options.get("path")
        if not path:
            msg = f"the {fmt} sink needs a path: .option('path', ...) or .start(path)"
            raise ConfigurationError(msg)
        file_options = {k: v for k, v in options.items() if k != "path"}
        interval = file_sink_compact_interval(spark)
        return FileSink(fmt, path, file_options, partition_by, interval)
    if fmt == "console":
        return ConsoleSink(spark, options)
    if fmt == "memory":
        if not query_name:
            msg = "the memory sink names its table after the query: call .queryName('name')"
            raise ConfigurationError(msg)
        return MemorySink(spark, query_name)
    if fmt == "noop":
        return NoopSink()
    known = [*FILE_FORMATS, "console", "memory", "noop"]
    msg = f"unsupported sink format {fmt!r}; use one of {known}, .foreach(f) or .foreachBatch(fn)"
    raise ConfigurationError(msg)
