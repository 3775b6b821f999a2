"""RocksDB snapshots on durable storage: a manifest naming SST files uploaded once and shared.

A snapshot of version ``v`` is a local RocksDB checkpoint (hard links, taken at commit while the
database is at ``v``) that maintenance uploads later: every SST file not uploaded before goes to
``sst/<name>-<uuid>.sst``; then ``<v>_<id>.snapshot`` is written, a framed JSON manifest listing
the SST objects with sizes and CRC-32s, and the small files (MANIFEST, CURRENT, OPTIONS) inline.
The manifest is written last, so a snapshot is visible only once all its files are.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import shutil
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.files.durable import DurableDir
from sparkstate.store.frames import decode_frame, encode_frame
from sparkstate.store.rocksdb.sst_read import SstFile, SstSet
from sparkstate.store.versions.layout import VersionRef, file_name

__all__ = ["RemoteSnapshot", "SstMap", "download_snapshot", "read_manifest", "upload_snapshot"]

MANIFEST_KIND = b"RSNP"
SST_DIR = "sst"
_CHUNK = 8 << 20
#: Files a lazy restore opens at once.
_OPENING_THREADS = 8


def _crc_file(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


class SstMap:
    """Which durable object each local SST file of one database incarnation was uploaded as.

    SST files are immutable and RocksDB never reuses a file number within one database, so within
    one *incarnation* (the life of a local database between wipes and restores) ``(local name,
    size)`` identifies the content. Every wipe or restore starts a new incarnation; a checkpoint
    records the incarnation it was taken in, and only the same incarnation's entries are reused.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self.incarnation = ""
        try:
            with open(path) as f:
                saved = json.load(f)
            self.entries = dict(saved["entries"])
            self.incarnation = str(saved["incarnation"])
        except (OSError, ValueError, KeyError, TypeError):
            self.entries, self.incarnation = {}, ""

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"incarnation": self.incarnation, "entries": self.entries}, f)
        os.replace(tmp, self.path)

    def reset(self, entries: dict[str, dict[str, Any]] | None = None) -> str:
        """Start a new incarnation (holding ``entries``); returns its id."""
        self.entries = dict(entries or {})
        self.incarnation = uuid.uuid4().hex
        self.save()
        return self.incarnation


def upload_snapshot(
    store_dir: DurableDir,
    ref: VersionRef,
    checkpoint_dir: str,
    files: list[str],
    sst_map: SstMap,
    incarnation: str,
    extra: dict[str, Any],
    compression: str,
) -> tuple[int, int, int]:
    """Upload a local checkpoint as the snapshot of ``ref``; returns (uploaded, reused, bytes).

    SST files already uploaded from the same database incarnation are named, not uploaded again.
    """
    same = bool(incarnation) and incarnation == sst_map.incarnation
    sst_dir = store_dir.child(SST_DIR)
    uploaded = reused = nbytes = 0
    ssts: dict[str, dict[str, Any]] = {}
    inline: dict[str, str] = {}
    for name in files:
        path = os.path.join(checkpoint_dir, name)
        size = os.path.getsize(path)
        if not name.endswith(".sst"):
            with open(path, "rb") as f:
                inline[name] = base64.b64encode(f.read()).decode()
            continue
        known = sst_map.entries.get(name) if same else None
        if known is not None and known["size"] == size:
            ssts[name] = known
            reused += 1
            continue
        stem = name.removesuffix(".sst")
        durable_name = f"{stem}-{uuid.uuid4().hex}.sst"
        crc = _crc_file(path)
        nbytes += sst_dir.upload(path, durable_name)
        ssts[name] = {"object": durable_name, "size": size, "crc32": crc}
        if same:
            sst_map.entries[name] = ssts[name]
        uploaded += 1
    if same:
        sst_map.save()
    manifest = {
        "version": ref.version,
        "checkpoint_id": ref.checkpoint_id,
        "sst": ssts,
        "inline": inline,
        **extra,
    }
    data = encode_frame(MANIFEST_KIND, json.dumps(manifest).encode(), compression)
    store_dir.write_atomic(file_name(ref, "snapshot"), data)
    return uploaded, reused, nbytes


