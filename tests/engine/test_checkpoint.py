"""What users do to checkpoints: roll Spark's last batch back, replay it, move the checkpoint.

The rollback cases are differential: the PySpark query as written runs on Spark's own state
store, the same query with ``ss.stream(...)`` around its input runs on sparkstate, and both go
through the same deletions in the Spark checkpoint and the same restarts. The count per user
goes through a replay and then a rollback in one sequence of runs, on every provider (each
loads an older version than the last it committed); the file sink's rollback runs on RocksDB.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.state import GroupStateTimeout

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError, CorruptStateFileError, UserFunctionError
from sparkstate.testing import Collector, FileFeed, normalize

from .conftest import PROVIDERS

# The user functions are shipped to the Python workers by value (they cannot import this module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, ts timestamp, v long"
FIRST = 4  # files of the first run: batches 0..3


def rows(i: int) -> list[dict[str, Any]]:
    """File ``i``: two rows for each of three users."""
    return [
        {"k": f"u{j}", "ts": f"2024-01-01 00:{i:02d}:00", "v": i * 10 + r}
        for j in range(3)
        for r in range(2)
    ]


class Deliveries(Collector):
    """Keeps every delivery in order too, replays included."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, list[tuple[Any, ...]]]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        super().__call__(df, batch_id)
        self.log.append((batch_id, self.batches[batch_id]))


def delete_spark_files(checkpoint: Path, *names: str) -> None:
    """Delete files of Spark's checkpoint with their ``.crc`` companions."""
    for name in names:
        folder, file = name.split("/")
        (checkpoint / folder / file).unlink()
        (checkpoint / folder / f".{file}.crc").unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class Step:
    """What the user does to the Spark checkpoint before a run."""

    name: str
    #: Files of Spark's checkpoint deleted.
    deleted: tuple[str, ...]
    #: Files added after the deletion.
    added: int


REPLAY = Step("replay", ("commits/3",), added=0)
ROLLBACK = Step("rollback", ("offsets/3", "commits/3"), added=2)
MORE = Step("more input", (), added=2)


def run_scenario(
    spark: SparkSession,
    tmp: Path,
    build: Callable[[DataFrame], Any],
    steps: tuple[Step, ...],
    provider: str | None,
    sink: Callable[[Any], Any],
) -> None:
    """A first run over 4 files (batches 0..3), then for each step its deletions, its new files
    and another run."""
    feed = FileFeed(tmp / "input")
    checkpoint = tmp / "checkpoint"
    for i in range(FIRST):
        feed.add(rows(i))
    for run, step in enumerate((None, *steps)):
        if step is not None:
            delete_spark_files(checkpoint, *step.deleted)
            for _ in range(step.added):
                feed.add(rows(feed.count))
        writer = sink(build(feed.stream(spark, SCHEMA)).writeStream)
        writer = writer.option("checkpointLocation", str(checkpoint))
        if provider is not None:
            writer = writer.option("stateStore", provider)
        handle = writer.trigger(availableNow=True).start()
        what = "the first run" if step is None else f"the run after {step.name}"
        assert handle.awaitTermination(180), f"{what} ({run}) did not end"


def count_per_user(df: DataFrame) -> Any:
    return df.groupBy("k").count()


#: The count per user goes through a replay, a rollback, and goes on after them.
COUNT_STEPS = (REPLAY, ROLLBACK, MORE)


