"""Taking over a checkpoint that Spark's own stateful operators wrote: what the logs say, in what
order.

A query wrapped with ``ss.stream`` and started on the checkpoint of the same query run with
Spark's operators goes on from Spark's last committed batch ``N``: the state Spark's operators
hold after ``N`` becomes version ``N + 1`` of ours, and the next batch is ``N + 1``, reading on
from where Spark's batch ``N`` ended. Written in this order, so that a take-over killed at any
point either never happened (the checkpoint is as Spark left it, and the next start takes it
over again) or completes:

1. ``take_over.json``, which marks the logs that follow as a take-over's; then each store's
   ``_schema.json``, and the state of version ``N + 1`` in each partition under a fresh
   checkpoint id (nothing names it yet).
2. ``batches/N.json`` and ``commits/N.json``: batch ``N`` as Spark ran it (its watermark, and the
   one after it, from Spark's offset and commit logs), its outcome naming the state written;
   ``clock.json``, asking for the batch without data Spark's operators would run next.
3. ``metadata.json``, which records the take-over: the commit point. Before it, a start finds
   ``take_over.json`` without ``metadata.json``, drops the logs of step 2
   (:func:`discard_unfinished_take_over`) and takes the checkpoint over again from the start.
4. Spark's operator metadata (``state/<id>/_metadata``) moves to ``spark/`` under the engine's
   directory: Spark checks a restarted query's stateful operators against it, and the query
   Spark runs from now on has none of its own. Where the query takes the clock source
   (:mod:`sparkstate.engine.spark.clock`), Spark's offsets of
   batch ``N``, of the one before it (Spark's restart reads both) and of a batch Spark planned
   after it and did not commit get the clock's line:
   Spark refuses a restart whose query has another number of sources than its offset log. A
   start finishes this step when it finds step 3 done (:func:`settle_take_over`).

Spark's own files are not changed before step 4, and its state files never: Spark's state of
batch ``N`` stays where it was.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from sparkstate.exceptions import ConfigurationError, CorruptStateFileError, SchemaMismatchError
from sparkstate.files.durable import DurableDir, join_uri
from sparkstate.runtime.logs import METADATA_FILE, CheckpointLog
from sparkstate.runtime.metadata import PARTITIONS_ASKED, partitions_asked
from sparkstate.runtime.progress import format_time
from sparkstate.runtime.records import BatchCommit, BatchIntent, OperatorCommit
from sparkstate.runtime.spark_checkpoint import (
    OFFSETS_DIR,
    SHUFFLE_PARTITIONS,
    rewrite_spark_file,
    source_offsets,
    spark_batches,
)
from sparkstate.runtime.triggers import CLOCK_FILE
from sparkstate.store.schema_file import schema_description

__all__ = [
    "CLOCK_OFFSET",
    "PROVIDER_CONF",
    "SET_ASIDE",
    "TAKEN_OVER",
    "SparkOperator",
    "TakeOver",
    "begin_take_over",
    "commit_take_over",
    "discard_unfinished_take_over",
    "is_clock",
    "plan_take_over",
    "settle_take_over",
]

#: ``metadata.json``'s record of a take-over: ``{"batch_id": N, "provider": ..., "at": ...}``.
TAKEN_OVER = "taken_over_from_spark"
#: The mark of a take-over under way, in the engine's directory (removed after the commit point).
MARK_FILE = "take_over.json"
#: Where Spark's operator metadata is set aside, under the engine's directory.
SET_ASIDE = "spark"
#: The clock's line added to Spark's offsets (the clock's initial offset: no batch asked yet).
CLOCK_OFFSET = '{"tick": 0}'
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
_POLICY_CONF = "spark.sql.streaming.multipleWatermarkPolicy"
FORMAT_VERSION_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
_STATE_DIR = "state"


@dataclasses.dataclass(frozen=True)
class SparkOperator:
    """One of Spark's stateful operators in the checkpoint, as its operator metadata names it
    (``state/<id>/_metadata/metadata``; None where Spark wrote none)."""

    op_id: int
    name: str | None
    num_partitions: int | None


@dataclasses.dataclass(frozen=True)
class TakeOver:
    """The take-over of Spark's checkpoint at ``location`` after its batch ``batch_id``."""

    location: str
    engine_root: str
    state_root: str
    batch_id: int
    num_partitions: int
    #: Spark's state store provider, as its offset log names it.
    spark_provider: str
    batch_watermark_ms: int
    next_watermark_ms: int
    batch_timestamp_ms: int
    policy: str
    operators: dict[int, SparkOperator]
    #: Spark settings its state reader needs to read the checkpoint (its format's).
    read_conf: dict[str, str]
    #: With checkpoint format v2, the id of the state each operator's partitions committed
    #: (Spark's commit's ``stateUniqueIds``, the first store's of each partition), by operator.
    unique_ids: dict[int, list[str | None]]
    #: ``metadata.json`` as it is written at the commit point.
    metadata: dict[str, Any]

    @property
    def provider(self) -> str:
        """sparkstate's provider the state is written for."""
        return str(self.metadata["provider"])

    @property
    def version(self) -> int:
        """The state version the take-over writes (the one batch ``batch_id + 1`` loads)."""
        return self.batch_id + 1

    def schema_record(self, families: dict[str, Any]) -> dict[str, Any]:
        """A store's ``_schema.json``, for an operator's column families."""
        return schema_description(str(self.metadata["provider"]), families, self.num_partitions)


