"""Rescaling a checkpoint's state to another partition count: what the logs say, and in what order.

A rescale is a batch of its own, as Spark's ``StreamingCheckpointManager.repartition`` makes one:
after the last committed batch ``L``, batch ``R`` reads no input and holds every operator's state
as of ``L``, written into the new partitioning; the next start goes on from ``R + 1``. Written in
this order, so that a rescale killed at any point either never happened or completes:

1. ``batches/R.json``, the intent, marked as a rescale. A query that starts finds it without a
   commit and drops it: the checkpoint is as it was.
2. The state of version ``R + 1`` in each new partition, under fresh checkpoint ids (nothing of
   the old lineage names them), and each store's ``_schema.json`` with the new count added.
3. ``commits/R.json``: the commit point. The old state stays where it was until here.
4. ``metadata.json`` with the new count; then Spark's ``offsets/R`` (a copy of ``L``'s, with
   ``spark.sql.shuffle.partitions`` set to the new count) and ``commits/R``. A start, or the
   rescale run again, finishes these when it finds step 3 done (:func:`settle_rescale`).

A start that asks for another partition count rescales *in place* instead (``in_place``): Spark
keeps the checkpoint's count across such a restart and its batch ids go on, so the rescale takes
no id of its own. The state of version ``L + 1`` (the one batch ``L + 1`` loads) is written into
the new partitioning under fresh checkpoint ids (step 2; the old lineage's files of that version
keep theirs), then ``commits/L.json`` is rewritten to name them, marked as a rescale (the commit
point, as step 3), and ``metadata.json`` takes the new count (step 4). Spark's logs are not
touched. Killed before the commit point, the checkpoint is as it was (the files written are
named by no commit); after it, the next start finishes step 4. Reading batch ``L``'s state
afterwards finds it in the new partitioning.

Step 2 is the engine's distributed job (:mod:`sparkstate.engine.jobs.rescale`), over the
partition reader of :mod:`sparkstate.observe.rescale` and the writer of
:mod:`sparkstate.runtime.state_moves`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from sparkstate.exceptions import ConfigurationError
from sparkstate.files.durable import DurableDir, canonical_location
from sparkstate.runtime.logs import CheckpointLog, engine_root_of
from sparkstate.runtime.migration import state_root_of
from sparkstate.runtime.progress import format_time
from sparkstate.runtime.records import BatchCommit, BatchIntent, OperatorCommit
from sparkstate.runtime.spark_checkpoint import (
    copy_spark_batch,
    drop_spark_batch,
    input_digest,
    spark_batches,
)
from sparkstate.store.capabilities import WritesVersions
from sparkstate.store.conf import StoreId
from sparkstate.store.registry import provider_class
from sparkstate.store.schema_file import read_schema_record

__all__ = [
    "RescalePlan",
    "commit_rescale",
    "plan_rescale",
    "rescale_without_state",
    "settle_rescale",
]

log = logging.getLogger("sparkstate.engine")


@dataclasses.dataclass(frozen=True)
class RescalePlan:
    """One rescale: batch ``batch_id`` moves the state of batch ``last_batch`` from
    ``from_partitions`` to ``to_partitions`` (in place: ``batch_id`` is ``last_batch``, whose
    outcome it rewrites)."""

    location: str
    engine_root: str
    state_root: str
    provider: str
    batch_id: int
    last_batch: int
    from_partitions: int
    to_partitions: int
    #: ``metadata.json``'s operator descriptions.
    operators: list[dict[str, Any]]
    #: Per operator, the checkpoint id of version ``last_batch + 1`` per old partition.
    lineage: dict[int, dict[int, str | None]]

    @property
    def version(self) -> int:
        """The state version the rescale writes (the one batch ``batch_id + 1`` loads)."""
        return self.batch_id + 1

    @property
    def in_place(self) -> bool:
        """Whether the rescale rewrites the last batch's outcome instead of taking a batch id."""
        return self.batch_id == self.last_batch


def _log_of(location: str) -> tuple[str, CheckpointLog, dict[str, Any]]:
    engine_root = engine_root_of(location)
    log_ = CheckpointLog(engine_root)
    metadata = log_.read_metadata()
    if metadata is None:
        _refuse_without_batches(location)
        msg = (
            f"{location} is not a sparkstate checkpoint (it has no sparkstate/metadata.json); "
            "rescale the state of a plain Spark query with "
            "spark._streamingCheckpointManager.repartition"
        )
        raise ConfigurationError(msg)
    return engine_root, log_, metadata


