"""A lookup in an SST file asks the file's Bloom filter first: a key the file holds is never
ruled out (the filter hashes as RocksDB does, to the bit), a key it does not hold mostly costs no
read of its data, and a file whose filter the reader does not read answers as without one."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import rocksdict
import xxhash
from tests.store.test_sst_read import checkpoint, file_reader, key, write

from sparkstate.store.families import ColumnFamily
from sparkstate.store.rocksdb.options import LocalDBConf, db_options, shared_resources
from sparkstate.store.rocksdb.sst_filter import BloomFilter
from sparkstate.store.rocksdb.sst_format import block_entries, decode_varint, split_internal_key
from sparkstate.store.rocksdb.sst_read import SstFile, SstSet
from sparkstate.store.rocksdb.xxph3 import hash64

# RocksDB's util/hash_test.cc, Hash64SmallValueSchema: Hash64 with seed 0 (GetSliceHash64).
ROCKSDB_SMALL_VALUES = [
    (b"", 5999572062939766020),
    (b"\x08", 583283813901344696),
    (b"\x9a", 16322991629225003903),
    (b"\x4d\x76", 6859542833406258115),
    (b"\xd6\x27", 12292689282614532691),
    (b"\x30\x46\x0b", 11404699285340020889),
    (b"\x6a\xb5\xf4", 16863488758399383382),
    (b"\x67\x53\x81\x1c", 9010661983527562386),
    (b"\x46\xdc\x54\xbe", 7063754590279313623),
    (b"\xd0\x7a\x6e\xea\x56", 6384167718754869899),
    (b"\x5c\x5e\xe1\xa0\x73\x81", 17358142495308219330),
    (b"\x59\x77\xf0\xa7\x24\xf4\x78", 8601330687345614172),
    (b"\x31\x1b\x98\x75\x96\x22\xd3\x9a", 9844314944338447628),
    (b"\x80\xd4\x3b\x3b\xae\x22\xa2\x78", 1729303145008254458),
    (b"\x1a\xb5\xd0\xfe\xab\xc3\x61\xb2\x99", 13253403748084181481),
    (b"\xb6\xc0\xdd\x05\x3f\xc4\x86\x4c\xef", 12439346786701492),
    (b"\x22\x6f\x39\x1f\xf8\xdd\x4f\x52\x17\x94", 12883919702069153152),
    (b"\xbd\x2c\x63\x38\xbf\xe9\x78\xb7\xbf\x15", 10551812464348219044),
]

# RocksDB's util/hash_test.cc, Hash64LargeValueSchema: for each length up to 430, the hash of
# that many bytes of the repeated word, mod 61, as a letter.
ROCKSDB_DESCRIPTORS = {
    b"foo": "cRhyWsY67B6klRA1udmOuiYuX7IthyGBKqbeosz2hzVglWCmQx8nEdnpkvPfYX56Up2OWOTV"
    "lTzfAoYwvtqKzjD8E9xttR2unelbXbIV67NUe6bOO23BxaSFRcA3njGu5cUWfgwOqNoTsszp"
    "uPvKRP6qaUR5VdoBkJUCFIefd7edlNK5mv6JYWaGdwxehg65hTkTmjZoPKxTZo4PLyzbL9U4"
    "xt12ITSfeP2MfBHuLI2z2pDlBb44UQKVMx27LEoAHsdLp3WfWfgH3sdRBRCHm33UxCM4QmE2"
    "xJ7gqSvNwTeH7v9GlC8zWbGroyD3UVNeShMLx29O7tH1biemLULwAHyIw8zdtLMDpEJ8m2ic"
    "l6Lb4fDuuFNAs1GCVUthjK8CV8SWI8Rsz5THSwn5CGhpqUwSZcFknjwWIl5rNCvDxXJqYr",
    b"Rocks": "c1EeRkrzgOYWLA8PuhJrwTePJewoB44WdXYDfhbk3ZxTqqg25WlPExDl7IKIQLJvnA6gJxxn"
    "9TCSLkFGfJeXehaSS1GBqWSzfhEH4VXiXIUCuxJXxtKXcSC6FrNIQGTZbYDiUOLD6Y5inzrF"
    "9etwQhXUBanw55xAUdNMFQAm2GjJ6UDWp2mISLiMMkLjANWMKLaZMqaFLX37qB4MRO1ooVRv"
    "zSvaNRSCLxlggQCasQq8icWjzf3HjBlZtU6pd4rkaUxSzHqmo9oM5MghbU5Rtxg8wEfO7lVN"
    "5wdMONYecslQTwjZUpO1K3LDf3K3XK6sUXM6ShQQ3RHmMn2acB4YtTZ3QQcHYJSOHn2DuWpa"
    "Q8RqzX5lab92YmOLaCdOHq1BPsM7SIBzMdLgePNsJ1vvMALxAaoDUHPxoFLO2wx18IXnyX",
    b"RocksDB": "c1EeRkukbkb28wLTahwD2sfUhZzaBEnF8SVrxnPVB6A7b8CaAl3UKsDZISF92GSq2wDCukOq"
    "Jgrsp7A3KZhDiLW8dFXp8UPqPxMCRlMdZeVeJ2dJxrmA6cyt99zkQFj7ELbut6jAeVqARFnw"
    "fnWVXOsaLrq7bDCbMcns2DKvTaaqTCLMYxI7nhtLpFN1jR755FRQFcOzrrDbh7QhypjdvlYw"
    "cdAMSZgp9JMHxbM23wPSuH6BOFgxejz35PScZfhDPvTOxIy1jc3MZsWrMC3P324zNolO7JdW"
    "CX2I5UDKjjaEJfxbgVgJIXxtQGlmj2xkO5sPpjULQV4X2HlY7FQleJ4QRaJIB4buhCA4vUTF"
    "eMFlxCIYUpTCsal2qsmnGOWa8WCcefrohMjDj1fjzSvSaQwlpyR1GZHF2uPOoQagiCpHpm",
}

# RocksDB's XXPH3_64bits (util/xxph3.h, built from RocksDB's source) of the bytes (7i + 3) mod
# 256 at lengths of one block of stripes and more.
ROCKSDB_LONG_VALUES = {
    1024: 0x7D54B94E043675BA,
    1025: 0x90ACDAAAACA675B0,
    1087: 0xA297A9575637CB27,
    2048: 0xE4223E0C6DC3503C,
    2111: 0xE92BC6747C08068D,
    4100: 0x2ABE20915E74E5DD,
}


def test_the_hash_is_rocksdbs_hash64() -> None:
    for data, expected in ROCKSDB_SMALL_VALUES:
        assert hash64(data) == expected, data
    letters = "abcdefghijklmnopqrstuvwxyz123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    for word, descriptor in ROCKSDB_DESCRIPTORS.items():
        text = word * (430 // len(word) + 1)
        got = "".join(letters[hash64(text[:n]) % 61] for n in range(430))
        assert got == descriptor, word
    for length, expected in ROCKSDB_LONG_VALUES.items():
        assert hash64(bytes((7 * i + 3) % 256 for i in range(length))) == expected, length


def test_the_hash_is_not_the_final_xxh3() -> None:
    """Why the hash is written out: the xxhash package's XXH3 differs from RocksDB's at every
    length (the preview it froze mixed short inputs otherwise and avalanched with another
    multiplier)."""
    rng = random.Random(11)
    for length in range(0, 2100, 7):
        data = rng.randbytes(length)
        assert xxhash.xxh3_64_intdigest(data) != hash64(data), length


# --- databases written with the project's options -------------------------------------------

RESOURCES = shared_resources(64, 32)


def keys_of_every_length(rng: random.Random) -> list[bytes]:
    """Many keys of each length from 0 to 300 bytes, and some up to 1100 (past the hash's
    blocks of 1024 bytes)."""
    keys = {b""} | {bytes([b]) for b in range(256)}
    for length in range(2, 301):
        keys.update(rng.randbytes(length) for _ in range(400))
    for length in range(301, 1101, 3):
        keys.update(rng.randbytes(length) for _ in range(20))
    return sorted(keys)


def keys_the_store_writes(rng: random.Random) -> list[bytes]:
    """Physical keys of the store's column families, with the key schemas of common queries."""
    families = [
        (ColumnFamily("default", pa.schema([("id", pa.int64())]), pa.schema([])), 60_000),
        (ColumnFamily("dedup", pa.schema([("id", pa.string())]), pa.schema([])), 40_000),
        (
            ColumnFamily(
                "window",
                pa.schema([("user", pa.string()), ("start", pa.timestamp("us"))]),
                pa.schema([]),
            ),
            40_000,
        ),
        (
            ColumnFamily("pair", pa.schema([("a", pa.int32()), ("b", pa.int64())]), pa.schema([])),
            20_000,
        ),
    ]
    rows: dict[str, Callable[[int], tuple[object, ...]]] = {
        "default": lambda i: (rng.randrange(-(1 << 62), 1 << 62),),
        "dedup": lambda i: (f"{rng.getrandbits(128):032x}-{i}",),
        "window": lambda i: (f"user{rng.randrange(10**6)}", rng.randrange(1 << 50)),
        "pair": lambda i: (rng.randrange(1 << 31), rng.randrange(1 << 62)),
    }
    keys: set[bytes] = set()
    for family, count in families:
        keys.update(family.physical_keys([rows[family.name](i) for i in range(count)]))
    return sorted(keys)


