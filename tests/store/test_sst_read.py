"""Point lookups in the SST files of a checkpoint answer what RocksDB answers, reading only the
blocks they need; a file they cannot read raises, never answers wrong."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import rocksdict

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.files.durable import DurableDir
from sparkstate.store.rocksdb.options import LocalDBConf, db_options, shared_resources
from sparkstate.store.rocksdb.sst_format import decode_varint
from sparkstate.store.rocksdb.sst_read import EntryKind, SstFile, SstFormatError, SstSet

PREFIX = b"\x00\x07"
N = 200_000
_MB = 1024 * 1024


def key(i: int) -> bytes:
    """Keys of several lengths under a column-family prefix; odd ``i`` are never written."""
    return PREFIX + (2 * i).to_bytes(4, "big") + b"#" * (i % 5)


def value(i: int, rnd: int) -> bytes:
    """20 to 200 bytes that compress, so that blocks are stored compressed."""
    return (b"v%d.%d-" % (i, rnd) * 40)[: 20 + (i * 7919 + rnd) % 181]


def file_reader(path: Path) -> tuple[Callable[[int, int], bytes], int]:
    data = path.read_bytes()
    return (lambda offset, length: data[offset : offset + length]), len(data)


def open_set(directory: Path) -> SstSet:
    """The SST files of a checkpoint, each read by ``os.pread`` of its file (closed when the
    test module ends)."""
    files = []
    for path in sorted(directory.glob("*.sst")):
        fd = os.open(path, os.O_RDONLY)
        _open_fds.append(fd)
        files.append(
            SstFile(lambda o, n, fd=fd: os.pread(fd, n, o), os.fstat(fd).st_size, path.name)
        )
    return SstSet(files)


_open_fds: list[int] = []


@pytest.fixture(scope="module", autouse=True)
def _close_files() -> Iterator[None]:
    yield
    while _open_fds:
        os.close(_open_fds.pop())


def checkpoint(db: rocksdict.Rdict, where: Path) -> Path:
    db.flush()
    rocksdict.Checkpoint(db).create_checkpoint(str(where))
    return where


def write(db: rocksdict.Rdict, puts: dict[bytes, bytes]) -> None:
    batch = rocksdict.WriteBatch(raw_mode=True)
    for k, v in puts.items():
        batch.put(k, v)
    db.write(batch)


class History:
    """What was done to the keys of a database, to sample each case from."""

    def __init__(self) -> None:
        self.deleted: list[bytes] = []
        self.range_deleted: list[bytes] = []
        self.overwritten: list[bytes] = []
        self.written_back: list[bytes] = []


def build(path: Path, compression: str) -> tuple[rocksdict.Rdict, History]:
    """A database written with the project's options in rounds: two overlapping flushes
    compacted to the bottom level (so that sequence numbers there are 0), then overwrites,
    deletions and range deletions in newer files above, one range deletion compacted away and
    one over the bottom level, keys written back inside a deleted range."""
    opts = db_options(LocalDBConf(compression=compression), shared_resources(64, 32), create=True)
    db = rocksdict.Rdict(str(path), opts)
    rng = random.Random(7)
    hist = History()
    write(db, {key(i): value(i, 0) for i in range(0, N, 2)})
    db.flush()
    write(db, {key(i): value(i, 0) for i in range(1, N, 2)})
    db.delete_range(key(1000), key(1500))
    hist.range_deleted += [key(i) for i in range(1000, 1500, 37)]
    db.flush()
    db.compact_range(None, None)

    hist.overwritten = [key(rng.randrange(N)) for _ in range(3000)]
    write(db, {k: b"new:" + k for k in hist.overwritten})
    hist.deleted = [key(rng.randrange(N)) for _ in range(2000)]
    for k in hist.deleted:
        db.delete(k)
    db.delete_range(key(50_000), key(52_000))
    hist.range_deleted += [key(i) for i in range(50_000, 52_000, 41)]
    hist.written_back = [key(i) for i in range(51_000, 51_100, 9)]
    write(db, {k: b"back:" + k for k in hist.written_back})
    db.flush()
    db.delete_range(key(120_000), key(121_000))
    hist.range_deleted += [key(i) for i in range(120_000, 121_000, 43)]
    write(db, {key(i): value(i, 2) for i in range(120_500, 120_600, 3)})
    hist.written_back += [key(i) for i in range(120_500, 120_600, 3)]
    return db, hist


@pytest.fixture(scope="module", params=["zstd", "lz4", "none"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, rocksdict.Rdict, History, Path]]:
    base = tmp_path_factory.mktemp(f"sst-{request.param}")
    db, hist = build(base / "db", request.param)
    where = checkpoint(db, base / "checkpoint")
    yield request.param, db, hist, where
    db.close()


def sample(hist: History) -> list[bytes]:
    rng = random.Random(3)
    present = [key(rng.randrange(N)) for _ in range(3000)]
    never = [key(rng.randrange(N)) + b"\x00" for _ in range(500)]
    never += [PREFIX + (2 * rng.randrange(N) + 1).to_bytes(4, "big") for _ in range(500)]
    never += [b"", PREFIX, b"\x00", key(N), key(N + 7), b"\xff" * 12, key(0)[:-1]]
    cases = hist.deleted + hist.range_deleted + hist.overwritten + hist.written_back
    return present + never + cases


def test_lookups_answer_what_rocksdb_answers(
    database: tuple[str, rocksdict.Rdict, History, Path],
) -> None:
    compression, db, hist, where = database
    ssts = open_set(where)
    keys = sample(hist)
    expected = [db.get(k) for k in keys]
    assert [ssts.get(k) for k in keys] == expected
    assert ssts.get_many(keys) == expected
    assert sum(v is None for v in expected) > 2000
    gone = set(hist.deleted + hist.range_deleted) - set(hist.written_back)
    assert [k for k in gone if db.get(k) is not None] == []
    assert all(db.get(k) is not None for k in hist.written_back)


def _live_last_below(db: rocksdict.Rdict, end: bytes) -> bytes | None:
    it = db.iter()
    it.seek_for_prev(end)
    while it.valid() and it.key() >= end:
        it.prev()
    return it.key() if it.valid() else None


def test_the_last_key_below_a_bound_bounds_the_keys_stored(
    database: tuple[str, rocksdict.Rdict, History, Path],
) -> None:
    """``last_below(end)`` is at least the largest key RocksDB holds below ``end`` (a key
    deleted in a newer file may still have an entry, so it may be larger, never ``end`` or
    above), and equal to it where no key near it was deleted."""
    _, db, hist, where = database
    ssts = open_set(where)
    rng = random.Random(5)
    ends = [key(rng.randrange(N)) for _ in range(300)] + [key(i) for i in (0, 1, 2, N, N + 5)]
    ends += [b"", b"\x00", PREFIX, b"\xff" * 12, key(51_050), key(1200), key(120_550)]
    touched = set(hist.deleted + hist.overwritten + hist.written_back)
    for lo, hi in ((1000, 1500), (50_000, 52_000), (120_000, 121_000)):  # the ranges deleted
        touched.update(key(i) for i in range(lo, hi))
    exact = 0
    for end in ends:
        live = _live_last_below(db, end)
        got = ssts.last_below(end)
        if live is None:
            assert got is None or got < end, end
            continue
        assert got is not None and live <= got < end, (end, live, got)
        if not any(live <= k < end for k in touched):
            assert got == live, (end, live, got)
            exact += 1
    assert exact > 200


def test_the_database_spans_levels_blocks_and_partitions(
    database: tuple[str, rocksdict.Rdict, History, Path],
) -> None:
    """The fixture covers what a lookup must get right: files on several levels, several index
    partitions, entries of sequence number 0, deletions and range deletions in newer files."""
    compression, db, hist, where = database
    ssts = open_set(where)
    assert len(ssts.files) >= 3
    assert len({f["level"] for f in db.live_files()}) >= 2
    partitions = [f.properties[b"rocksdb.index.partitions"] for f in ssts.files]
    assert max(decode_varint(p, 0)[0] for p in partitions) > 4
    names = {f.properties[b"rocksdb.compression"] for f in ssts.files}
    assert (
        names
        == {"zstd": {b"LZ4", b"ZSTD"}, "lz4": {b"LZ4"}, "none": {b"NoCompression"}}[compression]
    )
    entries = [e for f in ssts.files if (e := f.get(key(10))) is not None]
    assert [e.seq for e in entries] == [0]
    kinds = {e.kind for k in hist.deleted for f in ssts.files if (e := f.get(k)) is not None}
    assert EntryKind.DELETION in kinds
    assert sum(len(f.tombstones) for f in ssts.files) == 2


def test_a_lookup_reads_a_partition_and_a_block(
    database: tuple[str, rocksdict.Rdict, History, Path],
) -> None:
    """Opening a file reads its end once, and the top level of its filter where that lies
    before the end; a lookup then reads one filter partition, one index partition (unless the
    end held it) and one data block, and a second lookup of the same key reads nothing."""
    _, _, _, where = database
    path = max(where.glob("*.sst"), key=lambda p: p.stat().st_size)
    read, size = file_reader(path)
    sst = SstFile(read, size, path.name)
    opened = sst.reads
    assert opened in (1, 2)
    assert sst.get(key(77_777)) is not None
    assert sst.reads - opened in (2, 3)
    reads = sst.reads
    assert sst.get(key(77_777)) is not None
    assert sst.reads == reads
    assert sst.bytes_read < 64 * 1024 + 4 * 16 * 1024


def test_the_block_cache_is_bounded(database: tuple[str, rocksdict.Rdict, History, Path]) -> None:
    _, _, _, where = database
    path = max(where.glob("*.sst"), key=lambda p: p.stat().st_size)
    read, size = file_reader(path)
    sst = SstFile(read, size, path.name, cache_bytes=32 * 1024)
    unbounded = SstFile(read, size, path.name, cache_bytes=1 << 40)
    for i in [*range(0, N, 97), *range(0, N, 97)]:
        assert sst.get(key(i)) == unbounded.get(key(i))
    assert sst.reads > unbounded.reads
    assert sst._cached_bytes <= 32 * 1024 + 16 * 1024  # noqa: SLF001


def small_db(
    path: Path,
    *,
    compression: rocksdict.DBCompressionType | None = None,
    configure: Callable[[rocksdict.BlockBasedOptions], None] = lambda table: None,
    extra: Callable[[rocksdict.Rdict], None] = lambda db: None,
) -> tuple[rocksdict.Rdict, SstSet]:
    """A database of 5000 keys written with one option changed, and its checkpoint's files."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_format_version(5)
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    configure(table)
    opts.set_block_based_table_factory(table)
    if compression is not None:
        opts.set_compression_type(compression)
        opts.set_bottommost_compression_type(compression)
    db = rocksdict.Rdict(str(path / "db"), opts)
    write(db, {key(i): value(i, 0) for i in range(5000)})
    extra(db)
    return db, open_set(checkpoint(db, path / "checkpoint"))


