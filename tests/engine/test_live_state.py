"""Reading a running query's state live (``ss.state``): from the state homes that hold it while
the query runs, from the checkpoint where none does; always the state after one committed
batch, equal to what the state reader reads from the checkpoint for that batch."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.key_lookup import plain
from sparkstate.observe.live import LiveState
from sparkstate.observe.reader import ReadRequest, StateReader
from sparkstate.runtime.home_channel import NO_CREDENTIALS
from sparkstate.runtime.home_client import connect_owner
from sparkstate.runtime.home_reads import HomeReader

from .conftest import PARTITIONS, PROVIDERS, FileFeed
from .helpers import source
from .test_state_home import homes, jvm_pid

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v int"
KEYS = [f"k{i}" for i in range(13)]
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": f"k{(i * 7) % 13}", "v": i} for i in range(5 * b, 40 + 10 * b)] for b in range(5)
]


def start(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, **options: str
) -> Any:
    return (
        ss.stream(source(spark, feed, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
        .option("stateStore.state_home", "true")
        .options(**options)
        .start()
    )


def offline(location: Path, batch_id: int) -> dict[str, Any]:
    """The state after ``batch_id`` as the state reader reads it from the checkpoint."""
    reader = StateReader(ReadRequest.from_options({"path": str(location), "batchId": batch_id}))
    out: dict[str, Any] = {}
    for p in range(reader.num_partitions):
        for batch in reader.read(p):
            for row in batch.to_pylist():
                out[row["key"]["k"]] = row["value"]
    return out


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reads_equal_the_state_reader_while_the_query_runs_and_after(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    chk = tmp_path / "chk"
    q = start(spark, feed, tmp_path, provider)
    try:
        feed.add(BATCHES[0])
        q.processAllAvailable()
        live = ss.state(q)
        for b, rows in enumerate(BATCHES[1:], start=1):
            feed.add(rows)
            q.processAllAvailable()
            found = live.get_many(KEYS)
            assert {f.batch_id for f in found} == {b}
            assert {f.source for f in found} == {"home"}, found
            assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, b)
    finally:
        q.stop()
    last = offline(chk, len(BATCHES) - 1)
    # Stopped, the homes keep the last batch's state a while: it still answers, the same.
    found = live.get_many(KEYS)
    assert {f.key["k"]: f.value for f in found if f.found} == last
    # With the homes killed, the same reads come from the checkpoint.
    for pid in homes(jvm_pid(spark)):
        os.kill(pid, signal.SIGKILL)
    found = live.get_many(KEYS)
    assert {f.source for f in found} == {"checkpoint"}
    assert {f.key["k"]: f.value for f in found if f.found} == last
    assert [f.key["k"] for f in live.scan()] and {f.key["k"]: f.value for f in live.scan()} == last
    live.close()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_reader_of_the_checkpoint_restores_each_partition_once_and_follows_by_changelogs(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    """A reader that reaches no home follows a running query from its checkpoint: each batch's
    answers equal the state reader's, and a partition is restored from the durable files
    once, then brought to each later batch by that batch's changes, not restored again."""
    chk = tmp_path / "chk"
    q = start(spark, feed, tmp_path, provider)
    try:
        feed.add(BATCHES[0])
        q.processAllAvailable()
        with LiveState(str(chk), connector=lambda address: None) as live:
            for b, rows in enumerate(BATCHES[1:], start=1):
                feed.add(rows)
                q.processAllAvailable()
                assert live.refresh()
                found = live.get_many(KEYS)
                assert {f.source for f in found} == {"checkpoint"}
                assert {f.batch_id for f in found} == {b}
                assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, b)
            partitions = len({f.partition for f in found})
            assert live.checkpoint_loads == {
                "restored": partitions,
                "caught_up": partitions * (len(BATCHES) - 2),
            }
    finally:
        q.stop()


#: The state partitions a rescale moves the module's queries to (the session has another count).
RESCALED = 5
#: The partitions of a restart that rescales in place after it.
IN_PLACE = 3