def read_manifest(store_dir: DurableDir, ref: VersionRef) -> dict[str, Any]:
    name = file_name(ref, "snapshot")
    where = store_dir.where(name)
    payload = decode_frame(MANIFEST_KIND, store_dir.read(name), where)
    try:
        manifest: dict[str, Any] = json.loads(payload)
        manifest["sst"], manifest["inline"]  # noqa: B018 - validate the shape
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"corrupt state file {where}: bad snapshot manifest: {exc}"
        raise CorruptStateFileError(msg) from exc
    return manifest


def download_snapshot(
    store_dir: DurableDir,
    ref: VersionRef,
    dest_dir: str,
    manifest: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str], int]:
    """Download the snapshot of ``ref`` into the new directory ``dest_dir``, checking CRCs
    (``manifest``: its manifest, where the caller read it already).

    Returns (manifest, local file names, bytes downloaded). A damaged manifest or SST file raises
    :class:`CorruptStateFileError` naming it (the caller then falls back to an older snapshot).
    """
    if manifest is None:
        manifest = read_manifest(store_dir, ref)
    shutil.rmtree(dest_dir, ignore_errors=True)
    os.makedirs(dest_dir)
    sst_dir = store_dir.child(SST_DIR)
    nbytes = 0
    for name, entry in manifest["sst"].items():
        path = os.path.join(dest_dir, name)
        nbytes += sst_dir.download(entry["object"], path)
        if os.path.getsize(path) != entry["size"] or _crc_file(path) != entry["crc32"]:
            msg = (
                f"corrupt state file {sst_dir.where(entry['object'])}: size or checksum does not "
                f"match snapshot {store_dir.where(file_name(ref, 'snapshot'))}"
            )
            raise CorruptStateFileError(msg)
    for name, data in manifest["inline"].items():
        with open(os.path.join(dest_dir, name), "wb") as f:
            f.write(base64.b64decode(data))
    return manifest, sorted(manifest["sst"]) + sorted(manifest["inline"]), nbytes


class RemoteSnapshot:
    """A snapshot's state read from its SST files on durable storage, a block at a time
    (:mod:`.sst_read`), with no file downloaded: the remote view of a lazy restore.

    Opening reads the end of each file, the files at once (on S3 each is a round trip or
    two); a damaged one raises CorruptStateFileError, a file written with a feature the reader
    does not take :class:`~.sst_read.SstFormatError`."""

    def __init__(self, store_dir: DurableDir, manifest: dict[str, Any]) -> None:
        sst_dir = store_dir.child(SST_DIR)
        entries = [entry for _, entry in sorted(manifest["sst"].items())]

        def open_file(entry: dict[str, Any]) -> SstFile:
            ranged = sst_dir.open_ranged(entry["object"])
            if ranged.size != int(entry["size"]):
                msg = (
                    f"corrupt state file {sst_dir.where(entry['object'])}: {ranged.size} bytes, "
                    f"the snapshot's manifest says {entry['size']}"
                )
                raise CorruptStateFileError(msg)
            return SstFile(ranged.read, ranged.size, sst_dir.where(entry["object"]))

        if len(entries) <= 1:
            files = [open_file(e) for e in entries]
        else:
            workers = min(_OPENING_THREADS, len(entries))
            with concurrent.futures.ThreadPoolExecutor(workers, "sst-open") as pool:
                files = list(pool.map(open_file, entries))
        self._ssts = SstSet(files)

    @property
    def reads(self) -> int:
        """Ranged reads made so far."""
        return self._ssts.reads

    @property
    def bytes_read(self) -> int:
        """The bytes those reads returned."""
        return self._ssts.bytes_read

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in the snapshot (None: absent)."""
        return self._ssts.get_many(keys)

    def last_below(self, end: bytes) -> bytes | None:
        """A bound of the snapshot's keys below ``end`` (:meth:`.SstSet.last_below`)."""
        return self._ssts.last_below(end)