def _header(spark: DurableDir, batch_id: int) -> dict[str, Any]:
    offsets = spark.child(OFFSETS_DIR)
    try:
        header = json.loads(offsets.read(str(batch_id)).decode("utf-8").splitlines()[1])
    except (IndexError, ValueError) as exc:
        msg = f"Spark's offsets of batch {batch_id} ({offsets.where(str(batch_id))}) are damaged"
        raise CorruptStateFileError(msg) from exc
    return dict(header)


def _spark_commit(spark: DurableDir, batch_id: int) -> dict[str, Any]:
    """Spark's commit of ``batch_id``: ``nextBatchWatermarkMs``, and with checkpoint format
    v2, ``stateUniqueIds``."""
    commits = spark.child("commits")
    try:
        lines = commits.read(str(batch_id)).decode("utf-8").splitlines()
        return dict(json.loads(lines[1]))
    except (IndexError, ValueError, TypeError) as exc:
        msg = f"Spark's commit of batch {batch_id} ({commits.where(str(batch_id))}) is damaged"
        raise CorruptStateFileError(msg) from exc


def _unique_ids(commit: dict[str, Any]) -> dict[int, list[str | None]]:
    ids = commit.get("stateUniqueIds") or {}
    try:
        return {
            int(op): [str(stores[0]) if stores else None for stores in partitions]
            for op, partitions in ids.items()
        }
    except (AttributeError, TypeError, ValueError, IndexError):
        return {}


def spark_operators(spark: DurableDir) -> dict[int, SparkOperator]:
    """The stateful operators whose state Spark's checkpoint holds, by id."""
    out = {}
    ids = {e.name.split("/", 1)[0] for e in spark.child(_STATE_DIR).walk()}
    for op_id in sorted(int(i) for i in ids if i.isdigit()):
        name, partitions = None, None
        meta = spark.child(_STATE_DIR).child(str(op_id)).child("_metadata")
        if meta.exists("metadata"):
            try:
                body = json.loads(meta.read("metadata").decode("utf-8").splitlines()[1])
                name = str(body["operatorInfo"]["operatorName"])
                partitions = int(body["stateStoreInfo"][0]["numPartitions"])
            except (IndexError, KeyError, TypeError, ValueError):
                pass
        out[op_id] = SparkOperator(op_id, name, partitions)
    return out


