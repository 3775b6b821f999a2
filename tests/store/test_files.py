"""Durable files: frames, changelogs, names, the version index, the schema check."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from sparkstate.exceptions import (
    ConfigurationError,
    CorruptStateFileError,
    MissingVersionError,
    ProviderMismatchError,
    SchemaMismatchError,
)
from sparkstate.files.durable import DurableDir, canonical_location, local_path
from sparkstate.store.frames import decode_frame, encode_frame
from sparkstate.store.schema_file import schema_description
from sparkstate.store.versions.changelog import ChangelogReader, decode_changelog, encode_changelog
from sparkstate.store.versions.layout import (
    VersionIndex,
    VersionRef,
    check_schema_file,
    file_name,
    new_checkpoint_id,
    parse_file_name,
)


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_frame_round_trip(codec: str) -> None:
    payload = b"state" * 1000
    assert decode_frame(b"TEST", encode_frame(b"TEST", payload, codec), "f") == payload


def test_frame_detects_truncation_bit_flips_and_wrong_kind() -> None:
    data = encode_frame(b"TEST", b"x" * 5000, "zstd")
    with pytest.raises(CorruptStateFileError, match="file-a: truncated"):
        decode_frame(b"TEST", data[:-3], "file-a")
    with pytest.raises(CorruptStateFileError, match="truncated"):
        decode_frame(b"TEST", data[:10], "file-a")
    flipped = bytearray(data)
    flipped[-5] ^= 0x10
    with pytest.raises(CorruptStateFileError, match="file-b: checksum"):
        decode_frame(b"TEST", bytes(flipped), "file-b")
    with pytest.raises(CorruptStateFileError, match="expected"):
        decode_frame(b"OTHR", data, "file-c")


def test_changelog_round_trip_keeps_deletes_and_parent() -> None:
    header = {"version": 3, "checkpoint_id": "abc", "parent": [2, "def"], "count": 3}
    data = encode_changelog(b"CLOG", header, [b"a", b"b", b""], [b"1", None, b"3"], "zstd")
    log = decode_changelog(b"CLOG", data, "x")
    assert log.keys == [b"a", b"b", b""]
    assert log.values == [b"1", None, b"3"]
    assert log.parent == (2, "def")


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_reader_reads_rows_in_chunks_once(codec: str) -> None:
    keys = [b"%05d" % i for i in range(10)]
    values: list[bytes | None] = [None if i % 3 == 0 else b"v%d" % i for i in range(10)]
    data = encode_changelog(b"CLOG", {"parent": [1, "a"]}, keys, values, codec, batch_rows=4)
    reader = ChangelogReader(b"CLOG", data, "f")
    assert reader.parent == (1, "a")
    got = list(reader.chunks(max_rows=3))
    assert [len(k) for k, _ in got] == [3, 1, 3, 1, 2]  # a chunk never spans record batches
    assert [k for ks, _ in got for k in ks] == keys
    assert [v for _, vs in got for v in vs] == values
    with pytest.raises(RuntimeError, match="read once"):
        list(reader.chunks())
    assert list(ChangelogReader(b"CLOG", data, "f").rows()) == list(zip(keys, values, strict=True))


def test_checkpoint_ids_sort_by_creation_and_names_parse() -> None:
    ids = [new_checkpoint_id() for _ in range(100)]
    assert ids == sorted(ids)
    ref = VersionRef(12, ids[0])
    assert parse_file_name(file_name(ref, "delta")) == (ref, "delta")
    assert parse_file_name("12_nothex.delta") is None
    assert parse_file_name("_schema.json") is None


def test_atomic_write_leaves_no_temporary_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = DurableDir(str(tmp_path / "a"))
    d.write_atomic("f", b"1")
    d.write_atomic("f", b"2")
    assert d.read("f") == b"2"
    assert [e.name for e in d.list(include_tmp=True)] == ["f"]
    with pytest.raises(MissingVersionError, match="missing state file"):
        d.read("nope")
    assert d.list() == [] or d.child("sub").list() == []


def test_local_path_tells_local_locations_from_other_uris(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert local_path(str(tmp_path)) == str(tmp_path)
    assert local_path("relative/dir") == os.path.join(os.getcwd(), "relative/dir")
    assert local_path(f"file://{tmp_path}") == str(tmp_path)
    assert local_path("s3://bucket/ckpt") is None
    assert local_path("hdfs://namenode:8020/ckpt") is None
    assert local_path(f"file:{tmp_path}") == str(tmp_path)  # Hadoop's spelling
    assert local_path(f"file://localhost{tmp_path}") == str(tmp_path)
    with pytest.raises(ConfigurationError, match="host 'host'"):
        local_path("file://host/x")  # not "host/x" under the working directory


def test_canonical_location_is_one_spelling_per_directory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    spellings = [
        str(real),
        f"{real}/",
        f"file://{real}",
        f"file:{real}",
        "real",
        "./real",
        f"{tmp_path}/./real",
        f"{tmp_path}/link",
        "link/../real",
    ]
    assert {canonical_location(s) for s in spellings} == {str(real.resolve())}
    uri = "s3://bucket/ckpt?endpoint_override=localhost:9000&scheme=http"
    assert canonical_location(uri) == uri
    assert canonical_location("s3://bucket/ckpt/") == "s3://bucket/ckpt"
    for uri in (str(tmp_path), f"file://{tmp_path}", f"file://{tmp_path}/"):
        d = DurableDir(uri)
        assert isinstance(d.fs, pafs.LocalFileSystem) and d.path == str(tmp_path)
        d.write_atomic("f", uri.encode())
        assert (tmp_path / "f").read_bytes() == uri.encode()


def test_files_under_an_s3_uri_are_named_with_the_query_at_the_end() -> None:
    d = DurableDir("s3://bucket/ckpt?endpoint_override=localhost:9000&scheme=http")
    where = d.child("state", "0").where("1_a.changelog")
    assert (
        where
        == "s3://bucket/ckpt/state/0/1_a.changelog?endpoint_override=localhost:9000&scheme=http"
    )
    assert DurableDir("/tmp/ckpt").where("metadata.json") == "/tmp/ckpt/metadata.json"


def test_index_resolves_newest_attempt_and_names_missing_versions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = DurableDir(str(tmp_path))
    first, second = VersionRef(1, new_checkpoint_id()), VersionRef(1, new_checkpoint_id())
    for ref in (first, second):
        d.write_atomic(file_name(ref, "delta"), b"")
    index = VersionIndex.scan(d)
    assert index.resolve(1, None, "delta", "store") == second
    assert index.resolve(1, first.checkpoint_id, "delta", "store") == first
    with pytest.raises(MissingVersionError, match="version 5 does not exist.*newest committed"):
        index.resolve(5, None, "delta", "store")


def test_schema_file_refuses_changes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = DurableDir(str(tmp_path))
    k, v = pa.schema([("k", pa.int64())]), pa.schema([("v", pa.string())])
    check_schema_file(d, schema_description("memory", {"default": (k, v)}, 4), "s")
    check_schema_file(d, schema_description("memory", {"default": (k, v)}, 4), "s")
    with pytest.raises(ProviderMismatchError, match="'memory' but this query uses 'rocksdb'"):
        check_schema_file(d, schema_description("rocksdb", {"default": (k, v)}, 4), "s")
    with pytest.raises(SchemaMismatchError, match="4 state partitions.*uses 8"):
        check_schema_file(d, schema_description("memory", {"default": (k, v)}, 8), "s")
    with pytest.raises(SchemaMismatchError, match="key schema of column family 'default'"):
        check_schema_file(d, schema_description("memory", {"default": (v, v)}, 4), "s")
    more = {"default": (k, v), "timers": (k, k)}
    check_schema_file(d, schema_description("memory", more, 4), "s")
    with pytest.raises(SchemaMismatchError, match="'timers'"):
        check_schema_file(d, schema_description("memory", {"timers": (v, v)}, 4), "s")