def spark_partitions(spark: SparkSession, keys: list[str], n: int) -> dict[str, int]:
    """Each key's partition among ``n`` by Spark's own hash, as its shuffle sends it."""
    df = spark.createDataFrame([(k,) for k in keys], "k string")
    return {r.k: r.p for r in df.select("k", F.expr(f"pmod(hash(k), {n}) AS p")).collect()}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reads_equal_the_state_reader_across_a_rescale(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    """A reader opened before a rescale (``ss.repartition`` of the stopped query), one that
    reads the checkpoint alone and one opened after it: each reads the rescale's batch in the
    new partitions, each key in the one Spark's hash sends it to, then the restarted query's
    batches (from its homes, but the checkpoint's reader), equal to the state reader's."""
    chk = tmp_path / "chk"
    q = start(spark, feed, tmp_path, provider)
    try:
        for rows in BATCHES[:2]:
            feed.add(rows)
            q.processAllAvailable()
        live = ss.state(q)
        follower = LiveState(str(chk), connector=lambda address: None)
        for reader in (live, follower):
            found = reader.get_many(KEYS)
            assert {f.batch_id for f in found} == {1}
            assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, 1)
    finally:
        q.stop()
    rescale = ss.repartition(spark, str(chk), RESCALED)
    assert rescale == 2
    want = offline(chk, rescale)
    assert want == offline(chk, 1)
    routed = spark_partitions(spark, KEYS, RESCALED)
    with ss.state(str(chk)) as fresh:
        for reader in (live, follower, fresh):
            found = reader.get_many(KEYS)
            assert {f.batch_id for f in found} == {rescale}
            assert {f.source for f in found} == {"checkpoint"}  # (its commit names no home)
            assert {f.key["k"]: f.value for f in found if f.found} == want
            assert {f.key["k"]: f.partition for f in found} == routed
            assert {f.key["k"]: f.value for f in reader.scan()} == want
        q = start(spark, feed, tmp_path, provider)  # the rescaled count kept: no rescale again
        try:
            for b, rows in enumerate(BATCHES[2:], start=rescale + 1):
                feed.add(rows)
                q.processAllAvailable()
                for reader in (live, follower, fresh):
                    found = reader.get_many(KEYS)
                    assert {f.batch_id for f in found} == {b}
                    where = "checkpoint" if reader is follower else "home"
                    assert {f.source for f in found} == {where}
                    assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, b)
                    assert {f.key["k"]: f.partition for f in found} == routed
        finally:
            q.stop()
        # The follower has counted its loads (below); the others read on across a restart
        # that rescales in place: the last batch, rewritten, is read in its new partitions.
        last = rescale + len(BATCHES) - 2
        q = start(spark, feed, tmp_path, provider, numPartitions=str(IN_PLACE))
        try:
            for reader in (live, fresh):
                found = reader.get_many(KEYS)
                assert {f.batch_id for f in found} == {last}
                assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, last)
                assert {f.key["k"]: f.partition for f in found} == spark_partitions(
                    spark, KEYS, IN_PLACE
                )
        finally:
            q.stop()
    # The reader of the checkpoint restored every new partition (those it kept from before the
    # rescale too: their state moved), then followed each by its changes.
    assert follower.checkpoint_loads == {
        "restored": PARTITIONS + RESCALED,
        "caught_up": RESCALED * (len(BATCHES) - 2),
    }
    live.close()
    follower.close()


def kill_homes(spark: SparkSession) -> None:
    for pid in homes(jvm_pid(spark)):
        os.kill(pid, signal.SIGKILL)


def test_a_read_during_batches_sees_one_committed_batch_whole_across_a_home_killed(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """A reader reads all the time while batches run: every answer is the state after the
    batch it names, as the state reader reads that batch from the checkpoint (never part of a
    batch); with the homes killed between batches, reads come from the checkpoint until the
    next batch puts the partitions in homes again."""
    chk = tmp_path / "chk"
    q = start(spark, feed, tmp_path, "rocksdb")
    seen: list[tuple[int, dict[str, Any], set[str]]] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with ss.state(str(chk)) as live:
                while not done.is_set():
                    found = live.get_many(KEYS)
                    assert len({f.batch_id for f in found}) == 1
                    values = {f.key["k"]: f.value for f in found if f.found}
                    seen.append((found[0].batch_id, values, {f.source for f in found}))
        except BaseException as exc:  # noqa: BLE001 - failed below
            errors.append(exc)

    try:
        feed.add(BATCHES[0])
        q.processAllAvailable()
        reader = threading.Thread(target=read)
        reader.start()
        for rows in BATCHES[1:3]:
            feed.add(rows)
            q.processAllAvailable()
        kill_homes(spark)
        with ss.state(q) as live:
            found = live.get_many(KEYS)
            assert {f.source for f in found} == {"checkpoint"}
            assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, 2)
            for rows in BATCHES[3:]:
                feed.add(rows)
                q.processAllAvailable()
            found = live.get_many(KEYS)
            assert {f.source for f in found} == {"home"}
            assert found[0].batch_id == len(BATCHES) - 1
    finally:
        done.set()
        q.stop()
    reader.join()
    assert not errors, errors
    batches = {b for b, _, _ in seen}
    assert len(batches) >= 3, batches
    want = {b: offline(chk, b) for b in batches}
    assert all(values == want[b] for b, values, _ in seen)
    assert any(sources == {"home"} for _, _, sources in seen)