def plan_take_over(
    location: str,
    engine_root: str,
    state_root: str,
    metadata: dict[str, Any],
    operator_names: dict[int, str],
) -> TakeOver | None:
    """The take-over of Spark's checkpoint at ``location``, checked against the query's
    operators (``operator_names``: Spark's name of each, by id); None where Spark committed no
    batch (there is no state to take over). ``metadata``: the ``metadata.json`` the query would
    write on a new checkpoint."""
    spark = DurableDir(location)
    offsets, commits = spark_batches(spark)
    if not commits:
        return None
    last = commits[-1]
    if last not in offsets:
        msg = (
            f"{location}: Spark committed batch {last} but its offset log has no batch {last}; "
            "restore the checkpoint"
        )
        raise ConfigurationError(msg)
    found = spark_operators(spark)
    _check_operators(location, found, operator_names)
    header = _header(spark, last)
    conf = header.get("conf", {})
    num_partitions = int(conf.get(SHUFFLE_PARTITIONS) or metadata["num_partitions"])
    batch_watermark = int(header.get("batchWatermarkMs", 0))
    commit = _spark_commit(spark, last)
    next_watermark = int(commit.get("nextBatchWatermarkMs", 0))
    # Spark's offset log does not record the checkpoint format; its state reader reads it from
    # the session, and a v2 commit names the state it committed
    read_conf = {FORMAT_VERSION_CONF: "2"} if commit.get("stateUniqueIds") else {}
    spark_provider = str(conf.get(PROVIDER_CONF, "HDFSBackedStateStoreProvider"))
    record = {
        "batch_id": last,
        "spark_provider": spark_provider.rsplit(".", 1)[-1],
        "at": format_time(time.time()),
    }
    return TakeOver(
        location=location,
        engine_root=engine_root,
        state_root=state_root,
        batch_id=last,
        num_partitions=num_partitions,
        spark_provider=spark_provider,
        batch_watermark_ms=batch_watermark,
        next_watermark_ms=max(batch_watermark, next_watermark),
        batch_timestamp_ms=int(header.get("batchTimestampMs", 0)),
        policy=str(conf.get(_POLICY_CONF, "min")).lower(),
        operators=found,
        read_conf=read_conf,
        unique_ids=_unique_ids(commit),
        metadata={
            **metadata,
            "num_partitions": num_partitions,
            # What Spark's last start asked for: a start that asks for another count rescales
            PARTITIONS_ASKED: partitions_asked(None, num_partitions),
            TAKEN_OVER: record,
        },
    )


def _check_operators(
    location: str, found: dict[int, SparkOperator], operator_names: dict[int, str]
) -> None:
    """The query's stateful operators must be the ones whose state Spark's checkpoint holds,
    under the same ids (Spark numbers them from the sink)."""
    if not found:
        msg = (
            f"checkpoint {location} has committed batches but no state: neither Spark's "
            f"({join_uri(location, _STATE_DIR)}) nor sparkstate's "
            f"({join_uri(location, 'sparkstate')} is missing): either the query ran without "
            "stateful operators, or sparkstate's directory was deleted. There is no state to "
            "continue from: restore the directory or start from a new checkpoint location"
        )
        raise ConfigurationError(msg)
    if sorted(found) != sorted(operator_names):
        msg = (
            f"{location}: Spark's checkpoint holds the state of stateful operators "
            f"{sorted(found)} but this query has operators {sorted(operator_names)}: it is not "
            "the query that wrote the checkpoint. Start it from a new checkpoint location"
        )
        raise SchemaMismatchError(msg)
    for op_id, name in sorted(operator_names.items()):
        spark_name = found[op_id].name
        if spark_name is not None and spark_name != name:
            msg = (
                f"{location}: Spark's operator {op_id} is a {spark_name} and this query's is a "
                f"{name}: it is not the query that wrote the checkpoint. Start it from a new "
                "checkpoint location"
            )
            raise SchemaMismatchError(msg)


def begin_take_over(plan: TakeOver) -> None:
    """Step 1's mark, before anything else of the take-over is written."""
    body = json.dumps(plan.metadata[TAKEN_OVER], indent=2).encode("utf-8")
    DurableDir(plan.engine_root).write_atomic(MARK_FILE, body)


def discard_unfinished_take_over(log_: CheckpointLog) -> bool:
    """Drop what a take-over that did not reach its commit point wrote into the logs (its state
    files are named by no commit, and the next take-over writes its own); a mark left after
    the commit point goes. Returns whether there was an unfinished take-over."""
    if not log_.dir.exists(MARK_FILE):
        return False
    unfinished = not log_.dir.exists(METADATA_FILE)
    if unfinished:
        for directory in (log_.commits, log_.batches):
            directory.delete_all()
        log_.dir.delete(CLOCK_FILE)
    log_.dir.delete(MARK_FILE)
    return unfinished


