"""Handing a checkpoint back to Spark's own operators: what the logs say, in what order.

``sparkstate export`` writes the state sparkstate's operators hold after the batch ``N`` Spark
last committed as version ``N + 1`` of Spark's HDFS-backed provider, in Spark's files
(``state/<operator>/<partition>/<N + 1>.snapshot``: :mod:`sparkstate.engine.jobs.export`), so
that the query run without ``ss.stream`` goes on from batch ``N + 1`` with Spark's operators.
Written in this order, so that an export killed at any point either never happened (the
wrapped query goes on from the checkpoint, and the export can run again) or completes:

1. The snapshot files. Nothing in Spark's logs names them yet, and sparkstate reads none of
   Spark's state files.
2. ``exported.json`` in the engine's directory: the commit point. From here the checkpoint is
   Spark's again.
3. Spark's logs as its own query restarts on them (:func:`settle_export`): the commit of batch
   ``N`` carries sparkstate's watermark for the next batch; the offsets from ``N - 1`` on lose
   the line of sparkstate's clock source (Spark refuses a restart whose query has another number
   of sources than its offset log) and name the HDFS-backed provider and the state's partition
   count in their settings (Spark restores those from the log, not from the session). Last, the
   engine's directory moves aside to ``sparkstate-exported/<N>/``, its mark last: a start of the
   wrapped query on the checkpoint then takes Spark's state over again, as from any checkpoint
   of Spark's (:mod:`sparkstate.runtime.take_over`).

Step 3 is done again by the next ``sparkstate export`` or the next start of the wrapped query
wherever a kill stopped it; until it is done, Spark's restart refuses the offsets (a source
count that does not match), so it never runs on a half-written checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from sparkstate.exceptions import ConfigurationError, MissingVersionError
from sparkstate.files.durable import DurableDir
from sparkstate.operators.registry import layout_of
from sparkstate.runtime.logs import LOCK_FILE, CheckpointLog
from sparkstate.runtime.progress import format_time
from sparkstate.runtime.spark_checkpoint import (
    COMMITS_DIR,
    OFFSETS_DIR,
    SHUFFLE_PARTITIONS,
    rewrite_spark_file,
    spark_batches,
)
from sparkstate.runtime.take_over import PROVIDER_CONF, is_clock

__all__ = [
    "ASIDE_DIR",
    "EXPORTED",
    "HDFS_PROVIDER",
    "Export",
    "ExportedOperator",
    "commit_export",
    "exported_aside",
    "plan_export",
    "settle_export",
]

#: The commit point of an export, in the engine's directory.
EXPORTED = "exported.json"
#: Where the engine's directory goes once the checkpoint is Spark's again, beside it.
ASIDE_DIR = "sparkstate-exported"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@dataclasses.dataclass(frozen=True)
class ExportedOperator:
    """One operator whose state is exported: its id, kind, and entry in ``metadata.json``."""

    op_id: int
    kind: str
    described: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Export:
    """The export of the checkpoint at ``location`` after Spark's batch ``batch_id``."""

    location: str
    engine_root: str
    batch_id: int
    num_partitions: int
    #: sparkstate's watermark for the batch after ``batch_id``.
    next_watermark_ms: int
    operators: list[ExportedOperator]

    @property
    def version(self) -> int:
        """The state version written: the one Spark's batch ``batch_id + 1`` loads."""
        return self.batch_id + 1

    def record(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "next_watermark_ms": self.next_watermark_ms,
            "num_partitions": self.num_partitions,
            "operators": [o.op_id for o in self.operators],
            "at": format_time(time.time()),
        }


