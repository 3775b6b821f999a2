"""The executor-local RocksDB layer: the directory lock across processes, batches, checkpoints."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import rocksdict

from sparkstate.exceptions import (
    ConfigurationError,
    CorruptStateFileError,
    MissingVersionError,
    StoreClosedError,
    StoreLockedError,
)
from sparkstate.store.rocksdb.local import (
    MARKER_KEY,
    LocalDB,
    LocalDBConf,
    LocalStoreDir,
    local_key,
    shared_resources,
)


def k(i: int) -> bytes:
    return b"\x00" + i.to_bytes(4, "big")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[LocalDB]:
    local = LocalDB(str(tmp_path / "db"), LocalDBConf(block_cache_mb=8, write_buffer_mb=8))
    yield local
    local.close()


class Child:
    """A Python child process running ``code``; it talks to the test one line at a time."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def expect(self, line: str) -> None:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        if got != line:
            self.proc.kill()
            _, err = self.proc.communicate()
            pytest.fail(f"child said {got!r}, expected {line!r}; stderr:\n{err}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> str:
        out, err = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, err
        return out.strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=20)


HOLD_LOCK = """
    import sys, time
    from sparkstate.store.rocksdb.local import LocalStoreDir
    d = LocalStoreDir({root!r}, {key!r})
    d.acquire(5, owner="child task")
    print("locked", flush=True)
    sys.stdin.readline()
    time.sleep(0.3)
    d.release()
    print("released", flush=True)
    sys.stdin.readline()
"""


def test_local_key_is_a_safe_distinct_name() -> None:
    a = local_key("s3://bucket/ckpt", 0, 3, "default")
    assert a == local_key("s3://bucket/ckpt", 0, 3, "default")
    assert "/" not in a and a.endswith("-op0-p3-default")
    others = {
        local_key("s3://bucket/ckpt", 0, 4, "default"),
        local_key("s3://bucket/ckpt", 1, 3, "default"),
        local_key("s3://bucket/other", 0, 3, "default"),
        local_key("s3://bucket/ckpt", 0, 3, "left/../keys"),
    }
    assert len(others) == 4 and a not in others
    assert "/" not in local_key("r", 0, 0, "left/../keys")
    with pytest.raises(ConfigurationError):
        LocalStoreDir("/tmp", "../escape")


def test_second_process_waits_then_takes_over(tmp_path: Path) -> None:
    store = LocalStoreDir(str(tmp_path), "store")
    child = Child(HOLD_LOCK.format(root=str(tmp_path), key="store"))
    try:
        child.expect("locked")
        with pytest.raises(StoreLockedError) as err:
            store.acquire(0.2)
        assert f"pid {child.proc.pid}" in str(err.value)
        assert "child task" in str(err.value) and store.path in str(err.value)
        assert not store.held

        child.send("release")  # the child releases 0.3 s later and stays alive
        waited = store.acquire(10)
        assert waited > 0.1 and store.held
        child.expect("released")
        assert child.proc.poll() is None
        holder = store.holder()
        assert holder is not None and holder.pid == os.getpid()
        child.send("exit")
        child.finish()
    finally:
        child.kill()
        store.release()
    assert store.holder() is None and not store.held


def test_two_objects_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    with LocalStoreDir(str(tmp_path), "s") as first:
        first.acquire(1)
        second = LocalStoreDir(str(tmp_path), "s")
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
            second.acquire(0.05)
        with pytest.raises(StoreLockedError, match="already locked by this object"):
            first.acquire(1)
    second.acquire(0)
    second.release()
    second.release()


