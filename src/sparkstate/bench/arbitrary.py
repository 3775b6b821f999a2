"""``sparkstate bench arbitrary``: a count per key with arbitrary state, Python APIs compared.

Over the ``rate-micro-batch`` source with ``key = value % keys`` and one row per key per batch
(full: 200k distinct keys per batch; ``--quick``: 20k), ``local[2]``, 4 shuffle partitions,
update mode, ``noop`` output, every system keeps one ``count`` per key and emits ``(key, count)``
for every key it saw. Each system runs in a fresh subprocess with its own SparkSession:

- ``spark-aipws``: Spark's ``applyInPandasWithState`` with ``RocksDBStateStoreProvider``;
- ``spark-tws``: Spark's ``transformWithStateInPandas`` with a :class:`CountProcessor` holding a
  ``ValueState`` (needs the RocksDB provider, and ``protobuf`` in the environment);
- ``sparkstate-aipws``: our ``applyInPandasWithState`` (the same :func:`count_pandas`);
- ``sparkstate-rows``: our row-based variant (:func:`count_rows`);
- ``sparkstate-processor``: our row-mode ``transformWithState`` with :class:`CountRowsProcessor`
  (the same state calls as :class:`CountProcessor`, plain tuples in and out instead of pandas
  frames: the fast path a sparkstate user would pick).

A sparkstate system is reported as not available until its API exists on
``sparkstate.engine.GroupedStream``. Keys are "rows" here: ``rows_per_s`` = ``keys_per_s``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import pandas as pd

from sparkstate.bench._spark import (
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    BenchSpec,
    NotAvailable,
    measure_query,
    rate_keys,
    run_bench,
    spark_session,
)

__all__ = [
    "SYSTEMS",
    "CountProcessor",
    "CountRowsProcessor",
    "count_pandas",
    "count_rows",
    "measure",
    "run",
]

SYSTEMS = [
    "spark-aipws",
    "spark-tws",
    "sparkstate-aipws",
    "sparkstate-rows",
    "sparkstate-processor",
]
RATIO_PAIRS = [
    ("sparkstate-processor", "spark-tws"),
    ("sparkstate-rows", "spark-aipws"),
    ("sparkstate-aipws", "spark-aipws"),
    ("sparkstate-processor", "spark-aipws"),
    ("sparkstate-rows", "spark-tws"),
    ("spark-aipws", "spark-tws"),
]
OUTPUT_SCHEMA = "key long, count long"
STATE_SCHEMA = "count long"
#: Spark's Python stateful APIs manage ~1-4k keys/s on 2 cores (under 1k when other work shares
#: them): a full batch takes one to several minutes, a quick one 5-35 s, the warm-up more.
FULL = {"rows_per_batch": 200_000, "keys": 200_000, "batches": 4, "warmup": 1}
QUICK = {"rows_per_batch": 20_000, "keys": 20_000, "batches": 3, "warmup": 1}


# --- the user functions, identical for Spark and sparkstate ---------------------------------------


def count_pandas(key: tuple[Any, ...], pdfs: Iterable[pd.DataFrame], state: Any) -> Iterator[Any]:
    """``applyInPandasWithState`` function: add the group's rows to its count, emit the count."""
    n = int(state.get[0]) if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n,))
    yield pd.DataFrame({"key": [key[0]], "count": [n]})


def count_rows(key: tuple[Any, ...], rows: Iterable[Any], state: Any) -> Iterator[tuple[Any, ...]]:
    """The row-based variant's function: plain rows in, plain rows out, the same state calls."""
    n = int(state.get[0]) if state.exists else 0
    n += len(rows) if isinstance(rows, Sized) else sum(1 for _ in rows)
    state.update((n,))
    yield (key[0], n)


def _processor_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class CountProcessor(_processor_base()):  # type: ignore[misc]
    """A ``StatefulProcessor`` with one ``ValueState`` count per key.

    One ``get`` (``None`` when absent, so no separate ``exists`` call) and one ``update`` per key:
    the fewest state calls, so the fairest to Spark's socket round trip per call.
    """

    def init(self, handle: Any) -> None:
        self._count = handle.getValueState("count", STATE_SCHEMA)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: tuple[Any, ...],
        rows: Iterable[pd.DataFrame],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        current = self._count.get()
        n = int(current[0]) if current is not None else 0
        for pdf in rows:
            n += len(pdf)
        self._count.update((n,))
        yield pd.DataFrame({"key": [key[0]], "count": [n]})

    def close(self) -> None:
        pass


