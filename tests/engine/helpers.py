"""Run the same input through sparkstate and through Spark's own operator, batch by batch."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

import sparkstate as ss
from sparkstate.engine.spark.versions import PYSPARK
from sparkstate.testing.differential import Batches as Batches
from sparkstate.testing.differential import Collector as Collector
from sparkstate.testing.differential import FileFeed as FileFeed
from sparkstate.testing.differential import normalize as normalize

from .conftest import PROVIDERS

#: The processors here go to Spark's Python processes by value (the driver's process that runs a
#: processor's ``init`` for ``transformWithState`` does not import the tests' package).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The input of the window and session cases, whose queries compute every kind of aggregate.
WIDE_SCHEMA = "k string, ts timestamp, v long, d double, s string, m decimal(10,2)"
#: The aggregates of those queries by kind, over :data:`WIDE_SCHEMA`, each spelled with ``fn``:
#: ``pyspark.sql.functions`` (Spark's query) or ``sparkstate.functions`` (ours).
AGGREGATES: dict[str, Callable[[Any], list[Any]]] = {
    "basic": lambda fn: [
        fn.count("*").alias("n"),
        fn.sum("v").alias("total"),
        fn.max("v"),
        fn.min("s"),
        fn.avg("d"),
    ],
    "first/last": lambda fn: [
        fn.first("v"),
        fn.first("s", ignorenulls=True).alias("first_s"),
        fn.last("d", ignorenulls=True).alias("last_d"),
        fn.last("s"),
    ],
    "collect": lambda fn: [fn.collect_list("s"), fn.collect_set("d").alias("ds")],
    "moments": lambda fn: [fn.stddev("d"), fn.var_pop("v")],
    "approx_count_distinct": lambda fn: [fn.approx_count_distinct("s")],
    "decimal": lambda fn: [fn.sum("m"), fn.avg("m")],
}
#: The columns whose lists are in no particular order (collect_set's), compared sorted.
SETS = ("ds",)


def aggregates(fn: Any, kinds: tuple[str, ...] = tuple(AGGREGATES)) -> list[Any]:
    """The aggregates of ``kinds`` (every kind by default), in that order."""
    return [a for kind in kinds for a in AGGREGATES[kind](fn)]


class SortedSetsCollector(Collector):
    """A :class:`Collector` that sorts the lists of the columns named in ``sets`` first: no one's
    collect_set has an order to match."""

    def __init__(self, sets: tuple[str, ...] = SETS) -> None:
        super().__init__()
        self.sets = sets

    def __call__(self, df: Any, batch_id: int) -> None:
        self.schema = df.schema
        sort = [n in self.sets for n in df.schema.names]
        rows = [
            tuple(sorted(x) if s and x is not None else x for s, x in zip(sort, r, strict=True))
            for r in df.collect()
        ]
        self.batches[batch_id] = normalize(rows)


def assert_same_as_spark(ours: Collector, theirs: Collector) -> None:
    """``ours`` delivered what ``theirs`` did, batch by batch, in the columns ours has (Spark's
    query may compute more aggregates than ours), with Spark's names and types."""
    assert ours.schema is not None and theirs.schema is not None
    names = theirs.schema.names
    keep = [names.index(n) for n in ours.schema.names]
    assert ours.schema.fields == [theirs.schema.fields[i] for i in keep]
    expected = {
        b: normalize([tuple(r[i] for i in keep) for r in rows])
        for b, rows in theirs.batches.items()
    }
    assert ours.batches == expected


PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@contextlib.contextmanager
def spark_rocksdb(spark: SparkSession, wanted: bool = True) -> Iterator[None]:
    """Spark's queries started inside use its RocksDB provider when ``wanted`` (its
    transformWithState needs it); the session's setting is restored after."""
    previous = spark.conf.get(PROVIDER_CONF, None)
    if wanted:
        spark.conf.set(PROVIDER_CONF, SPARK_ROCKSDB)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, previous)


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@contextlib.contextmanager
def shuffle_partitions(spark: SparkSession, n: int) -> Iterator[None]:
    """Spark's queries and ours started inside on ``n`` shuffle (and state) partitions; the
    session's setting is restored after."""
    previous = spark.conf.get(SHUFFLE_PARTITIONS)
    spark.conf.set(SHUFFLE_PARTITIONS, str(n))
    try:
        yield
    finally:
        spark.conf.set(SHUFFLE_PARTITIONS, previous)


def source(spark: SparkSession, feed: FileFeed, schema: str) -> DataFrame:
    """A streaming DataFrame over the feed: one file per micro-batch."""
    return feed.stream(spark, schema)


def run_batches(
    feed: FileFeed,
    query: Any,
    batches: list[list[dict[str, Any]]],
    *,
    on_batch: Callable[[int], None] | None = None,
) -> None:
    """Feed one file per batch and wait for each to be processed; stop the query at the end."""
    try:
        for i, rows in enumerate(batches):
            feed.add(rows)
            query.processAllAvailable()
            if on_batch is not None:
                on_batch(i)
    finally:
        query.stop()