def test_sigkilled_holder_releases_both_locks_and_db_is_at_a_batch_boundary(
    tmp_path: Path,
) -> None:
    child = Child(
        f"""
        import time
        from sparkstate.store.rocksdb.local import LocalDB, LocalStoreDir
        d = LocalStoreDir({str(tmp_path)!r}, "s")
        d.acquire(5)
        db = LocalDB(d.db_path)
        db.apply_batch({{b"\\x00a": b"1", b"\\x00b": b"1"}}, {{"version": 1}})
        db.flush()
        db.apply_batch({{b"\\x00a": b"2", b"\\x00b": None}}, {{"version": 2}})
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    try:
        child.expect("locked")
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    finally:
        child.kill()
    store = LocalStoreDir(str(tmp_path), "s")
    assert store.acquire(5) < 1
    with LocalDB(store.db_path) as db:
        # WAL off: version 2 lived only in the killed process's memtable.
        assert db.read_marker() == {"version": 1}
        assert db.multi_get([b"\x00a", b"\x00b"]) == [b"1", b"1"]
    store.release()


def test_apply_batch_is_atomic_and_carries_the_marker(db: LocalDB) -> None:
    assert db.read_marker() is None
    db.apply_batch({k(i): b"v%d" % i for i in range(10)}, {"version": 1, "ckpt": "a"})
    size = db.apply_batch(
        [(k(0), None), (k(1), b"new")], {"version": 2, "ckpt": "b"}, delete_ranges=[(k(5), k(8))]
    )
    assert size > 0 and db.bytes_written > size
    assert db.read_marker() == {"version": 2, "ckpt": "b"}
    assert db.multi_get([k(i) for i in range(10)]) == [
        None, b"new", b"v2", b"v3", b"v4", None, None, None, b"v8", b"v9",
    ]  # fmt: skip
    with pytest.raises(KeyError):  # a bad key fails while building: nothing is applied
        db.apply_batch([(k(2), None), ("not bytes", b"x")], {"version": 3})  # type: ignore[list-item]
    assert db.get(k(2)) == b"v2" and db.read_marker() == {"version": 2, "ckpt": "b"}
    # the range delete comes first, so the same batch can clear and refill a family
    db.apply_batch({k(3): b"again"}, {"version": 3}, delete_ranges=[(k(0), k(100))])
    assert list(db.iterate(b"", b"\x01")) == [(k(3), b"again")]


def test_garbled_marker_reads_as_none(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    LocalDB(path).close()
    raw = rocksdict.Rdict(path, rocksdict.Options(raw_mode=True))
    raw[MARKER_KEY] = b"\x00not json"
    raw.close()
    with LocalDB(path) as db:
        assert db.read_marker() is None


def test_iterate_bounds_and_order(db: LocalDB) -> None:
    keys = [b"\x00", b"\x00a", b"\x00b", b"\x01", b"\x01\x00", b"\x01\xff", b"\x02", b"\xfe"]
    db.apply_batch({key: key * 2 for key in reversed(keys)}, {"version": 1})
    assert [kv[0] for kv in db.iterate(b"\x00a", b"\x01\xff")] == keys[1:5]
    assert list(db.iterate(b"\x01", b"\x02")) == [(key, key * 2) for key in keys[3:6]]
    assert [kv[0] for kv in db.iterate(b"", b"\xff\xff\xff")] == keys  # marker never shown
    assert list(db.iterate(b"\x01", b"\x01")) == []
    assert list(db.iterate(b"\x03", b"\x01")) == []
    assert db.approximate_num_keys() >= len(keys)
    stats = db.memory_stats()
    assert stats["memtable_bytes"] > 0 and stats["process_block_cache_bytes"] >= 0


def test_iterate_is_a_snapshot_of_the_call(db: LocalDB) -> None:
    db.apply_batch({k(1): b"a"}, {"version": 1})
    scan = db.iterate(k(0), k(10))
    db.apply_batch({k(2): b"b"}, {"version": 2})
    assert list(scan) == [(k(1), b"a")]


def test_multi_get_keeps_order_across_chunks(db: LocalDB) -> None:
    db.apply_batch({k(i): b"%d" % i for i in range(0, 5000, 2)}, {"version": 1})
    keys = [k(i) for i in range(4999, -1, -1)]
    assert db.multi_get(keys) == [b"%d" % i if i % 2 == 0 else None for i in range(4999, -1, -1)]
    assert db.multi_get([]) == []


def test_checkpoint_copied_to_a_fresh_dir_opens_with_the_same_data(
    db: LocalDB, tmp_path: Path
) -> None:
    db.apply_batch({k(i): b"x%d" % i for i in range(1000)}, {"version": 1})
    db.flush()
    db.apply_batch({k(i): None for i in range(0, 1000, 3)}, {"version": 2, "ckpt": "c"})
    expected = list(db.iterate(b"", b"\xff"))
    files = db.create_checkpoint(str(tmp_path / "scratch" / "ckpt"))  # still in the memtable
    assert "CURRENT" in files and any(f.startswith("MANIFEST-") for f in files)
    assert any(f.endswith(".sst") for f in files) and not any(f.endswith(".log") for f in files)
    assert sorted(os.listdir(tmp_path / "scratch" / "ckpt")) == files
    with pytest.raises(OSError, match="already exists"):
        db.create_checkpoint(str(tmp_path / "scratch" / "ckpt"))

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for name in files:
        shutil.copy(tmp_path / "scratch" / "ckpt" / name, fresh / name)
    with LocalDB.open_from_files(str(fresh), files) as copy:
        assert copy.read_marker() == {"version": 2, "ckpt": "c"}
        assert list(copy.iterate(b"", b"\xff")) == expected
        copy.apply_batch({k(5000): b"new"}, {"version": 3})  # the copy is a normal, writable DB
    assert db.get(k(5000)) is None


def test_open_from_files_reports_missing_files(tmp_path: Path) -> None:
    with pytest.raises(MissingVersionError, match=r"000009\.sst"):
        LocalDB.open_from_files(str(tmp_path), ["CURRENT", "000009.sst"])
    (tmp_path / "000009.sst").write_bytes(b"")
    with pytest.raises(CorruptStateFileError, match="no CURRENT or MANIFEST"):
        LocalDB.open_from_files(str(tmp_path), ["000009.sst"])
    with pytest.raises(MissingVersionError, match="no CURRENT"):
        LocalDB(str(tmp_path / "absent"), create_if_missing=False)


def test_close_really_releases_the_rocksdb_lock(db: LocalDB) -> None:
    db.apply_batch({k(i): b"v" for i in range(100)}, {"version": 7})
    unstarted = db.iterate(b"", b"\xff")
    halfway = db.iterate(b"", b"\xff")
    next(halfway)
    with pytest.raises(StoreLockedError, match=db.path):  # RocksDB's LOCK, same process
        LocalDB(db.path)
    db.close()
    db.close()
    assert list(halfway) == [] and list(unstarted) == []
    child = Child(
        f"""
        from sparkstate.store.rocksdb.local import LocalDB
        with LocalDB({db.path!r}) as db:
            print(db.read_marker()["version"], len(list(db.iterate(b"", b"\\xff"))))
        """
    )
    assert child.finish() == "7 100"  # close flushed the memtable (WAL is off)
    with pytest.raises(StoreClosedError, match=db.path):
        db.get(k(1))


def test_corrupt_db_raises_corrupt_state_file_error_and_can_be_wiped(tmp_path: Path) -> None:
    store = LocalStoreDir(str(tmp_path), "s")
    with pytest.raises(StoreLockedError, match="requires holding the lock"):
        store.wipe_db()
    store.acquire(1)
    with LocalDB(store.db_path) as db:
        db.apply_batch({k(i): b"v" * 100 for i in range(1000)}, {"version": 1})
    for sst in Path(store.db_path).glob("*.sst"):
        with open(sst, "r+b") as f:
            f.truncate(100)
    with pytest.raises(CorruptStateFileError, match=store.db_path):
        LocalDB(store.db_path)
    store.wipe_db()
    assert not os.path.exists(store.db_path) and os.path.exists(store.lock_path)
    with LocalDB(store.db_path) as fresh:
        assert fresh.read_marker() is None
    store.release()


def test_every_db_of_a_process_shares_cache_and_write_buffers(tmp_path: Path) -> None:
    res = shared_resources(8, 8)
    assert shared_resources(8, 8) is res
    with LocalDB(str(tmp_path / "a")) as a, LocalDB(str(tmp_path / "b")) as b:
        assert a.resources is b.resources is res
        a.apply_batch({k(1): b"x" * 1000}, {"version": 1})
        assert a.memory_stats()["process_write_buffer_bytes"] > 0
    before = res.block_cache_bytes
    assert shared_resources(before // (1 << 20) + 1, 8).block_cache_bytes > before


def test_the_cache_blocks_are_shared_among_the_open_dbs_its_memtable_charge_left_out(
    tmp_path: Path,
) -> None:
    with LocalDB(str(tmp_path / "a")) as a:
        res = a.resources
        a.apply_batch({k(i): b"x" * 100 for i in range(20_000)}, {"version": 1})
        a.flush()
        a.multi_get([k(i) for i in range(20_000)])  # the data blocks come into the cache
        blocks = res.cached_blocks_bytes()
        assert 2_000_000 < blocks < res.block_cache.get_usage()
        with LocalDB(str(tmp_path / "b")) as b:
            b.apply_batch({k(i): b"x" * 100 for i in range(5_000)}, {"version": 1})
            assert len(res.open_dbs) >= 2
            assert res.cached_blocks_bytes() == pytest.approx(blocks, rel=0.05)  # not memtables
            stats = a.memory_stats()
            assert stats["share_cached_blocks_bytes"] == res.share(res.cached_blocks_bytes())
            assert b.memory_stats()["all_memtables_bytes"] > 500_000
        assert b not in res.open_dbs


def test_a_version_over_the_memtable_budget_is_flushed_after_its_write(tmp_path: Path) -> None:
    # Left in memory until the next write, it stayed charged to the block cache through the next
    # batch's reads: the cache, overfull, kept no blocks (session windows, 1M keys: 4x slower).
    with LocalDB(str(tmp_path / "small")) as small:
        small.apply_batch({k(i): b"x" * 100 for i in range(1000)}, {"version": 1})
        assert small.memory_stats()["live_sst_bytes"] == 0  # under the budget: not flushed
    with LocalDB(str(tmp_path / "large")) as large:
        budget = large.resources.write_buffer_bytes  # the process's, as large as any DB asked
        n = budget // 1000 + 2000
        large.apply_batch({k(i): os.urandom(1000) for i in range(n)}, {"version": 1})
        deadline = time.monotonic() + 60
        while large.memory_stats()["live_sst_bytes"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = large.memory_stats()
        assert stats["live_sst_bytes"] > budget  # the version is in a file
        assert stats["memtable_bytes"] < budget // 4  # and out of memory
        assert large.get(k(n - 1)) is not None and large.read_marker() == {"version": 1}


def test_statistics_count_bytes_and_time_lookups_unless_disabled(tmp_path: Path) -> None:
    with LocalDB(str(tmp_path / "db")) as db:
        db.apply_batch({k(1): b"abc"}, {"version": 1})
        db.get(k(1))
        db.multi_get([k(1), k(2)])
        stats = db.statistics()
    assert stats["rocksdb.bytes.written"] > 0 and stats["rocksdb.number.keys.read"] == 1
    assert stats["rocksdb.number.multiget.keys.read"] == 2
    assert stats["rocksdb.db.get.micros.count"] == 1 and stats["rocksdb.db.get.micros.sum"] >= 0
    with LocalDB(str(tmp_path / "db2"), LocalDBConf(statistics=False)) as plain:
        assert plain.statistics() == {}


def test_a_reopened_db_keeps_its_bloom_filters(tmp_path: Path) -> None:
    # rocksdict reopens an existing DB with the options of its OPTIONS file unless told the
    # column family's options: those lose the filter policy, so lookups of absent keys (the
    # commit's existence reads) would read data blocks of every file.
    path, conf = str(tmp_path / "db"), LocalDBConf(statistics=True)
    with LocalDB(path, conf) as db:
        db.apply_batch({k(i): b"v" for i in range(0, 2000, 2)}, {"version": 1})
    with LocalDB(path, conf, create_if_missing=False) as db:
        db.apply_batch({k(i): b"v" for i in range(1, 2000, 2)}, {"version": 2})
        db.flush()
    with LocalDB(path, conf, create_if_missing=False) as db:
        assert db.multi_get([k(i) for i in range(2000, 3000)]) == [None] * 1000
        useful = db.statistics()["rocksdb.bloom.filter.useful"]
    assert useful > 1500  # two files, 1000 absent keys each, ~1% false positives


def test_a_bloom_filter_larger_than_a_megabyte_stays_in_the_block_cache(tmp_path: Path) -> None:
    # With an LRU block cache of 64 MB (64 shards of 1 MB), a reopened DB found such a filter
    # in the cache for none of its lookups: it was read again for every 32 keys of a multi-get.
    keys = [k(i) for i in range(100_000)]
    path, conf = str(tmp_path / "db"), LocalDBConf(statistics=True, bloom_bits_per_key=100)
    with LocalDB(path, conf) as db:
        db.apply_batch(dict.fromkeys(keys, b"v"), {"version": 1})
        db._live().compact_range(None, None)  # one file below L0, whose blocks are not pinned
    with LocalDB(path, conf, create_if_missing=False) as db:
        assert db.multi_get(keys[::5]) == [b"v"] * 20_000
        stats = db.statistics()
    assert stats["rocksdb.bloom.filter.full.positive"] == 20_000  # one filter of 1.25 MB
    assert stats["rocksdb.block.cache.filter.miss"] <= 1


def test_wipe_closes_and_removes_the_directory(db: LocalDB) -> None:
    db.apply_batch({k(1): b"x"}, {"version": 1})
    scan = db.iterate(b"", b"\xff")
    db.wipe()
    assert db.closed and not os.path.exists(db.path) and list(scan) == []


def test_lock_wait_is_short_when_free(tmp_path: Path) -> None:
    store = LocalStoreDir(str(tmp_path / "new" / "root"), "s")
    start = time.monotonic()
    store.acquire(0)
    assert time.monotonic() - start < 0.5
    store.release()