def plan_export(location: str, engine_root: str) -> Export | None:
    """The export of the checkpoint at ``location``; None where it was exported already and
    nothing ran on it since."""
    log_ = CheckpointLog(engine_root, location)
    metadata = log_.read_metadata()
    if metadata is None:
        if exported_aside(location):
            return None
        msg = f"{location} is not a checkpoint of a query wrapped with ss.stream: nothing to export"
        raise ConfigurationError(msg)
    described = {int(o["id"]): o for o in metadata.get("operators", [])}
    kinds = {op_id: str(o["kind"]) for op_id, o in described.items()}
    not_exported = [
        f"{op_id} ({kinds[op_id]})"
        for op_id in sorted(kinds)
        if layout_of(kinds[op_id]).spark_stores(described[op_id]) is None
    ]
    if not_exported:
        msg = (
            f"{location}: the state of operator(s) {', '.join(not_exported)} cannot be written "
            "in the form of Spark's default provider: sparkstate exports aggregations (with "
            "time and session windows), deduplications, stream-stream joins, the streaming "
            "limit and applyInPandasWithState (Spark keeps a transformWithState's state in "
            "its RocksDB provider only). The checkpoint is left as it was"
        )
        raise ConfigurationError(msg)
    spark = DurableDir(location)
    _, spark_commits = spark_batches(spark)
    ours = log_.latest_commit()
    if not spark_commits or ours is None:
        msg = f"{location}: no batch has committed yet: there is no state to export"
        raise MissingVersionError(msg)
    batch_id = spark_commits[-1]  # Spark's restart goes on after its last commit
    commit = log_.read_commit(batch_id)
    if commit is None:
        msg = (
            f"{location}: Spark committed batch {batch_id} and sparkstate did not: start the "
            "wrapped query once to finish it, then export"
        )
        raise MissingVersionError(msg)
    return Export(
        location=location,
        engine_root=engine_root,
        batch_id=batch_id,
        num_partitions=int(metadata["num_partitions"]),
        next_watermark_ms=int(commit.watermark.get("watermark_ms", commit.watermark_ms)),
        operators=[
            ExportedOperator(op_id, kinds[op_id], described[op_id]) for op_id in sorted(kinds)
        ],
    )


def commit_export(plan: Export) -> None:
    """Step 2, the commit point, and step 3."""
    body = json.dumps(plan.record(), indent=2).encode("utf-8")
    DurableDir(plan.engine_root).write_atomic(EXPORTED, body)
    settle_export(plan.location, plan.engine_root)


def settle_export(location: str, engine_root: str) -> bool:
    """Step 3 where an export committed (its mark still in the engine's directory); returns
    whether there was one to finish."""
    root = DurableDir(engine_root)
    if not root.exists(EXPORTED):
        return False
    record = json.loads(root.read(EXPORTED).decode("utf-8"))
    batch_id = int(record["batch_id"])
    spark = DurableDir(location)
    commits = spark.child(COMMITS_DIR)
    body = {"nextBatchWatermarkMs": int(record["next_watermark_ms"])}
    rewrite_spark_file(commits, batch_id, "v1\n" + json.dumps(body, separators=(",", ":")))
    offsets, _ = spark_batches(spark)
    for b in (b for b in offsets if b >= batch_id - 1):
        lines = spark.child(OFFSETS_DIR).read(str(b)).decode("utf-8").rstrip("\n").split("\n")
        header = json.loads(lines[1])
        conf = header.setdefault("conf", {})
        conf[PROVIDER_CONF] = HDFS_PROVIDER
        conf[SHUFFLE_PARTITIONS] = str(record["num_partitions"])
        lines[1] = json.dumps(header, separators=(",", ":"))
        if is_clock(lines[-1]):
            lines = lines[:-1]
        rewrite_spark_file(spark.child(OFFSETS_DIR), b, "\n".join(lines))
    root.move_tree_to(spark.child(ASIDE_DIR).child(str(batch_id)), keep=(EXPORTED, LOCK_FILE))
    # the mark last, beside the logs it names: a kill before it leaves it to finish this again
    spark.child(ASIDE_DIR).write_atomic(f"{batch_id}.json", root.read(EXPORTED))
    root.delete(EXPORTED)
    return True


def exported_aside(location: str) -> list[int]:
    """The batches after which the checkpoint was handed back to Spark (each export's record,
    ``<N>.json``, beside the engine's directory it set aside)."""
    names = DurableDir(location).child(ASIDE_DIR).names()
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
