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
(:meth:`sparkstate.engine.driver.BatchDriver.run_batch`).
"""

from __future__ import annotations

import hashlib
import json
import logging

from sparkstate.exceptions import CorruptStateFileError, MissingVersionError, StateFileError
from sparkstate.store.durable import DurableDir

__all__ = ["input_digest", "spark_query_id"]

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
        text = checkpoint.child(OFFSETS_DIR).read(str(batch_id))
    except StateFileError as exc:
        log.debug("cannot read Spark's offsets of batch %d: %s", batch_id, exc)
        return None
    lines = text.decode("utf-8", "replace").splitlines()
    sources = "\n".join(line.strip() for line in lines[2:])
    return hashlib.sha256(sources.encode("utf-8")).hexdigest()[:32]
