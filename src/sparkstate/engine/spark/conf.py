"""What the store's settings take from the Spark session: Spark's own state store settings, so a
query ported by wrapping keeps its tuning, and the executor's task slots, which divide a memory
budget among its Python workers."""

from __future__ import annotations

import os
import re
from typing import Any

from sparkstate.exceptions import ConfigurationError

__all__ = [
    "arrow_batch_limits",
    "python_workers_per_executor",
    "state_encoding_format",
    "store_options_from_spark",
]

_SQL = "spark.sql.streaming."
#: Spark's setting -> the store option it sets (where the query sets none).
_SPARK_STORE_CONFS = {
    f"{_SQL}stateStore.minDeltasForSnapshot": "min_deltas_for_snapshot",
    f"{_SQL}minBatchesToRetain": "min_versions_to_retain",
    f"{_SQL}stateStore.rocksdb.trackTotalNumberOfRows": "track_total_rows",
    f"{_SQL}stateStore.rocksdb.lockAcquireTimeoutMs": "lock_timeout_s",
}
_MAINTENANCE = f"{_SQL}stateStore.maintenanceInterval"
_BOUNDED = f"{_SQL}stateStore.rocksdb.boundedMemoryUsage"
_MAX_MEMORY = f"{_SQL}stateStore.rocksdb.maxMemoryUsageMB"
#: ``local``, ``local[N]``, ``local[*]``, ``local[N, F]``; ``local-cluster[E, N, M]``: N.
_LOCAL_THREADS = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,\s*\d+\s*\]")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*")
_SECONDS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_ENCODING = f"{_SQL}stateStore.encodingFormat"
_ENCODINGS = ("unsaferow", "avro")
_MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
_MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
FILE_SINK_COMPACT_INTERVAL = f"{_SQL}fileSink.log.compactInterval"


def store_options_from_spark(spark: Any) -> dict[str, str]:
    """Store options (``stateStore.*`` names, without the prefix) from Spark's state store
    settings that the session sets explicitly: snapshots every ``minDeltasForSnapshot`` versions,
    ``minBatchesToRetain``, the maintenance interval, row counting and a bounded memory budget
    (``boundedMemoryUsage`` with ``maxMemoryUsageMB``, an executor's budget as in Spark)."""
    try:
        spark_set = _set_explicitly(
            spark, [*_SPARK_STORE_CONFS, _MAINTENANCE, _BOUNDED, _MAX_MEMORY]
        )
    except Exception:  # a session that cannot list its settings: options alone
        return {}
    out = {
        ours: spark_set[theirs]
        for theirs, ours in _SPARK_STORE_CONFS.items()
        if theirs in spark_set
    }
    if "lock_timeout_s" in out:
        out["lock_timeout_s"] = str(int(out["lock_timeout_s"]) / 1000)
    if _MAINTENANCE in spark_set:
        out["maintenanceIntervalSeconds"] = str(_seconds(spark_set[_MAINTENANCE], _MAINTENANCE))
    if str(spark_set.get(_BOUNDED, "")).lower() == "true":
        out["memory_budget_mb"] = spark_set.get(_MAX_MEMORY, "500")
    return out


def _set_explicitly(spark: Any, names: list[str]) -> dict[str, str]:
    """Those of ``names`` the session sets, with their values: asked one by one of a classic
    session (listing all its settings costs a py4j call per setting, 50-500 ms), from the list
    over Spark Connect."""
    jconf: Any = getattr(spark.conf, "_jconf", None)
    if jconf is None:
        every: dict[str, str] = dict(spark.conf.getAll)
        return {k: every[k] for k in names if k in every}
    return {k: str(jconf.get(k)) for k in names if jconf.contains(k)}


def _seconds(text: str, name: str) -> float:
    match = _DURATION.fullmatch(text.lower())
    if match is None:
        msg = f"{name}={text!r} is not a duration like '60s' or '500ms'"
        raise ConfigurationError(msg)
    return float(match.group(1)) * _SECONDS[match.group(2)]


def python_workers_per_executor(spark: Any) -> int:
    """How many Python workers an executor runs at once: its task slots, ``spark.executor.cores``
    (a local master's thread count) over ``spark.task.cpus``. Where the executor's cores are not
    set (a standalone executor takes all of its worker's), this machine's CPU count stands in."""
    conf = spark.conf
    task_cpus = max(1, int(conf.get("spark.task.cpus", "1") or 1))
    cores = conf.get("spark.executor.cores", None)
    if not cores:
        master = str(conf.get("spark.master", "") or "")
        if local := _LOCAL_THREADS.fullmatch(master):
            cores = local.group(1) or "1"
        elif cluster := _LOCAL_CLUSTER.fullmatch(master):
            cores = cluster.group(1)
    if not cores or cores == "*":
        return max(1, (os.cpu_count() or 1) // task_cpus)
    return max(1, int(cores) // task_cpus)


def state_encoding_format(spark: Any) -> str:
    """Spark's state encoding (``spark.sql.streaming.stateStore.encodingFormat``: ``unsaferow``,
    the default, or ``avro``), which decides how a ``transformWithState``'s state schemas may
    evolve and whether they must be nullable."""
    value = str(spark.conf.get(_ENCODING, None) or "unsaferow").strip().lower()
    if value not in _ENCODINGS:
        msg = f"{_ENCODING}={value!r}: Spark takes one of {list(_ENCODINGS)}"
        raise ConfigurationError(msg)
    return value


def arrow_batch_limits(spark: Any) -> tuple[int, int]:
    """``spark.sql.execution.arrow.maxRecordsPerBatch`` (10000; <= 0: no limit) and
    ``maxBytesPerBatch`` (2^31 - 1): how Spark cuts a key's rows into the frames
    ``transformWithStateInPandas`` hands ``handleInputRows``."""
    values = [
        _whole_number(spark, _MAX_RECORDS, 10_000),
        _whole_number(spark, _MAX_BYTES, 2**31 - 1),
    ]
    if values[1] <= 0:
        msg = f"{_MAX_BYTES}={values[1]} must be positive (as Spark requires)"
        raise ConfigurationError(msg)
    return values[0], values[1]


def file_sink_compact_interval(spark: Any) -> int:
    """``spark.sql.streaming.fileSink.log.compactInterval`` (10): every how many batches a file
    sink compacts its log; Spark's refusal of one below 1."""
    interval = _whole_number(spark, FILE_SINK_COMPACT_INTERVAL, 10)
    if interval <= 0:
        msg = f"Please set {FILE_SINK_COMPACT_INTERVAL} (was {interval}) to a positive value."
        raise ConfigurationError(msg)
    return interval


def _whole_number(spark: Any, name: str, default: int) -> int:
    """The session's setting ``name`` as a whole number, ``default`` where it is not set."""
    raw = spark.conf.get(name, None)
    try:
        return default if raw in (None, "") else int(str(raw).strip())
    except ValueError as exc:
        msg = f"{name}={raw!r} is not a whole number"
        raise ConfigurationError(msg) from exc