def _refuse_without_batches(location: str) -> None:
    """Spark's refusals of a checkpoint with nothing to rescale, in Spark's order: no committed
    batch, then no offsets for the last one."""
    offsets, commits = spark_batches(DurableDir(location))
    invalid = "STATE_REPARTITION_INVALID_CHECKPOINT"
    if not commits:
        msg = (
            f"[{invalid}.NO_COMMITTED_BATCH] The checkpoint location {location} is in an "
            "invalid state: there is no committed microbatch."
        )
        raise ConfigurationError(msg)
    if commits[-1] not in offsets:
        msg = (
            f"[{invalid}.NO_BATCH_FOUND] The checkpoint location {location} is in an invalid "
            f"state: no microbatch has been found (batch {commits[-1]} has no offsets)."
        )
        raise ConfigurationError(msg)


def settle_rescale(location: str) -> str | None:
    """Finish a rescale that committed (its last steps), or drop one that did not; called by
    every start and by a rescale before it begins. Returns what it did, for the log."""
    location = canonical_location(location)
    engine_root, log_, metadata = _log_of(location)
    latest = log_.latest_commit()
    done: str | None = None
    if latest is not None and latest.repartition is not None:
        target = int(latest.repartition["to"])
        if int(metadata["num_partitions"]) != target:
            log_.write_metadata({**metadata, "num_partitions": target})
            done = f"finished the rescale of batch {latest.batch_id} to {target} partitions"
        spark = DurableDir(location)
        _, commits = spark_batches(spark)
        if latest.batch_id not in commits:
            after = latest.repartition.get("after")
            before = [b for b in commits if b < latest.batch_id and after in (None, b)]
            if not before:
                msg = (
                    f"{location}: batch {latest.batch_id} rescaled the state, but Spark's commit "
                    "log has no batch before it to continue from; restore the checkpoint"
                )
                raise ConfigurationError(msg)
            copy_spark_batch(spark, before[-1], latest.batch_id, target)
            done = f"finished the rescale of batch {latest.batch_id} to {target} partitions"
    last = latest.batch_id if latest is not None else -1
    for entry in log_.batches.list():
        name = entry.name
        if not (name.endswith(".json") and name[:-5].isdigit()) or int(name[:-5]) <= last:
            continue
        intent = log_.read_intent(int(name[:-5]))
        if intent is not None and intent.repartition is not None:
            log_.batches.delete(name)
            done = f"dropped the rescale of batch {intent.batch_id}, which did not commit"
    return done


def rescale_without_state(location: str, num_partitions: int) -> bool:
    """Rescale a checkpoint none of whose batches committed: there is no state to move, so the
    new count is recorded (in ``metadata.json``, and in the ``_schema.json`` of stores a failed
    first batch left). False where a batch committed (the state must move)."""
    location = canonical_location(location)
    engine_root, log_, metadata = _log_of(location)
    if log_.latest_commit() is not None or spark_batches(DurableDir(location))[1]:
        return False
    root = state_root_of(metadata, str(metadata.get("state_location") or engine_root))
    provider = provider_class(str(metadata["provider"]))
    for op in metadata.get("operators", []):
        for p in range(int(metadata["num_partitions"])):
            store_id = StoreId(root, int(op["id"]), p)
            record = read_schema_record(DurableDir(root).child(store_id.relative_dir))
            if record is not None:
                writer = WritesVersions.require_class(provider, "a rescale records the new count")
                writer.admit_partition_count(store_id, record, [], num_partitions)
    log_.write_metadata({**metadata, "num_partitions": num_partitions})
    return True


