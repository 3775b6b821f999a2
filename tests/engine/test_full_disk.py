"""A full disk, for real: a size-limited ``tmpfs`` mounted as the checkpoint's disk (both
providers) and, separately, as the executors' local directory (the rocksdb provider's copies).

The checkpoint's disk: a query runs two batches, then a file takes all but a few pages of the
disk (room for Spark's small log files) and the third batch comes. The local disk: a query runs
two batches, the disk is filled whole, and the query restarts with its local copies there (a
partition that lands on an executor whose disk is full), for the third batch; a full local disk
alone fails nothing while the batches' writes fit in the memtables and the durable copy is
elsewhere, so the restore is what needs the disk.

Either way the batch must fail with an error that names the path and says the disk is full;
nothing half written may be left where a restart would read it. Then the file is removed, the
query restarts on the same checkpoint, a fourth batch comes, and the output of every batch must
equal that of the same query over the same input on a disk that never filled up.

Mounting needs root (``CAP_SYS_ADMIN``); elsewhere the tests are skipped and say why.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.files.durable import TMP_PREFIX

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, source, start_ours

SCHEMA = "k string, p string"
#: The size of the disk, and the room left on it when it fills up: enough for Spark's small log
#: files (its offsets are written before the batch runs), not for a batch's state.
DISK = "8m"
ROOM = 48 << 10


def _rows(batch: int, keys: int = 40) -> list[dict[str, Any]]:
    """New keys, each with 6 KB of random text: about 250 KB of state a batch of 40."""
    rnd = random.Random(batch)
    return [{"k": f"k{batch}-{i}", "p": rnd.randbytes(3 << 10).hex()} for i in range(keys)]


BATCHES = [_rows(b) for b in range(4)]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A ``tmpfs`` of :data:`DISK`, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, room: int) -> Path:
    """A file that leaves ``room`` bytes free on ``disk``."""
    stat = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as out:
        out.write(b"\0" * max(stat.f_bavail * stat.f_frsize - room, 0))
    return filler


def _query(
    spark: SparkSession, feed: FileFeed, chk: Path, provider: str, out: Collector, **options: str
) -> Any:
    stream = ss.stream(source(spark, feed, SCHEMA))
    counts = stream.groupBy("k").agg(SF.count("*").alias("n"), SF.max("p").alias("p"))
    return start_ours(counts, "update", chk, provider, out, **options)


def _run(spark: SparkSession, feed: FileFeed, query: Any, batches: list[Any]) -> None:
    for rows in batches:
        feed.add(rows)
        query.processAllAvailable()


def _reference(spark: SparkSession, tmp_path: Path, provider: str, batches: list[Any]) -> Collector:
    """The same query over the same input on a disk that never filled up."""
    out = Collector()
    feed = FileFeed(tmp_path / "reference-input")
    query = _query(spark, feed, tmp_path / "reference-chk", provider, out)
    try:
        _run(spark, feed, query, batches)
    finally:
        query.stop()
    return out


def _fill_and_recover(
    spark: SparkSession,
    tmp_path: Path,
    disk: Path,
    chk: Path,
    provider: str,
    batches: list[Any],
    *,
    room: int = ROOM,
    restart_with: dict[str, str] | None = None,
) -> tuple[Collector, str]:
    """Two batches, the disk filled (``restart_with``: then the query restarted with these
    options), the third batch's failure (its message), the disk freed, a restart with the third
    and fourth batches."""
    out = Collector()
    feed = FileFeed(tmp_path / "input")
    query = _query(spark, feed, chk, provider, out)
    options = restart_with or {}
    try:
        _run(spark, feed, query, batches[:2])
        filler = _fill(disk, room)
        if restart_with is not None:
            query.stop()
            query = _query(spark, feed, chk, provider, out, **options)
        with pytest.raises(StreamingQueryException) as failed:
            _run(spark, feed, query, batches[2:3])
    finally:
        query.stop()
    half_written = [str(p) for p in disk.rglob(f"{TMP_PREFIX}*")]
    assert half_written == []
    filler.unlink()
    query = _query(spark, feed, chk, provider, out, **options)
    try:
        query.processAllAvailable()
        _run(spark, feed, query, batches[3:])
    finally:
        query.stop()
    return out, str(failed.value)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_full_checkpoint_disk_fails_the_batch_and_loses_nothing(
    spark: SparkSession, tmp_path: Path, disk: Path, provider: str
) -> None:
    chk = disk / "chk"
    out, message = _fill_and_recover(spark, tmp_path, disk, chk, provider, BATCHES)
    assert "the disk is full" in message, message
    assert str(chk) in message, message
    assert out.batches == _reference(spark, tmp_path, provider, BATCHES).batches


@pytest.mark.skipif("rocksdb" not in PROVIDERS, reason="the rocksdb provider is not installed")
def test_a_full_local_disk_fails_the_batch_and_loses_nothing(
    spark: SparkSession, tmp_path: Path, disk: Path
) -> None:
    local = disk / "local"
    out, message = _fill_and_recover(
        spark,
        tmp_path,
        disk,
        tmp_path / "chk",
        "rocksdb",
        BATCHES,
        room=0,
        restart_with={"stateStore.local_dir": str(local)},
    )
    assert "the disk is full" in message, message
    assert str(local) in message, message
    assert out.batches == _reference(spark, tmp_path, "rocksdb", BATCHES).batches