def batches_to_parquet(out: Path) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each batch's rows as Parquet under ``out/batch=<id>``
    (a replayed batch's over its earlier files): update mode's rows in files, as a Spark user
    writes them, Spark's file sinks taking append mode only. Read them back with
    :func:`read_batches`."""

    def write(df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    return write


def read_batches(spark: SparkSession, out: Path, schema: str) -> list[Any]:
    """The rows :func:`batches_to_parquet` wrote under ``out``, in ``schema``'s columns."""
    names = [field.name for field in spark.createDataFrame([], schema).schema]
    return spark.read.parquet(str(out)).select(*names).collect()


def start_ours(
    stream: ss.StatefulStream,
    mode: str,
    checkpoint: Path,
    provider: str,
    collector: Collector,
    **options: str,
) -> Any:
    writer = (
        stream.writeStream.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .option("stateStore", provider)
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def start_spark(df: DataFrame, mode: str, checkpoint: Path, collector: Collector) -> Any:
    return (
        df.writeStream.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def same_schema(ours: StructType | None, theirs: StructType | None) -> bool:
    assert ours is not None and theirs is not None
    return [(f.name, f.dataType) for f in ours] == [(f.name, f.dataType) for f in theirs]


def oracle_update(
    spark: SparkSession,
    schema: str,
    batches: list[list[dict[str, Any]]],
    keys: list[str],
    aggregates: Callable[[], list[Any]],
) -> Batches:
    """Update-mode output per batch, from Spark batch queries over the rows seen so far."""
    out: Batches = {}
    seen: list[dict[str, Any]] = []
    for b, rows in enumerate(batches):
        seen += rows
        touched = {tuple(r.get(k) for k in keys) for r in rows}
        if not seen:
            out[b] = []
            continue
        df = spark.createDataFrame(seen, schema=schema)
        result = df.groupBy(*keys).agg(*aggregates()).collect()
        out[b] = normalize([r for r in result if tuple(r[k] for k in keys) in touched])
    return out


def at(seconds: int) -> str:
    """The event time ``seconds`` (under an hour) after 2024-01-01 00:00, as a file spells it."""
    return f"2024-01-01 00:{seconds // 60:02d}:{seconds % 60:02d}"


#: A stream-stream join's sides, for the tests that run one through Spark and ours.
LEFT, RIGHT = "lk string, lv long, lt timestamp", "rk string, rv long, rt timestamp"
#: Per batch, the left's file and the right's: matches, rows that wait, rows that never match.
JOIN_BATCHES: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (
        [{"lk": "a", "lv": 1, "lt": at(1)}, {"lk": "b", "lv": 2, "lt": at(5)}],
        [{"rk": "a", "rv": 10, "rt": at(2)}, {"rk": "c", "rv": 30, "rt": at(3)}],
    ),
    (
        [{"lk": "c", "lv": 3, "lt": at(6)}, {"lk": "a", "lv": 4, "lt": at(4)}],
        [{"rk": "b", "rv": 20, "rt": at(7)}, {"rk": "a", "rv": 11, "rt": at(5)}],
    ),
    (
        [{"lk": "d", "lv": 5, "lt": at(30)}, {"lk": "b", "lv": 6, "lt": at(8)}],
        [{"rk": "b", "rv": 21, "rt": at(9)}, {"rk": "d", "rv": 40, "rt": at(31)}],
    ),
    ([{"lk": "e", "lv": 7, "lt": at(60)}], [{"rk": "e", "rv": 50, "rt": at(61)}]),
]


def wide_row(
    k: str, t: int | None, v: int | None, d: float | None, s: str | None, m: float | None
) -> dict[str, Any]:
    """A row of :data:`WIDE_SCHEMA` at event time ``t`` (see :func:`at`; None: no time)."""
    return {"k": k, "ts": None if t is None else at(t), "v": v, "d": d, "s": s, "m": m}


@dataclasses.dataclass(frozen=True)
class Differential:
    """A query that Spark runs as a PySpark user writes it and sparkstate with only its input
    wrapped, over the same files: each with ``availableNow`` over the first files until it ends,
    then over all of them on the same checkpoint (a restart in the middle of the query)."""

    #: Names Spark's query: differentials of one name share Spark's result (:class:`SparkRuns`).
    name: str
    schema: str
    files: list[list[dict[str, Any]]]
    mode: str
    #: ``build(input, ours)``: Spark's query over ``input``, or (``ours``) sparkstate's.
    build: Callable[[DataFrame, bool], Any]
    #: How many files the first run reads; half of them by default.
    restart_after: int | None = None
    #: A new collector for each query: what keeps the batches it delivered.
    collector: Callable[[], Collector] = SortedSetsCollector

    def run(
        self, spark: SparkSession, tmp: Path, provider: str | None
    ) -> tuple[Collector, list[list[dict[str, Any]]]]:
        """sparkstate's query on ``provider``, or (None) Spark's own: the batches it delivered,
        and the ``stateOperators`` of each batch's progress that has them (operator 0, the
        last stateful step, first)."""
        feed = FileFeed(tmp / "input")
        collector = self.collector()
        progress: list[dict[str, Any]] = []
        first = len(self.files) // 2 if self.restart_after is None else self.restart_after
        for files in (self.files[:first], self.files[first:]):
            for rows in files:
                feed.add(rows)
            query = self.build(feed.stream(spark, self.schema), provider is not None)
            writer = query.writeStream.outputMode(self.mode).foreachBatch(collector)
            writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
            if provider is not None:
                writer = writer.option("stateStore", provider)
            handle = run_available(writer, self.name)
            progress += [p if isinstance(p, dict) else p.asDict() for p in handle.recentProgress]
        return collector, [p["stateOperators"] for p in progress if p.get("stateOperators")]


def runs(
    cases: list[Differential], on_memory: tuple[str, ...] = (), on_both: tuple[str, ...] = ()
) -> list[Any]:
    """``(case, provider)`` parameters: each case on one provider, the last one (rocksdb where
    there is one) but for the cases named in ``on_memory``, and on every provider for those in
    ``on_both``. What a case checks beyond its output mode does not depend on the provider; a
    module puts each mode on every provider once."""

    def providers(name: str) -> list[str]:
        if name in on_both:
            return PROVIDERS
        return PROVIDERS[:1] if name in on_memory else PROVIDERS[-1:]

    return [
        pytest.param(case, provider, id=f"{case.name}-{provider}")
        for case in cases
        for provider in providers(case.name)
    ]


def compat(params: list[Any], *ids: str) -> list[Any]:
    """``params`` (``pytest.param``s with ids), those of ``ids`` marked ``versions`` too: the
    compatibility suite (``scripts/compat``) runs them on each supported PySpark, the main run
    runs every one on the PySpark it has."""
    unknown = set(ids) - {p.id for p in params}
    assert not unknown, f"no such parameters: {sorted(unknown)}"
    return [
        pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.versions])
        if p.id in ids
        else p
        for p in params
    ]