def plan_rescale(
    location: str,
    num_partitions: int,
    *,
    enforce_exactly_once_sink: bool = True,
    in_place: bool = False,
) -> RescalePlan:
    """Check that the checkpoint can be rescaled to ``num_partitions`` and write the intent of
    the rescale batch (step 1; none ``in_place``, which takes no batch id). The caller holds
    the checkpoint's lock."""
    if not isinstance(num_partitions, int) or isinstance(num_partitions, bool):
        msg = f"the number of partitions must be an int, got {num_partitions!r}"
        raise ConfigurationError(msg)
    if num_partitions < 1:
        msg = f"the number of partitions must be at least 1, got {num_partitions}"
        raise ConfigurationError(msg)
    location = canonical_location(location)
    settled = settle_rescale(location)
    if settled:
        log.warning("%s: %s", location, settled)
    engine_root, log_, metadata = _log_of(location)
    spark = DurableDir(location)
    offsets, commits = spark_batches(spark)
    if not commits:
        msg = (
            f"{location} has no committed batch: there is no state to rescale yet (run the "
            "query for a batch first)"
        )
        raise ConfigurationError(msg)
    current = int(metadata["num_partitions"])
    if num_partitions == current:
        msg = f"{location} already has {current} state partitions: nothing to rescale"
        raise ConfigurationError(msg)
    last_committed = commits[-1]
    failed = [b for b in offsets if b > last_committed]
    if failed:
        if enforce_exactly_once_sink:
            msg = (
                f"{location}: batch {failed[0]} was planned but did not commit (the query "
                "stopped during it). Start the query to finish it and stop it, then rescale; "
                "or pass enforce_exactly_once_sink=False to skip it (its input is read again "
                "by the next batch, which an exactly-once sink that keys on the batch id may "
                "take twice)"
            )
            raise ConfigurationError(msg)
        # Rolled back, as a user rolls a query back: their offsets go from Spark's log (newest
        # first) and their outcome from ours, so the next batch reads their input again. Spark's
        # own repartition marks them committed empty instead, and its restart then asks a file
        # source for the input from their end back to the last committed batch's, and fails.
        log_.roll_back(last_committed + 1)
        for b in reversed(failed):
            drop_spark_batch(spark, b)
            if log_.batches.exists(f"{b}.json"):
                log_.batches.delete(f"{b}.json")
        log.warning("%s: rolled back batches %s, which did not commit", location, failed)
    commit = log_.read_commit(last_committed)
    if commit is None:
        msg = (
            f"{location}: Spark committed batch {last_committed} but sparkstate's log has no "
            "commit of it; the checkpoint's logs do not match: restore the checkpoint"
        )
        raise ConfigurationError(msg)
    batch_id = last_committed if in_place else last_committed + 1
    if not in_place:
        log_.write_intent(
            BatchIntent(
                batch_id,
                watermark_ms=int(commit.watermark.get("watermark_ms", commit.watermark_ms)),
                batch_timestamp_ms=int(time.time() * 1000),
                input_digest=input_digest(spark, last_committed),
                late_watermark_ms=commit.watermark_ms,
                repartition={"from": current, "to": num_partitions, "after": last_committed},
            )
        )
    state_root = state_root_of(metadata, str(metadata.get("state_location") or engine_root))
    return RescalePlan(
        location=location,
        engine_root=engine_root,
        state_root=str(state_root),
        provider=str(metadata["provider"]),
        batch_id=batch_id,
        last_batch=last_committed,
        from_partitions=current,
        to_partitions=num_partitions,
        operators=list(metadata.get("operators", [])),
        lineage=commit.lineage(),
    )


def commit_rescale(plan: RescalePlan, written: dict[int, dict[int, tuple[str, int]]]) -> None:
    """Commit the rescale batch (step 3; in place, the last batch's outcome rewritten) and
    finish it (step 4). ``written``: per operator, per new partition, the checkpoint id of the
    version written and its number of keys."""
    log_ = CheckpointLog(plan.engine_root)
    previous = log_.read_commit(plan.last_batch)
    assert previous is not None
    operators = {
        int(op["id"]): OperatorCommit.of_written(
            int(op["id"]), written.get(int(op["id"]), {}), plan.to_partitions, "the rescale"
        )
        for op in plan.operators
    }
    log_.write_commit(
        BatchCommit(
            batch_id=plan.batch_id,
            watermark_ms=previous.watermark_ms,
            watermark=previous.watermark,
            committed_at=previous.committed_at if plan.in_place else format_time(time.time()),
            operators=operators,
            repartition={
                "from": plan.from_partitions,
                "to": plan.to_partitions,
                "after": plan.last_batch,
            },
        )
    )
    settle_rescale(plan.location)
