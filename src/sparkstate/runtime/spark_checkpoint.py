"""What sparkstate reads in Spark's own checkpoint: the query's id, and what a batch read.

Spark keeps the query id in ``<checkpointLocation>/metadata`` (``{"id": "<uuid>"}``), written at
the first start; sparkstate writes it first with its own id, or takes Spark's, so that the
handle's ``id``, progress and ``spark.streams.get(id)`` agree.

Spark writes ``<checkpointLocation>/offsets/<b>`` before it runs batch ``b``: a version line, a
line of batch metadata (timestamp, watermark, confs), then one line per source with the offset
the batch reads up to. A batch Spark runs again after a failure reuses that file, so its source
lines are the same; a batch Spark plans again because its offsets file was deleted (the usual
way to roll a query back) reads up to wherever the sources are now. The driver records the
digest of the source lines in the batch's intent and compares it when the batch id comes back
(:meth:`sparkstate.engine.run.driver.BatchDriver.run_batch`).
"""

from __future__ import annotations

import hashlib
import json
import logging

from sparkstate.exceptions import CorruptStateFileError, MissingVersionError, StateFileError
from sparkstate.files.durable import DurableDir

__all__ = [
    "copy_spark_batch",
    "input_digest",
    "source_offsets",
    "drop_spark_batch",
    "rewrite_spark_file",
    "spark_batches",
    "spark_query_id",
]

log = logging.getLogger("sparkstate.engine")

OFFSETS_DIR = "offsets"
METADATA_FILE = "metadata"


def spark_query_id(checkpoint: DurableDir, proposed: str) -> str:
    """The id Spark runs the query under: the one in Spark's ``metadata`` file, or ``proposed``,
    written there for Spark to take when the file does not exist yet."""
    try:
        text = checkpoint.read(METADATA_FILE)
    except MissingVersionError:
        body = json.dumps({"id": proposed}) + "\n"
        checkpoint.write_atomic(METADATA_FILE, body.encode("utf-8"))
        return proposed
    try:
        found = json.loads(text)["id"]
    except (ValueError, KeyError, TypeError) as exc:
        msg = (
            f"Spark's query metadata {checkpoint.where(METADATA_FILE)} is damaged ({exc}); "
            "restore it from a copy of the checkpoint, or start from a new checkpoint location"
        )
        raise CorruptStateFileError(msg) from exc
    return str(found)


def input_digest(checkpoint: DurableDir, batch_id: int) -> str | None:
    """The digest of the source offsets of batch ``batch_id`` in Spark's offset log; None when
    the file cannot be read here (a file system the driver's Python cannot reach)."""
    try:
        sources = "\n".join(source_offsets(checkpoint, batch_id))
    except StateFileError as exc:
        log.debug("cannot read Spark's offsets of batch %d: %s", batch_id, exc)
        return None
    return hashlib.sha256(sources.encode("utf-8")).hexdigest()[:32]


def source_offsets(checkpoint: DurableDir, batch_id: int) -> list[str]:
    """The lines of batch ``batch_id`` in Spark's offset log that hold its sources' offsets,
    one per source, in the query's order of sources."""
    text = checkpoint.child(OFFSETS_DIR).read(str(batch_id))
    return [line.strip() for line in text.decode("utf-8", "replace").splitlines()[2:]]


COMMITS_DIR = "commits"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def spark_batches(checkpoint: DurableDir) -> tuple[list[int], list[int]]:
    """The batches in Spark's offset log and in its commit log, ascending."""

    def ids(name: str) -> list[int]:
        return sorted(int(e.name) for e in checkpoint.child(name).list() if e.name.isdigit())

    return ids(OFFSETS_DIR), ids(COMMITS_DIR)


def copy_spark_batch(
    checkpoint: DurableDir, source: int, target: int, shuffle_partitions: int
) -> None:
    """Write batch ``target`` into Spark's offset and commit logs as a copy of batch ``source``
    with another shuffle partition count: a batch that reads no input (its offsets are where
    ``source`` ended), as Spark's own ``StreamingCheckpointManager.repartition`` writes one."""
    offsets = checkpoint.child(OFFSETS_DIR)
    lines = offsets.read(str(source)).decode("utf-8").splitlines()
    try:
        header = json.loads(lines[1])
    except (IndexError, ValueError) as exc:
        msg = f"Spark's offsets of batch {source} ({offsets.where(str(source))}) are damaged: {exc}"
        raise CorruptStateFileError(msg) from exc
    header.setdefault("conf", {})[SHUFFLE_PARTITIONS] = str(shuffle_partitions)
    lines[1] = json.dumps(header, separators=(",", ":"))
    rewrite_spark_file(offsets, target, "\n".join(lines))
    commits = checkpoint.child(COMMITS_DIR)
    rewrite_spark_file(commits, target, commits.read(str(source)).decode("utf-8"))


def drop_spark_batch(checkpoint: DurableDir, batch_id: int) -> None:
    """Remove a batch that did not commit from Spark's offset log (a rollback: Spark plans the
    batch again over the input there is then)."""
    offsets = checkpoint.child(OFFSETS_DIR)
    for name in (f".{batch_id}.crc", str(batch_id)):
        offsets.delete(name)


def rewrite_spark_file(directory: DurableDir, batch_id: int, text: str) -> None:
    """One file of a Spark log; a stale checksum file of an earlier one under the same name
    goes first (Hadoop's local file system would check the new file against it)."""
    crc = f".{batch_id}.crc"
    if directory.exists(crc):
        directory.delete(crc)
    directory.write_atomic(str(batch_id), text.encode("utf-8"))