class HeldReader:
    """A home reader whose first request waits until let go, and which counts the keys of
    each request it carries."""

    def __init__(self, reader: HomeReader, let_go: threading.Event, sizes: list[int]) -> None:
        self._reader, self._let_go, self._sizes = reader, let_go, sizes

    def send(self, header: dict[str, Any], blobs: list[bytes | None]) -> int:
        self._let_go.wait(timeout=60)
        self._sizes.append(len(blobs))
        return self._reader.send(header, blobs)

    def send_many(self, requests: list[tuple[dict[str, Any], list[bytes | None]]]) -> int:
        return sum(self.send(header, blobs) for header, blobs in requests)

    def receive(self) -> Any:
        return self._reader.receive()

    def request(self, header: dict[str, Any], blobs: list[bytes | None]) -> Any:
        self.send(header, blobs)
        return self.receive()

    def close(self) -> None:
        self._reader.close()


def test_point_reads_from_many_threads_at_once_are_answered_together(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """A reader shared by threads, as a web service's handlers share one: point reads asked
    while another is in flight go to the homes together, one request a partition, and each
    thread gets its own key's state; a key that does not fit fails in its own thread only."""
    chk = tmp_path / "chk"
    q = start(spark, feed, tmp_path, "rocksdb")
    let_go, sizes = threading.Event(), []

    def connect(address: str) -> HeldReader | None:
        channel = connect_owner(address, NO_CREDENTIALS)
        return None if channel is None else HeldReader(HomeReader(channel), let_go, sizes)

    try:
        for rows in BATCHES[:2]:
            feed.add(rows)
            q.processAllAvailable()
        want = offline(chk, 1)
        answers: dict[Any, Any] = {}
        with LiveState(str(chk), connector=connect) as live:

            def ask(key: Any) -> None:
                try:
                    answers[key] = live.get(key)
                except ConfigurationError as exc:
                    answers[key] = exc

            first = threading.Thread(target=ask, args=(KEYS[0],))
            first.start()
            while not live._answering:  # the first read is in flight, held
                time.sleep(0.01)
            rest = [threading.Thread(target=ask, args=(k,)) for k in [*KEYS[1:], 13]]
            for t in rest:
                t.start()
            deadline = time.monotonic() + 30
            while len(live._waiting) < len(rest) and time.monotonic() < deadline:
                time.sleep(0.01)
            let_go.set()
            for t in [first, *rest]:
                t.join(timeout=60)
        assert isinstance(answers.pop(13), ConfigurationError)  # an int for a string key
        assert {k: f.value for k, f in answers.items() if f.found} == want
        assert {f.source for f in answers.values()} == {"home"}
        assert {f.batch_id for f in answers.values()} == {1}
        # The keys were asked for together, one request a partition: several in some.
        assert max(sizes) > 1, sizes

        # The same from asyncio tasks sharing the reader (``aget``), the loop never blocked.
        let_go, sizes = threading.Event(), []
        with LiveState(str(chk), connector=connect) as live:
            got, ticks = asyncio.run(awaited_reads(live, let_go))
        assert isinstance(got.pop(13), ConfigurationError)
        assert isinstance(got.pop(KEYS[1]), asyncio.CancelledError)  # cancelled while waiting
        want.pop(KEYS[1], None)
        assert {k: f.value for k, f in got.items() if f.found} == want
        assert {f.source for f in got.values()} == {"home"}
        assert {f.batch_id for f in got.values()} == {1}
        assert max(sizes) > 1, sizes
        assert ticks >= 10, ticks  # the loop ran on while the first read was held
    finally:
        q.stop()


async def awaited_reads(live: LiveState, let_go: threading.Event) -> tuple[dict[Any, Any], int]:
    """Point reads awaited by tasks of one loop: the first held in flight, the rest awaited
    meanwhile (one of them cancelled); each task's answer, and how often a task of the loop ran
    while the first read was held."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while not let_go.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    first = asyncio.ensure_future(live.aget(KEYS[0]))
    await asyncio.sleep(0.3)  # the first read is in flight, held
    asked = [KEYS[0], *KEYS[1:], 13]
    rest = [asyncio.ensure_future(live.aget(k)) for k in asked[1:]]
    await asyncio.sleep(0.1)
    rest[0].cancel()
    await asyncio.sleep(0.1)
    let_go.set()
    answers = await asyncio.gather(first, *rest, return_exceptions=True)
    await ticker
    return dict(zip(asked, answers, strict=True)), ticks


class Keeper(StatefulProcessor):  # type: ignore[misc]
    """A value, a list and a map variable per key."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getListState("seen", "v int")
        self.named = handle.getMapState("named", "name string", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:  # noqa: N802, N803
        vs = [int(v) for pdf in rows for v in pdf["v"]]
        n = (self.count.get() or (0,))[0] + len(vs)
        self.count.update((n,))
        self.seen.appendList([(v,) for v in vs[:3]])
        self.named.updateValue((f"x{len(vs) % 3}",), (n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        pass


SHAPES = {
    "window": lambda df: (
        df.withWatermark("ts", "1 hour")
        .groupBy(F.window("ts", "10 seconds"), "k")
        .agg(F.count("*").alias("n"))
    ),
    "dedup": lambda df: df.withWatermark("ts", "1 hour").dropDuplicates(["k", "ts"]),
    "tws": lambda df: df.groupBy("k").transformWithStateInPandas(
        Keeper(), "k string, n long", "Update", "None"
    ),
}


def offline_rows(location: Path, batch_id: int, store: str | None) -> dict[str, list[Any]]:
    """Per key (as text), its rows as the state reader reads them from the checkpoint."""
    options: dict[str, Any] = {"path": str(location), "batchId": batch_id}
    if store is not None:  # a list or a map as one row per key, as live reads show them
        options.update(stateVarName=store, flattenCollectionTypes=False)
    reader = StateReader(ReadRequest.from_options(options))
    out: dict[str, list[Any]] = {}
    for p in range(reader.num_partitions):
        for batch in reader.read(p):
            for row in batch.to_pylist():
                key = row.pop("key")
                row.pop("partition_id")
                out.setdefault(repr(key), []).append(plain(row))
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_reads_in_the_operators_own_shapes(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, shape: str
) -> None:
    """A window's aggregate, a deduplication's presence, a transformWithState variable by its
    name: each key's rows as the state reader shows them, by get and by scan."""
    chk = tmp_path / "chk"
    df = ss.stream(feed.stream(spark, "k string, v int, ts timestamp"))
    q = (
        SHAPES[shape](df)
        .writeStream.outputMode("append" if shape != "tws" else "update")
        .format("noop")
        .option("checkpointLocation", str(chk))
        .option("stateStore", "rocksdb")
        .start()
    )
    try:
        for b in range(3):
            feed.add(
                [
                    {"k": f"k{i % 4}", "v": i, "ts": f"2024-01-01T00:00:{(i * 3 + b) % 60:02d}Z"}
                    for i in range(8 * b, 8 * b + 12)
                ]
            )
            q.processAllAvailable()
        stores = ["count", "seen", "named"] if shape == "tws" else [None]
        for store in stores:
            with ss.state(q, store=store) as live:
                want = offline_rows(chk, live.batch_id, store)
                assert want
                scanned: dict[str, list[Any]] = {}
                for f in live.scan():
                    assert f.source == "home"
                    scanned.setdefault(repr(f.key), []).extend(f.rows)
                assert scanned == want
                for f in live.scan():
                    got = live.get(f.key)
                    assert got.found and got.source == "home"
                    assert got.rows == scanned[repr(f.key)]
    finally:
        q.stop()