class SparkRuns:
    """Spark's own result of each :class:`Differential`, run at its first use and kept (it
    depends on no provider): one a module, from a module-scoped fixture."""

    def __init__(self, spark: SparkSession, tmp: pytest.TempPathFactory) -> None:
        self.spark = spark
        self.tmp = tmp
        self.results: dict[str, tuple[Collector, list[list[dict[str, Any]]]]] = {}

    def of(self, case: Differential) -> Collector:
        return self.run(case)[0]

    def run(self, case: Differential) -> tuple[Collector, list[list[dict[str, Any]]]]:
        """Spark's result of ``case``, as :meth:`Differential.run` returns it."""
        if case.name not in self.results:
            where = self.tmp.mktemp(f"spark-{case.name}")
            self.results[case.name] = case.run(self.spark, where, None)
        return self.results[case.name]

    def check(
        self, case: Differential, tmp: Path, provider: str
    ) -> tuple[Collector, list[dict[str, Any]]]:
        """Run sparkstate's query and assert it delivered Spark's batches: what it delivered,
        and the progress of operator 0 (its last stateful step) in each batch."""
        ours, operators = self.check_all(case, tmp, provider)
        return ours, [ops[0] for ops in operators]

    def check_all(
        self, case: Differential, tmp: Path, provider: str
    ) -> tuple[Collector, list[list[dict[str, Any]]]]:
        """:meth:`check`, with the progress of every stateful operator."""
        ours, operators = case.run(self.spark, tmp, provider)
        assert_same_as_spark(ours, self.of(case))
        return ours, operators


#: Python sources take ``trigger(availableNow=True)`` from PySpark 4.2 (engine/spark/clock.py).
AVAILABLE_NOW = PYSPARK >= (4, 2)


def run_available(writer: Any, name: str) -> Any:
    """Run ``writer``'s query over the input there is, and end it: under
    ``trigger(availableNow=True)``, or, before PySpark 4.2 (where sparkstate refuses it for a
    query with batches without data), under the default trigger until ``processAllAvailable``
    returns, then stopped. Both run one batch per ``maxFilesPerTrigger`` of input and then the
    batch without data a moved watermark asks for (Spark's ``processAllAvailable`` returns once
    a trigger finds no batch to run); the differential tests run Spark's query and ours the
    same way."""
    if AVAILABLE_NOW:
        handle = writer.trigger(availableNow=True).start()
        assert handle.awaitTermination(180), f"{name} did not end"
        return handle
    handle = writer.start()
    handle.processAllAvailable()
    handle.stop()
    return handle


class Counts:
    """A ``StatefulProcessor`` that counts each key's rows in a value state (with a TTL where
    ``ttl_ms`` is set)."""

    ttl_ms: int | None = None

    def init(self, handle: Any) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        schema = StructType([StructField("n", LongType())])
        self.count = handle.getValueState("count", schema, self.ttl_ms)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802, N803
        import pandas as pd

        n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(p) for p in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        pass


def counted_in_a_processor(df: Any, ttl_ms: int | None = None, time_mode: str = "None") -> Any:
    """``groupBy("k")`` counted by :class:`Counts` in ``transformWithStateInPandas``."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    processor = type("CountsProcessor", (Counts, StatefulProcessor), {"ttl_ms": ttl_ms})()
    return df.groupBy("k").transformWithStateInPandas(
        processor, "k string, n long", "update", time_mode
    )
