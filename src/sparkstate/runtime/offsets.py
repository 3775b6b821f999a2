"""What Spark's own checkpoint says a batch read: a digest of its offsets.

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
import logging

from sparkstate.exceptions import StateFileError
from sparkstate.store.durable import DurableDir

__all__ = ["input_digest"]

log = logging.getLogger("sparkstate.engine")

OFFSETS_DIR = "offsets"


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