def commit_take_over(
    plan: TakeOver,
    written: dict[int, dict[int, tuple[str, int]]],
    clock_request: dict[str, Any] | None,
) -> None:
    """Steps 2 to 4: the batch, its outcome (``written``: per operator, per partition, the
    checkpoint id of the version written and the operator's rows in it), the commit point."""
    log_ = CheckpointLog(plan.engine_root)
    operators = {
        op_id: OperatorCommit.of_written(
            op_id, written.get(op_id, {}), plan.num_partitions, "the take-over"
        )
        for op_id in sorted(plan.operators)
    }
    log_.write_intent(
        BatchIntent(
            plan.batch_id,
            watermark_ms=plan.batch_watermark_ms,
            batch_timestamp_ms=plan.batch_timestamp_ms,
            input_digest=None,  # Spark ran it: its digest is not compared again
        )
    )
    watermark = {
        "watermark_ms": plan.next_watermark_ms,
        "max_event_time_ms": {},
        "policy": plan.policy,
    }
    log_.write_commit(
        BatchCommit(
            batch_id=plan.batch_id,
            watermark_ms=plan.batch_watermark_ms,
            watermark=watermark,
            committed_at=format_time(time.time()),
            operators=operators,
        )
    )
    if clock_request is not None:
        log_.write_clock(clock_request)
    log_.write_metadata(plan.metadata)
    log_.dir.delete(MARK_FILE)
    settle_take_over(plan.location, plan.engine_root, plan.metadata)


def settle_take_over(location: str, engine_root: str, metadata: dict[str, Any]) -> bool:
    """Step 4, where a take-over committed: Spark's operator metadata set aside, and where the
    query takes the clock source, each of Spark's offsets from the one before the batch taken
    over on given the clock's line if it lacks it. Returns whether it changed anything."""
    record = metadata.get(TAKEN_OVER)
    if not record:
        return False
    spark = DurableDir(location)
    op_ids = [int(o["id"]) for o in metadata.get("operators", [])]
    wrote = _set_aside_operator_metadata(spark, DurableDir(engine_root), op_ids)
    if not metadata.get("clock"):
        return wrote
    taken = int(record["batch_id"])
    offsets, _ = spark_batches(spark)
    # Spark's restart reads batch N and the one before; a batch Spark planned after N and did
    # not commit runs again. Batches after those were planned with the clock already.
    for batch_id in (b for b in offsets if taken - 1 <= b <= taken + 1):
        lines = source_offsets(spark, batch_id)
        if lines and is_clock(lines[-1]):
            continue
        text = spark.child(OFFSETS_DIR).read(str(batch_id)).decode("utf-8").rstrip("\n")
        rewrite_spark_file(spark.child(OFFSETS_DIR), batch_id, f"{text}\n{CLOCK_OFFSET}")
        wrote = True
    return wrote


def _set_aside_operator_metadata(
    spark: DurableDir, engine_root: DurableDir, op_ids: list[int]
) -> bool:
    """Move Spark's operator metadata (``state/<id>/_metadata``) of the operators ``op_ids`` to
    ``spark/`` under the engine's directory: Spark checks a restarted query's stateful
    operators against it, and the query Spark runs from now on has none of its own (ours run in
    its ``foreachBatch``)."""
    moved = False
    for op_id in op_ids:
        where = f"{op_id}/_metadata"
        metadata = spark.child(_STATE_DIR).child(where)
        aside = engine_root.child(SET_ASIDE).child(_STATE_DIR).child(where)
        if metadata.move_tree_to(aside):
            metadata.delete_all()
            moved = True
    return moved


def is_clock(line: str) -> bool:
    """Whether a line of Spark's offsets is sparkstate's clock source's."""
    try:
        offset = json.loads(line)
    except ValueError:
        return False
    return isinstance(offset, dict) and set(offset) == {"tick"}
