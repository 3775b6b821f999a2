"""A partition of Spark's own RocksDB state store, read from its checkpoint files: the take-over of
a Spark query's state without Spark's state data source (:mod:`sparkstate.engine.jobs.take_over`).

Spark's RocksDB provider (``RocksDBFileManager.scala``) keeps, per partition, a snapshot of each
version it uploaded as ``<version>.zip`` (``<version>_<unique id>.zip`` with checkpoint format
v2): the database's small files (``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*``, logs) and a
``metadata`` file, a line ``v1`` (or ``v2``) and a JSON object that names the SST files, kept
once for every version under ``SSTs/`` as ``<local name without .sst>-<uuid>.sst``, with their
local names (``sstFiles``), and the key count (``numKeys``). Each key and value is one byte of
Spark's state encoding version (0) and the row's ``UnsafeRow`` (``RocksDBStateEncoder.scala``).

What this module does not read raises :class:`~sparkstate.store.spark_files.UnreadableRows`,
and the caller reads the partition with Spark's state data source instead: a version that has
no snapshot (with changelog checkpointing, most versions are a changelog on an older snapshot),
a store with column families (``transformWithState``), another encoding version.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from typing import Any

import numpy as np
import pyarrow as pa
import rocksdict

from sparkstate.files.durable import DurableDir
from sparkstate.store.rocksdb import mark_opened
from sparkstate.store.spark_files import UnreadableRows

__all__ = ["ROW_START", "snapshot_name", "spark_rocksdb_rows"]

#: Spark's ``STATE_ENCODING_VERSION``, the first byte of each key and value it writes.
ENCODING_VERSION = 0
#: Where a row's ``UnsafeRow`` starts in a key or value, after the version's byte.
ROW_START = 1
SST_DIR = "SSTs"
_METADATA = "metadata"
_READAHEAD = 8 << 20
_ENTRY = pa.struct([("key", pa.binary()), ("value", pa.binary())])


def snapshot_name(version: int, unique_id: str | None = None) -> str:
    """The snapshot file of ``version`` (with format v2, of the store's ``unique_id``)."""
    return f"{version}.zip" if unique_id is None else f"{version}_{unique_id}.zip"


def spark_rocksdb_rows(
    partition: DurableDir, version: int, unique_id: str | None = None
) -> tuple[pa.BinaryArray, pa.BinaryArray]:
    """Every key of Spark's RocksDB store at ``version`` (in ``partition``, its directory) and
    its value, each as Spark encoded it: the encoding version's byte (checked), then the row's
    ``UnsafeRow`` (from :data:`ROW_START`)."""
    name = snapshot_name(version, unique_id)
    if not partition.exists(name):
        msg = f"{partition.where(name)}: no snapshot of version {version}"
        raise UnreadableRows(msg)
    scratch = tempfile.mkdtemp(prefix="sparkstate-spark-rocksdb-")
    try:
        archive = os.path.join(scratch, name)
        partition.download(name, archive)
        db_dir = os.path.join(scratch, "db")
        with zipfile.ZipFile(archive) as z:
            z.extractall(db_dir)
        os.remove(archive)
        metadata = _metadata(os.path.join(db_dir, _METADATA), partition.where(name))
        ssts = partition.child(SST_DIR)
        for sst in metadata.get("sstFiles", []):
            ssts.download(sst["dfsSstFileName"], os.path.join(db_dir, sst["localFileName"]))
        keys, values = _rows(db_dir, partition.where(name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    expected = metadata.get("numKeys")
    if isinstance(expected, int) and expected >= 0 and expected != len(keys):
        msg = f"{partition.where(name)}: {len(keys)} keys where its metadata says {expected}"
        raise UnreadableRows(msg)
    _check_version(keys, name)
    _check_version(values, name)
    return keys, values


def _metadata(path: str, where: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        header, _, body = f.read().partition("\n")
    os.remove(path)
    if header.strip() not in ("v1", "v2"):
        msg = f"{where}: a snapshot's metadata of version {header.strip()!r}"
        raise UnreadableRows(msg)
    metadata = json.loads(body)
    if metadata.get("columnFamilyMapping"):
        msg = f"{where}: a store with column families"
        raise UnreadableRows(msg)
    return dict(metadata)


def _rows(db_dir: str, where: str) -> tuple[pa.BinaryArray, pa.BinaryArray]:
    mark_opened()
    try:
        db = rocksdict.Rdict(
            db_dir, rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only()
        )
    except Exception as exc:  # rocksdict raises its errors as Exception
        msg = f"{where}: not a RocksDB database this reader opens ({exc})"
        raise UnreadableRows(msg) from exc
    read = rocksdict.ReadOptions()
    read.fill_cache(False)  # type: ignore[call-arg]  # each block is read once (the stub lacks its flag)
    read.set_readahead_size(_READAHEAD)
    try:
        # one pass, each entry straight into Arrow: the fastest of rocksdict's ways to read all
        entries = pa.array(db.items(read_opt=read), _ENTRY)
    finally:
        db.close()
    assert isinstance(entries, pa.StructArray)
    return entries.field(0), entries.field(1)


def _check_version(rows: pa.BinaryArray, where: str) -> None:
    _, offsets, data = rows.buffers()
    if len(rows) == 0 or offsets is None or data is None:
        return
    starts = np.frombuffer(offsets, np.int32, len(rows), 4 * rows.offset)
    lengths = np.diff(np.frombuffer(offsets, np.int32, len(rows) + 1, 4 * rows.offset))
    if (lengths < ROW_START).any() or (
        np.frombuffer(data, np.uint8)[starts] != ENCODING_VERSION
    ).any():
        msg = f"{where}: rows of a state encoding other than version {ENCODING_VERSION}"
        raise UnreadableRows(msg)
