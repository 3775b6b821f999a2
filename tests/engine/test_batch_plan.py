"""A classic session's plan, made once per run: each stage's task function pickled at the run's
first batch only, the stages' DataFrame rebuilt over each later batch, the batch told to the
tasks by the payload the driver sets on the foreachBatch thread; through a restart and the
replay of a committed batch, the output is Spark's own query's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import udf as spark_udf

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.run import batch_job
from sparkstate.engine.run.batch_payload import encode, spec_in_batch
from sparkstate.exceptions import QueryError
from sparkstate.operators.dedup import Deduplicate
from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.providers import StoreSettings
from sparkstate.runtime.tasks import TaskSpec
from sparkstate.store import StoreConf
from sparkstate.testing import Collector, FileFeed

from .conftest import PROVIDERS
from .helpers import run_batches, start_ours, start_spark

SCHEMA = "k string, ts timestamp"


def rows(i: int) -> list[dict[str, Any]]:
    """Batch ``i``: three rows 4 s apart from ``10 i`` s on, over two keys (a late one from the
    third batch on)."""
    base = 10 * i
    out = [{"k": f"k{j % 2}", "ts": f"2024-01-01T00:00:{base + 4 * j:02d}"} for j in range(3)]
    if i >= 2:
        out.append({"k": "k0", "ts": f"2024-01-01T00:00:{base - 18:02d}"})
    return out


def windowed(df: DataFrame, ours: bool) -> Any:
    df = df.withWatermark("ts", "5 seconds")
    if ours:
        return ss.stream(df).groupBy(SF.window("ts", "10 seconds"), "k").count()
    return df.groupBy(F.window("ts", "10 seconds"), "k").count()


@pytest.fixture
def pickled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the stateful task functions PySpark pickles, as it makes each UDF."""
    names: list[str] = []
    wrap = spark_udf._wrap_function

    def counting(sc: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(func, "__qualname__", "")
        if name.startswith("task_function"):
            names.append(name.split(".")[0])
        return wrap(sc, func, *args, **kwargs)

    monkeypatch.setattr(spark_udf, "_wrap_function", counting)
    return names


def run_three_times(
    spark: SparkSession,
    feed: FileFeed,
    chk: Path,
    start: Callable[[Path, Collector], Any],
    on_run: Callable[[], None] = lambda: None,
) -> Collector:
    """Two batches, a restart and a third, then a restart that replays the third (Spark's
    commit of it deleted) before a fourth."""
    feed.reset()
    collector = Collector()
    run_batches(feed, start(chk, collector), [rows(0), rows(1)])
    on_run()
    run_batches(feed, start(chk, collector), [rows(2)])
    on_run()
    last = max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (chk / "commits" / name).unlink()  # Spark's commit log only: its batch runs again
    run_batches(feed, start(chk, collector), [rows(3)])
    on_run()
    return collector


@pytest.mark.versions
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_run_pickles_its_task_function_once_and_outputs_what_spark_does(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, pickled: list[str]
) -> None:
    def ours(chk: Path, collector: Collector) -> Any:
        stream = windowed(feed.stream(spark, SCHEMA), ours=True)
        return start_ours(stream, "update", chk, provider, collector)

    def theirs(chk: Path, collector: Collector) -> Any:
        return start_spark(
            windowed(feed.stream(spark, SCHEMA), ours=False), "update", chk, collector
        )

    per_run: list[int] = []
    got = run_three_times(
        spark, feed, tmp_path / "ours", ours, lambda: per_run.append(len(pickled))
    )
    expected = run_three_times(spark, feed, tmp_path / "spark", theirs)
    assert got.batches == expected.batches
    assert len(got.batches) >= 4
    # One task function per run (of three), made for every batch of the run, the replay too.
    assert per_run == [1, 2, 3]
    assert set(pickled) == {"task_function_of_run"}


def test_a_batch_plan_is_rebuilt_over_each_batch(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the run's first batch, the stages' DataFrame is the recorded plan over the batch
    (no stage builds its input again)."""
    built: list[int] = []
    shuffled = batch_job.Stage.shuffled

    def counting(self: Any, source: Any, batch_id: int, n: int) -> Any:
        built.append(batch_id)
        return shuffled(self, source, batch_id, n)

    monkeypatch.setattr(batch_job.Stage, "shuffled", counting)
    collector = Collector()
    stream = windowed(feed.stream(spark, SCHEMA), ours=True)
    query = start_ours(stream, "update", tmp_path / "chk", "memory", collector)
    run_batches(feed, query, [rows(i) for i in range(3)])
    assert len(collector.batches) >= 3
    assert built == [0]


SPEC = TaskSpec(
    op_id=0,
    operator=Deduplicate(pa.schema([("k", pa.string())]), ["k"]),
    batch_id=0,
    output_mode="append",
    watermark_ms=0,
    batch_timestamp_ms=0,
    num_partitions=2,
    store=StoreSettings("/tmp/nowhere", "memory", StoreConf()),
    lineage={},
    run="r1",
)


def test_a_task_reads_its_batch_from_the_payload() -> None:
    batch = dataclasses.replace(
        SPEC,
        batch_id=7,
        watermark_ms=5,
        late_watermark_ms=2,
        batch_timestamp_ms=9,
        lineage={1: "c1", 0: None},
        replay=True,
        owners={1: "h:1/2"},
    )
    payload = encode("r1", 7, {0: batch}, ReportDir("file:///tmp/reports/7"))
    spec, reports = spec_in_batch(SPEC, payload, "7")
    assert spec == batch
    assert reports.uri == "file:///tmp/reports/7"
    assert spec_in_batch(SPEC, payload, None)[0] == batch  # outside a micro-batch


@pytest.mark.parametrize(
    ("payload", "spark_batch", "error"),
    [
        (None, "7", "found no 'sparkstate.batch' local property"),
        (encode("r2", 7, {0: SPEC}, ReportDir("x")), "7", "of another query or run"),
        (encode("r1", 7, {1: SPEC}, ReportDir("x")), "7", "of another query or run"),
        (encode("r1", 6, {0: SPEC}, ReportDir("x")), "7", "batch 6 in a job of Spark's batch 7"),
    ],
)
def test_a_task_without_its_batch_payload_fails(
    payload: str | None, spark_batch: str, error: str
) -> None:
    with pytest.raises(QueryError, match=error):
        spec_in_batch(SPEC, payload, spark_batch)