@pytest.fixture(scope="module")
def spark_counts(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Deliveries:
    collector = Deliveries()
    run_scenario(
        spark,
        tmp_path_factory.mktemp("spark-counts"),
        count_per_user,
        COUNT_STEPS,
        None,
        lambda w: w.outputMode("update").foreachBatch(collector),
    )
    return collector


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rolled_back_batch_runs_again_as_in_spark(
    spark: SparkSession, spark_counts: Deliveries, tmp_path: Path, provider: str
) -> None:
    """Deleting Spark's ``commits/3`` alone: Spark runs batch 3 again with the same input, and
    nothing is counted twice. Then deleting ``offsets/3`` and ``commits/3`` and adding files:
    Spark plans batch 3 again with the new input and counts from the state before it. Both
    load an older version than the last one committed: each provider does."""
    ours = Deliveries()
    run_scenario(
        spark,
        tmp_path,
        lambda df: count_per_user(ss.stream(df)),
        COUNT_STEPS,
        provider,
        lambda w: w.outputMode("update").foreachBatch(ours),
    )
    assert ours.log == spark_counts.log
    replayed = [b for b, _ in ours.log].count(3)
    assert replayed == 3  # the first run's batch 3, its replay, the rolled back one
    final = 2 * (FIRST + sum(step.added for step in COUNT_STEPS))  # two rows per user a file
    assert ours.batches[max(ours.batches)] == [(f"u{j}", final) for j in range(3)]


def test_rolled_back_file_sink_keeps_what_spark_keeps(spark: SparkSession, tmp_path: Path) -> None:
    """A file sink holds the files of batch 3 from before the rollback; Spark's file sink writes
    nothing for a batch it committed, so the rows only the new batch 3 emits never reach it.
    Ours keeps the same files, while the state has the rows (they are not emitted again)."""
    results = {}
    for name, build, provider in (
        ("spark", lambda df: df.dropDuplicates(["k", "v"]), None),
        ("ours", lambda df: ss.stream(df).dropDuplicates(["k", "v"]), "rocksdb"),
    ):
        out = tmp_path / name / "out"
        run_scenario(
            spark,
            tmp_path / name,
            build,
            (ROLLBACK, MORE),
            provider if provider in PROVIDERS else "memory",
            lambda w, out=out: w.outputMode("append").format("parquet").option("path", str(out)),
        )
        results[name] = normalize(spark.read.parquet(str(out)).select("k", "v").collect())
    assert results["ours"] == results["spark"]
    seen = {v // 10 for _, v in results["ours"]}
    assert seen == {0, 1, 2, 3, 5, 6, 7}  # file 4 went into the new batch 3, as in Spark


def run_count(spark: SparkSession, feed: FileFeed, location: str, **options: str) -> Deliveries:
    """One availableNow run of a count per user on ``location``; what it delivered."""
    collector = Deliveries()
    counted = count_per_user(ss.stream(feed.stream(spark, SCHEMA)))
    writer = counted.writeStream.outputMode("update").foreachBatch(collector)
    writer = writer.option("checkpointLocation", location).option("stateStore", "rocksdb")
    for k, v in options.items():
        writer = writer.option(k, v)
    handle = writer.trigger(availableNow=True).start()
    assert handle.awaitTermination(180)
    return collector


def last_counts(collector: Deliveries) -> list[tuple[Any, ...]]:
    return collector.batches[max(collector.batches)]


def counts(files: int) -> list[tuple[Any, ...]]:
    return [(f"u{j}", 2 * files) for j in range(3)]


@pytest.mark.skipif("rocksdb" not in PROVIDERS, reason="needs the rocksdb provider")
def test_one_checkpoint_however_spelled_wherever_moved(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run adds a file and gives the checkpoint another spelling; each continues the
    counts. The first spelling is relative: the JVM resolves a relative path against its own
    working directory, which Python's ``os.chdir`` does not move, and Spark's files and
    sparkstate's must still land together. Then the checkpoint is moved, and copied: each copy
    runs on at its place."""
    feed = FileFeed(tmp_path / "input")
    folder = f"dir-{os.getpid()}"
    chk = tmp_path / folder / "chk"
    chk.parent.mkdir()
    (tmp_path / "link").symlink_to(chk.parent)
    jvm_cwd = Path(os.getcwd())
    monkeypatch.chdir(tmp_path)
    spellings = [
        f"{folder}/chk",
        str(chk),
        f"file://{chk}",
        f"file:{chk}/",
        f"{tmp_path}/./{folder}/../{folder}/chk",
        f"{tmp_path}/link/chk",
    ]
    try:
        for n, location in enumerate(spellings, start=1):
            feed.add(rows(feed.count))
            assert last_counts(run_count(spark, feed, location)) == counts(n), location
            if n == 1:
                assert (chk / "offsets" / "0").exists()
                assert (chk / "sparkstate" / "commits" / "0.json").exists()
                assert not (jvm_cwd / folder).exists()
    finally:
        shutil.rmtree(jvm_cwd / folder, ignore_errors=True)
    files = len(spellings)

    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(str(chk), str(moved))
    feed.add(rows(feed.count))
    assert last_counts(run_count(spark, feed, str(moved))) == counts(files + 1)
    assert not chk.exists()  # nothing recreated at the old place

    copy = tmp_path / "copy"
    shutil.copytree(moved, copy, symlinks=True)
    feed.add(rows(feed.count))
    assert last_counts(run_count(spark, feed, str(moved))) == counts(files + 2)
    assert last_counts(run_count(spark, feed, str(copy))) == counts(files + 2)

    # Versions before this one recorded the state's absolute place even when it was the
    # checkpoint's own: such a checkpoint, moved, runs at its new place too.
    metadata = copy / "sparkstate" / "metadata.json"
    legacy = {**json.loads(metadata.read_text()), "state_location": f"{chk}/sparkstate"}
    metadata.write_text(json.dumps(legacy))
    feed.add(rows(feed.count))
    assert last_counts(run_count(spark, feed, str(copy))) == counts(files + 3)
    assert json.loads(metadata.read_text())["state_location"] is None


def test_bad_checkpoint_locations_fail_at_start(spark: SparkSession, tmp_path: Path) -> None:
    feed = FileFeed(tmp_path / "input")
    feed.add(rows(0))
    a_file = tmp_path / "a-file"
    a_file.write_text("not a checkpoint")
    with pytest.raises(ConfigurationError, match=f"{a_file} is a file"):
        run_count(spark, feed, str(a_file))
    with pytest.raises(
        ConfigurationError, match=f"cannot write to checkpointLocation {a_file}/chk"
    ):
        run_count(spark, feed, f"{a_file}/chk")
    with pytest.raises(ConfigurationError, match="host 'otherhost'"):
        run_count(spark, feed, "file://otherhost/chk")
    assert not spark.streams.active


def test_handle_ids_are_sparks(spark: SparkSession, tmp_path: Path) -> None:
    """The handle's id is the one Spark runs the query under, at the first start and after."""
    feed = FileFeed(tmp_path / "input")
    feed.add(rows(0))
    ids = set()
    for run in range(2):
        if run:
            feed.add(rows(1))
        counted = count_per_user(ss.stream(feed.stream(spark, SCHEMA)))
        writer = counted.writeStream.outputMode("update").format("memory").queryName("ids")
        handle = writer.option("checkpointLocation", str(tmp_path / "chk")).start()
        try:
            handle.processAllAvailable()
            assert spark.streams.get(handle.id) is not None
            assert str(spark.streams.get(handle.id).id) == handle.id
            assert handle.runId == str(handle.spark_query.runId)
            progress = handle.lastProgress
            assert progress is not None
            assert (progress["id"], progress["runId"]) == (handle.id, handle.runId)
            ids.add(handle.id)
        finally:
            handle.stop()
    assert len(ids) == 1


def fails_on_b(key: Any, pdfs: Any, state: Any) -> Any:
    """Counts a key's rows, and raises on key ``u1`` of the second file."""
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        if key[0] == "u1" and (pdf["v"] >= 10).any():
            msg = "no rows of file 1 for u1, please"
            raise ValueError(msg)
        n += len(pdf)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def test_user_function_error_surfaces_first(spark: SparkSession, tmp_path: Path) -> None:
    feed = FileFeed(tmp_path / "input")
    feed.add(rows(0))
    feed.add(rows(1))
    grouped = ss.stream(feed.stream(spark, SCHEMA)).groupBy("k")
    counted = grouped.applyInPandasWithState(
        fails_on_b, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout
    )
    writer = counted.writeStream.outputMode("update").format("noop")
    handle = writer.option("checkpointLocation", str(tmp_path / "chk")).start()
    with pytest.raises(UserFunctionError) as info:
        handle.awaitTermination(120)
    error = info.value
    lines = str(error).splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[2].strip() == "raise ValueError(msg)"
    assert lines[3] == "ValueError: no rows of file 1 for u1, please"
    assert "applyInPandasWithState function for key ('u1',)" in lines[4]
    assert "sparkstate/" not in str(error)  # the user's frames only
    assert isinstance(error.__cause__, ValueError)  # the user's exception itself
    assert isinstance(error, StreamingQueryException)  # what a ported query catches
    assert "FOREACH_BATCH_USER_FUNCTION_ERROR" in str(error.spark_exception)  # type: ignore[attr-defined]
    # Spark's condition of a failed query, and its parameters, the message ours
    assert (error.getCondition(), error.getSqlState()) == ("STREAM_FAILED", "XXKST")
    parameters = error.getMessageParameters()
    assert parameters == {"id": str(handle.id), "runId": str(handle.runId), "message": str(error)}
    assert isinstance(handle.exception(), UserFunctionError)
    assert str(handle.exception()) == str(error)

    # The same in a foreachBatch function, which runs in this process.
    def sink(df: DataFrame, batch_id: int) -> None:
        msg = f"nothing for batch {batch_id}"
        raise KeyError(msg)

    counted = ss.stream(feed.stream(spark, SCHEMA)).groupBy("k").count()
    writer = counted.writeStream.outputMode("update").foreachBatch(sink)
    handle = writer.option("checkpointLocation", str(tmp_path / "chk2")).start()
    with pytest.raises(UserFunctionError) as info:
        handle.awaitTermination(120)
    assert str(info.value).splitlines()[0] == "Traceback (most recent call last):"
    assert "KeyError: 'nothing for batch 0'" in str(info.value)
    assert "the foreachBatch function in batch 0" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_corrupt_state_file_surfaces_as_itself(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    """A state file damaged in a copy of the checkpoint (read from its files: no worker holds
    the copy's state): the query fails with the store's error naming the file."""
    feed = FileFeed(tmp_path / "input")
    feed.add(rows(0))
    run_count(spark, feed, str(tmp_path / "chk"), stateStore=provider)
    shutil.copytree(tmp_path / "chk", tmp_path / "copy")
    state = tmp_path / "copy" / "sparkstate" / "state"
    for snapshot in state.rglob("1_*.snapshot*"):  # written at stop: the load must replay
        snapshot.unlink()
    damaged = max((p for p in state.rglob("1_*") if p.stat().st_size > 0), key=str)
    damaged.write_bytes(damaged.read_bytes()[:-7])
    feed.add(rows(1))
    with pytest.raises(CorruptStateFileError) as info:
        run_count(spark, feed, str(tmp_path / "copy"), stateStore=provider)
    first = str(info.value).splitlines()[0]
    assert str(damaged) in first
    assert isinstance(info.value, StreamingQueryException)


def test_deleted_spark_logs_refused_as_spark_refuses(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's ``offsets/`` and ``commits/`` deleted together: Spark refuses to plan batch 0 over
    state that is not empty, and so does the wrapped query, instead of handing the sink batch ids
    it has seen."""
    for wrapped in (False, True):
        feed = FileFeed(tmp_path / f"input-{wrapped}")
        feed.add(rows(0))
        checkpoint = tmp_path / f"checkpoint-{wrapped}"

        def run(wrapped: bool = wrapped, feed: FileFeed = feed, chk: Path = checkpoint) -> Any:
            df = feed.stream(spark, SCHEMA)
            counted = count_per_user(ss.stream(df) if wrapped else df)
            writer = counted.writeStream.outputMode("update").foreachBatch(Deliveries())
            handle = writer.option("checkpointLocation", str(chk)).trigger(availableNow=True)
            return handle.start()

        assert run().awaitTermination(180)
        shutil.rmtree(checkpoint / "offsets")
        shutil.rmtree(checkpoint / "commits")
        with pytest.raises(
            (ConfigurationError, StreamingQueryException),
            match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY",
        ):
            run().awaitTermination(180)
    assert not spark.streams.active


def test_misconfigured_checkpoint_messages(spark: SparkSession, tmp_path: Path) -> None:
    feed = FileFeed(tmp_path / "input")
    feed.add(rows(0))
    with pytest.raises(ConfigurationError, match="option numPartitions must be a whole number"):
        run_count(spark, feed, str(tmp_path / "a"), numPartitions="abc")
    with pytest.raises(ConfigurationError, match="option numPartitions .* got '0'"):
        run_count(spark, feed, str(tmp_path / "a"), numPartitions="0")
    run_count(spark, feed, str(tmp_path / "b"))
    shutil.rmtree(tmp_path / "b" / "sparkstate")
    with pytest.raises(ConfigurationError, match="was deleted"):
        run_count(spark, feed, str(tmp_path / "b"))
    assert not spark.streams.active