@pytest.mark.parametrize(
    ("compression", "checksum", "index"),
    [
        ("snappy", "xxh3", "two_level_index_search"),
        ("zlib", "crc32c", "two_level_index_search"),
        ("lz4hc", "xxhash", "binary_search"),
        ("bz2", "xxhash64", "binary_search"),
    ],
)
def test_other_compressions_checksums_and_indexes(
    tmp_path: Path, compression: str, checksum: str, index: str
) -> None:
    def configure(table: rocksdict.BlockBasedOptions) -> None:
        table.set_checksum_type(getattr(rocksdict.ChecksumType, checksum)())
        table.set_index_type(getattr(rocksdict.BlockBasedIndexType, index)())

    kind = getattr(rocksdict.DBCompressionType, compression)()
    db, ssts = small_db(tmp_path, compression=kind, configure=configure)
    keys = [key(i) for i in range(0, 5200, 3)] + [key(i) + b"\x00" for i in range(0, 5000, 7)]
    assert [ssts.get(k) for k in keys] == [db.get(k) for k in keys]
    db.close()


def test_a_truncated_or_foreign_file_is_refused(
    database: tuple[str, rocksdict.Rdict, History, Path],
) -> None:
    _, _, _, where = database
    path = next(iter(sorted(where.glob("*.sst"))))
    data = path.read_bytes()
    for cut in (data[:-100], data[: len(data) // 2], data[:40]):
        with pytest.raises((SstFormatError, CorruptStateFileError)):
            SstFile(lambda o, n, d=cut: d[o : o + n], len(cut), "cut.sst")
    with pytest.raises(CorruptStateFileError, match="read"):
        SstFile(lambda o, n: data[o : o + n], len(data) + 10, "short.sst")
    garbage = random.Random(1).randbytes(100_000)
    with pytest.raises(SstFormatError, match="not a RocksDB block-based table"):
        SstFile(lambda o, n: garbage[o : o + n], len(garbage), "garbage.sst")


def test_a_damaged_block_fails_its_checksum(
    database: tuple[str, rocksdict.Rdict, History, Path],
) -> None:
    _, db, _, where = database
    path = max(where.glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x40
    sst = SstFile(lambda o, n: bytes(data[o : o + n]), len(data), path.name)
    with pytest.raises(CorruptStateFileError, match=f"{path.name}.*checksum"):
        sst.get(key(0))
    entry = sst.get(key(N - 1))
    assert entry is not None
    assert entry.value == db.get(key(N - 1))


def test_features_it_does_not_read_are_refused(tmp_path: Path) -> None:
    def hash_index(table: rocksdict.BlockBasedOptions) -> None:
        table.set_data_block_index_type(rocksdict.DataBlockIndexType.binary_and_hash())

    db, ssts = small_db(tmp_path / "hash", configure=hash_index)
    with pytest.raises(SstFormatError, match="hash index"):
        ssts.get(key(3))
    db.close()

    def format_6(table: rocksdict.BlockBasedOptions) -> None:
        table.set_format_version(6)

    with pytest.raises(SstFormatError, match="format_version 6"):
        small_db(tmp_path / "v6", configure=format_6)

    def entity(db: rocksdict.Rdict) -> None:
        db.put_entity(key(3), [b"a"], [b"b"])

    db, ssts = small_db(tmp_path / "entity", extra=entity)
    with pytest.raises(SstFormatError, match="kind 0x16"):
        ssts.get(key(3))
    assert ssts.get(key(4)) == db.get(key(4))
    db.close()


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_lookups_in_place_on_durable_storage(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The SST files of a checkpoint uploaded as a snapshot's are looked up where they lie,
    each block one ranged read of the durable file."""
    root = str(tmp_path / "durable") if where == "local" else request.getfixturevalue("s3_root")
    directory = DurableDir(root).child("sst")
    db, ssts = small_db(tmp_path)
    local = tmp_path / "checkpoint"
    for path in local.glob("*.sst"):
        directory.upload(str(path), path.name)
    opened = [directory.open_ranged(path.name) for path in sorted(local.glob("*.sst"))]
    remote = SstSet([SstFile(f.read, f.size, f.name) for f in opened])
    keys = [key(i) for i in range(0, 5200, 13)]
    assert remote.get_many(keys) == [db.get(k) for k in keys]
    assert remote.reads < 2 * len(keys)
    for f in opened:
        f.close()
    db.close()