class CountRowsProcessor(_processor_base()):  # type: ignore[misc]
    """:class:`CountProcessor` for row-mode ``transformWithState``: rows in, tuples out."""

    def init(self, handle: Any) -> None:
        self._count = handle.getValueState("count", STATE_SCHEMA)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: tuple[Any, ...],
        rows: Iterable[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[tuple[Any, ...]]:
        current = self._count.get()
        n = int(current[0]) if current is not None else 0
        n += sum(1 for _ in rows)
        self._count.update((n,))
        yield (key[0], n)

    def close(self) -> None:
        pass


# --- the systems ----------------------------------------------------------------------------------


def _spark_plan(system: str, df: Any) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    grouped = df.groupBy("key")
    if system == "spark-aipws":
        return grouped.applyInPandasWithState(
            count_pandas, OUTPUT_SCHEMA, STATE_SCHEMA, "Update", GroupStateTimeout.NoTimeout
        )
    return grouped.transformWithStateInPandas(
        statefulProcessor=CountProcessor(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Update",
        timeMode="None",
    )


#: sparkstate system -> the ``GroupedStream`` method it needs.
SPARKSTATE_METHODS = {
    "sparkstate-aipws": "applyInPandasWithState",
    "sparkstate-rows": "flatMapGroupsWithState",
    "sparkstate-processor": "transformWithState",
}


def _sparkstate_method(system: str) -> str:
    """The method name, or :class:`NotAvailable` if the engine or the operator has not landed."""
    method = SPARKSTATE_METHODS[system]
    try:
        from sparkstate.engine import GroupedStream
    except ImportError as exc:
        msg = f"the sparkstate engine is not importable ({exc})"
        raise NotAvailable(msg) from exc
    if not hasattr(GroupedStream, method):
        msg = f"sparkstate's GroupedStream has no {method}() yet (the arbitrary-state operators)"
        raise NotAvailable(msg)
    return method


def _sparkstate_plan(system: str, df: Any) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    import sparkstate as ss

    grouped: Any = ss.stream(df).groupBy("key")
    if system == "sparkstate-aipws":
        return grouped.applyInPandasWithState(
            count_pandas, OUTPUT_SCHEMA, STATE_SCHEMA, "update", GroupStateTimeout.NoTimeout
        )
    if system == "sparkstate-rows":
        # the row-based variant: applyInPandasWithState's arguments, plain rows (tuples) in
        return grouped.flatMapGroupsWithState(
            count_rows, OUTPUT_SCHEMA, STATE_SCHEMA, "update", GroupStateTimeout.NoTimeout
        )
    return grouped.transformWithState(
        statefulProcessor=CountRowsProcessor(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="update",
        timeMode="None",
        rowFormat="tuple",
    )


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``system`` in this (fresh) process and summarize it."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    ours = system.startswith("sparkstate-")
    if ours:
        _sparkstate_method(system)  # before a JVM starts
    conf = {} if ours else {PROVIDER_CONF: ROCKSDB_PROVIDER}
    started = time.perf_counter()
    spark = spark_session(f"bench-arbitrary-{system}", conf)
    session_s = time.perf_counter() - started
    try:
        df = rate_keys(spark, params["rows_per_batch"], params["keys"])
        checkpoint = os.path.join(params["workdir"], "checkpoint")
        planned = _sparkstate_plan(system, df) if ours else _spark_plan(system, df)
        writer = planned.writeStream.outputMode("update").format("noop")
        writer = writer.option("checkpointLocation", checkpoint)
        if ours:
            writer = writer.option("stateStore", "rocksdb")
        query = writer.queryName(system.replace("-", "_")).start()
        result = measure_query(spark, query, params, system, session_s)
        if ours:
            result["state_store"] = "rocksdb"
        return result
    finally:
        spark.stop()


def params_for(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes from ``--quick``; ``rows`` / ``keys`` / ``batches`` attributes override (tests)."""
    params = dict(QUICK if getattr(args, "quick", False) else FULL)
    keys = getattr(args, "keys", None) or getattr(args, "rows", None)
    if keys is not None:
        params["keys"] = params["rows_per_batch"] = int(keys)
    if getattr(args, "batches", None) is not None:
        params["batches"] = int(args.batches)
    return params


def run(args: argparse.Namespace) -> int:
    params = params_for(args)
    timeout = 600.0 if getattr(args, "quick", False) else 3600.0
    spec = BenchSpec("arbitrary", __name__, SYSTEMS, RATIO_PAIRS, params, timeout)
    return run_bench(spec, args)