def build(path: Path, keys: list[bytes], *, partitioned: bool = True) -> rocksdict.Rdict:
    """A database of ``keys`` written with the project's options in rounds that leave files on
    several levels: half the keys, the other half (compacted to the bottom together), then
    overwrites, deletions and a range deletion in newer files, some flushed to level 0."""
    opts = db_options(LocalDBConf(), RESOURCES, create=True)
    if not partitioned:
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_format_version(5)
        table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
        opts.set_block_based_table_factory(table)
    db = rocksdict.Rdict(str(path), opts)
    rng = random.Random(5)
    write(db, {k: b"a" + k[:20] for k in keys[::2]})
    db.flush()
    write(db, {k: b"b" + k[:20] for k in keys[1::2]})
    db.flush()
    db.compact_range(None, None)
    write(db, {k: b"c" + k[:20] for k in rng.sample(keys, len(keys) // 10)})
    for k in rng.sample(keys, len(keys) // 20):
        db.delete(k)
    db.delete_range(keys[len(keys) // 3], keys[len(keys) // 3 + 500])
    db.flush()
    write(db, {k: b"d" + k[:20] for k in rng.sample(keys, len(keys) // 50)})
    db.flush()
    return db


DatabaseCase = tuple[str, rocksdict.Rdict, list[bytes], Path]


@pytest.fixture(scope="module", params=["lengths", "store keys", "whole filter"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DatabaseCase]:
    base = tmp_path_factory.mktemp("filter")
    rng = random.Random(3)
    every_length = request.param == "lengths"
    keys = keys_of_every_length(rng) if every_length else keys_the_store_writes(rng)
    db = build(base / "db", keys, partitioned=request.param != "whole filter")
    yield request.param, db, keys, checkpoint(db, base / "checkpoint")
    db.close()


def open_set(where: Path) -> SstSet:
    """The SST files of a checkpoint, each read from a copy in memory."""
    return SstSet([SstFile(*file_reader(p), p.name) for p in sorted(where.glob("*.sst"))])


def user_keys(sst: SstFile) -> Iterator[bytes]:
    """The user key of every entry of a file, read through its index."""
    index = sst._top  # noqa: SLF001
    tops = [sst._partition(h) for h in index.handles] if sst._two_level else [index]  # noqa: SLF001
    for top in tops:
        for handle in top.handles:
            for entry, _ in block_entries(sst._data_block(handle)):  # noqa: SLF001
                yield split_internal_key(entry)[0]


def number(sst: SstFile, name: bytes) -> int:
    return decode_varint(sst.properties[name], 0)[0]


def test_no_key_a_file_holds_is_ruled_out(database: DatabaseCase) -> None:
    """Every entry of every file (values, deletions, keys overwritten in newer files) passes
    its file's filter; a false negative would lose the key's state."""
    _, db, keys, where = database
    ssts = open_set(where)
    assert len(ssts.files) >= 3
    assert len({f["level"] for f in db.live_files()}) >= 2
    for sst in ssts.files:
        seen = 0
        for user_key in user_keys(sst):
            assert sst.may_contain(user_key), (sst.name, user_key)
            seen += 1
        entries = number(sst, b"rocksdb.num.entries") - number(sst, b"rocksdb.num.range-deletions")
        assert seen == entries
    sample = random.Random(1).sample(keys, 20_000)
    assert ssts.get_many(sample) == [db.get(k) for k in sample]


def test_the_filters_are_read_partitioned_or_whole(database: DatabaseCase) -> None:
    """Every file has a filter the reader reads: partitioned as the project writes them (the
    largest file in many partitions), or whole."""
    kind, _, keys, where = database
    ssts = open_set(where)
    filters = [f._filter for f in ssts.files]  # noqa: SLF001
    assert all(f is not None and f.partitioned == (kind != "whole filter") for f in filters)
    largest = max(ssts.files, key=lambda f: f.size)
    top = largest._filter_top  # noqa: SLF001
    assert (top is None) if kind == "whole filter" else (top is not None and len(top.handles) > 4)
    absent = [k + b"\x01" for k in random.Random(4).sample(keys, 2000)]
    assert sum(largest.may_contain(k) for k in absent) < 0.05 * len(absent)


# --- what a filter saves --------------------------------------------------------------------

N = 200_000


def reads_per_lookup(ssts: SstSet, absent: list[bytes]) -> float:
    before = ssts.reads
    assert all(ssts.get(k) is None for k in absent)
    return (ssts.reads - before) / len(absent)


def test_an_absent_key_mostly_costs_no_read(tmp_path: Path) -> None:
    """With the filter, a key a file does not hold is ruled out but for about 1% false
    positives (10 bits a key), and once the filter's partitions are read costs no read at all;
    without one, each file over its range reads a data block."""
    rng = random.Random(2)
    warm_up = sorted(key(i) + b"\x00" for i in rng.sample(range(0, N, 2), 20_000))
    absent = sorted(key(i) + b"\x00" for i in rng.sample(range(0, N, 2), 400))
    cold, warm = {}, {}
    for bits in (10, 0):
        conf = LocalDBConf(bloom_bits_per_key=bits)
        db = rocksdict.Rdict(str(tmp_path / f"db{bits}"), db_options(conf, RESOURCES, create=True))
        write(db, {key(i): b"v" * 40 for i in range(0, N, 2)})
        where = checkpoint(db, tmp_path / f"checkpoint{bits}")
        db.close()
        ssts = open_set(where)
        for sst in ssts.files:
            sst._cache_bytes = 16 * 1024  # noqa: SLF001  (a data block read is not kept)
        cold[bits] = reads_per_lookup(ssts, absent)
        reads_per_lookup(ssts, warm_up)
        warm[bits] = reads_per_lookup(ssts, absent)
        if bits:
            covered = [(f, k) for f in ssts.files for k in warm_up if f._top.find(k)]  # noqa: SLF001
            positives = sum(f.may_contain(k) for f, k in covered) / len(covered)
            assert len(covered) >= len(warm_up)
            assert 0.003 < positives < 0.02, positives
    assert cold[0] > 0.8 and warm[0] > 0.8, (cold, warm)
    assert cold[10] < 0.5 and warm[10] < 0.04, (cold, warm)


# --- filters the reader does not read --------------------------------------------------------


def test_only_a_fast_local_bloom_filter_is_read() -> None:
    lines = b"\xff" * 64 * 3
    assert BloomFilter.parse(lines + b"\xff\x00\x06\x00\x00") is not None
    for metadata in (
        b"\x06\x00\x00\x00\x03",  # the legacy Bloom: its probe count, its cache lines
        b"\xfe\x00\x06\x00\x00",  # Ribbon
        b"\xfd\x00\x06\x00\x00",  # reserved
        b"\xff\x01\x06\x00\x00",  # another Bloom implementation
        b"\xff\x00\x26\x00\x00",  # cache lines of 128 bytes
        b"\xff\x00\x00\x00\x00",  # no probes
        b"\xff\x00\x1f\x00\x00",  # 31 probes
        b"\xff\x00\x06\x01\x00",  # a seed
    ):
        assert BloomFilter.parse(lines + metadata) is None, metadata
    assert BloomFilter.parse(lines[:-1] + b"\xff\x00\x06\x00\x00") is None
    assert BloomFilter.parse(b"") is None
    assert BloomFilter.parse(b"\xff\x00\x06\x00\x00") is None  # empty: no key, read the data


def small_db(path: Path, change: str) -> tuple[rocksdict.Rdict, Path]:
    """5000 keys written with the project's options but one, and its checkpoint."""
    opts = db_options(
        LocalDBConf(bloom_bits_per_key=0 if change == "none" else 10), RESOURCES, create=True
    )
    if change == "legacy":
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_format_version(4)
        opts.set_block_based_table_factory(table)
    if change == "prefix":
        opts.set_prefix_extractor(rocksdict.SliceTransform.create_fixed_prefix(5))
    if change.startswith("metadata"):
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_format_version(5)
        table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_metadata_block_size(256)
        table.set_checksum_type(rocksdict.ChecksumType.no_checksum())
        opts.set_block_based_table_factory(table)
    db = rocksdict.Rdict(str(path / "db"), opts)
    write(db, {key(i): b"v" * 30 for i in range(0, 10_000, 2)})
    return db, checkpoint(db, path / "checkpoint")


def rewrite_filter_metadata(where: Path, at: int, byte: int) -> int:
    """Set byte ``at`` of the metadata of each filter partition of the files (written without
    checksums); the number of partitions changed."""
    changed = 0
    for path in where.glob("*.sst"):
        data = bytearray(path.read_bytes())
        sst = SstFile(lambda o, n, d=bytes(data): d[o : o + n], len(data), path.name)
        top = sst._filter_top  # noqa: SLF001
        assert top is not None
        for handle in top.handles:
            data[handle.offset + handle.size - 5 + at] = byte
            changed += 1
        path.write_bytes(bytes(data))
    return changed


@pytest.mark.parametrize(
    "change",
    ["none", "legacy", "prefix", "metadata-probes", "metadata-ribbon", "metadata-implementation"],
)
def test_a_file_whose_filter_is_not_read_answers_right(tmp_path: Path, change: str) -> None:
    """No filter, the legacy Bloom of format version 4, a filter over prefixes too, metadata of
    another filter: every key may be in the file, and lookups answer as RocksDB does."""
    db, where = small_db(tmp_path, change)
    if change.startswith("metadata"):
        at, byte = {"probes": (2, 0), "ribbon": (0, 0xFE), "implementation": (1, 1)}[
            change.split("-")[1]
        ]
        assert rewrite_filter_metadata(where, at, byte) > 4
    ssts = open_set(where)
    for sst in ssts.files:
        found = sst._filter  # noqa: SLF001
        prefixes = sst.properties[b"rocksdb.block.based.table.prefix.filtering"] == b"1"
        assert (found is None) == (change in ("none", "prefix")), change
        assert prefixes == (change == "prefix")
        assert found is None or found.partitioned == (change != "legacy")
    keys = [key(i) for i in range(10_200)] + [key(i) + b"\x00" for i in range(0, 10_000, 7)]
    assert all(f.may_contain(k) for f in ssts.files for k in keys)
    assert ssts.get_many(keys) == [db.get(k) for k in keys]
    db.close()


def test_a_partitioned_filter_of_small_partitions_is_read(tmp_path: Path) -> None:
    """The same file as above with its metadata intact: many filter partitions, all read."""
    db, where = small_db(tmp_path, "metadata")
    ssts = open_set(where)
    tops = [f._filter_top for f in ssts.files]  # noqa: SLF001
    assert all(top is not None and len(top.handles) > 4 for top in tops)
    keys = [key(i) for i in range(10_200)] + [key(i) + b"\x00" for i in range(0, 10_000, 7)]
    assert ssts.get_many(keys) == [db.get(k) for k in keys]
    absent = [k for k in keys if db.get(k) is None]
    ruled_out = sum(not f.may_contain(k) for f in ssts.files for k in absent)
    assert ruled_out > 0.95 * len(absent) * len(ssts.files)
    db.close()
