"""What ``start()`` settles with the checkpoint, wherever the checkpoint is reachable from: its
one spelling, its ``metadata.json`` (written, or checked against the query), and the query id.

In a classic session it runs in the client's process; over Spark Connect, in a task on the
server's side (:func:`sparkstate.engine.api.writer.DataStreamWriter.start`), since the client
may not see the checkpoint's file system at all.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.files.durable import DurableDir, canonical_location
from sparkstate.operators.registry import operator_class
from sparkstate.runtime.export import settle_export
from sparkstate.runtime.logs import CheckpointLog, engine_root_of
from sparkstate.runtime.metadata import (
    PARTITIONS_ASKED,
    check_checkpoint_location,
    check_restart,
    partitions_asked,
    rescale_target,
)
from sparkstate.runtime.migration import (
    MIGRATED,
    Migration,
    plan_migration,
    settle_migration,
    state_root_of,
)
from sparkstate.runtime.rescale import settle_rescale
from sparkstate.runtime.spark_checkpoint import spark_batches, spark_query_id
from sparkstate.runtime.take_over import (
    TakeOver,
    discard_unfinished_take_over,
    plan_take_over,
    settle_take_over,
)

__all__ = ["Checkpoint", "StartRequest", "engine_root_of", "prepare_checkpoint"]

log = logging.getLogger("sparkstate.engine")


@dataclasses.dataclass(frozen=True)
class StartRequest:
    """What the query brings to its checkpoint."""

    #: ``checkpointLocation`` and ``stateLocation`` as the user gave them.
    location: str
    state_location: str | None
    provider: str
    requested_partitions: str | None
    default_partitions: int
    output_mode: str
    operators: list[dict[str, Any]]
    #: Whether the query takes the clock source (new checkpoints; older ones: ``legacy_clock``).
    clock: bool
    legacy_clock: bool
    #: Whether the query brings a ``stateMigration``: a state schema change Spark refuses
    #: migrates the state instead (:mod:`sparkstate.runtime.migration`).
    migrate: bool = False


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The checkpoint as the query runs on it."""

    location: str
    engine_root: str
    state_root: str
    metadata: dict[str, Any]
    #: The partition count the query asks for where it differs from the checkpoint's and the
    #: ask changed: the state is rescaled to it before the query runs (None: no rescale).
    rescale_to: int | None = None
    #: A state schema change Spark refuses when it plans the first batch: the query starts, and
    #: its first batch fails with it, as Spark's does (the checkpoint is left as it was).
    refusal: SchemaMismatchError | None = None
    #: A checkpoint of Spark's own stateful operators, to take over before the query runs
    #: (:mod:`sparkstate.runtime.take_over`); ``metadata`` is not written yet.
    take_over: TakeOver | None = None
    #: The migration of the state to the query's changed operators, before the query runs.
    migration: Migration | None = None

    @property
    def query_id(self) -> str:
        return str(self.metadata["query_id"])


def _recorded_ids(
    recorded: list[dict[str, Any]], described: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The query's operators under the ids its checkpoint has them: checkpoints written before
    the operators were numbered as Spark numbers them (from the sink) number them from the
    first step, and their state stays where it is."""
    ids = [int(o.get("id", -1)) for o in recorded]
    if len(ids) != len(described) or sorted(ids) != sorted(o["id"] for o in described):
        return described  # another query: check_restart says what changed
    return [{**o, "id": i} for o, i in zip(described, ids, strict=True)]


def prepare_checkpoint(request: StartRequest) -> Checkpoint:
    """Resolve the checkpoint, check it can be written, and write or check its metadata."""
    location = canonical_location(request.location)
    check_checkpoint_location(location)
    engine_root = engine_root_of(location)
    state_option = canonical_location(request.state_location) if request.state_location else None
    if state_option == engine_root:
        state_option = None  # the default place, spelled out
    log_ = CheckpointLog(engine_root)
    if settle_export(location, engine_root):  # handed back to Spark: taken over again below
        log.warning("%s: finished the export to Spark's operators", location)
    if discard_unfinished_take_over(log_):
        log.warning("%s: dropped a take-over of Spark's checkpoint that did not finish", location)
    metadata = log_.read_metadata()
    if metadata is not None:
        if settle_migration(engine_root):
            log.warning("%s: finished the migration of the state", location)
            metadata = log_.read_metadata()
            assert metadata is not None
        settled = settle_rescale(location)
        if settled:
            log.warning("%s: %s", location, settled)
            metadata = log_.read_metadata()
            assert metadata is not None
    requested = request.requested_partitions
    asked = partitions_asked(requested, request.default_partitions)
    rescale_to: int | None = None
    refusal: SchemaMismatchError | None = None
    if metadata is None:
        num_partitions = int(requested or request.default_partitions)
        if num_partitions < 1:
            msg = f"numPartitions must be >= 1, got {num_partitions}"
            raise ConfigurationError(msg)
        metadata = {
            "query_id": str(uuid.uuid4()),
            "num_partitions": num_partitions,
            "provider": request.provider,
            "state_location": state_option,  # None: in the checkpoint, wherever it moves
            "output_mode": request.output_mode,
            "operators": request.operators,
            "clock": request.clock,
            PARTITIONS_ASKED: asked,
        }
        names = {
            int(o["id"]): operator_class(str(o["kind"])).progress_name for o in request.operators
        }
        metadata["query_id"] = spark_query_id(DurableDir(location), str(metadata["query_id"]))
        take_over = plan_take_over(
            location, engine_root, state_option or engine_root, metadata, names
        )
        if take_over is not None:  # Spark's own operators ran the query: their state goes on
            return Checkpoint(
                location,
                engine_root,
                state_option or engine_root,
                take_over.metadata,
                take_over=take_over,
            )
        log_.write_metadata(metadata)
    else:
        if settle_take_over(location, engine_root, metadata):
            log.warning("%s: finished the take-over of Spark's checkpoint", location)
        refuse_state_without_offsets(location, log_)
        refuse_rollback_past_migration(location, metadata)
        operators = _recorded_ids(metadata.get("operators", []), request.operators)
        refusal = check_restart(metadata, request.provider, state_option, operators, log_.root)
        if refusal is not None and request.migrate:  # the state moves to the changed query
            root = state_option or engine_root
            migration = plan_migration(location, engine_root, root, metadata, operators)
            if migration is not None:
                return Checkpoint(
                    location,
                    engine_root,
                    state_root_of(metadata, root),
                    metadata,
                    migration=migration,
                )
            refusal = None  # no batch committed: no state to migrate
        if refusal is None:  # else the checkpoint stays as it was, and the first batch fails
            rescale_to = rescale_target(metadata, asked)
            recorded = {
                "operators": operators,
                "clock": metadata.get("clock"),
                "state_location": state_option,
                # recorded once the rescale it asks for is done (a start after a failed one
                # asks again)
                PARTITIONS_ASKED: metadata.get(PARTITIONS_ASKED) if rescale_to else asked,
            }
            if recorded["clock"] is None:
                recorded["clock"] = request.legacy_clock
            if any(metadata.get(k) != v for k, v in recorded.items()):
                metadata = {**metadata, **recorded}  # state schemas evolved, or an older form
                log_.write_metadata(metadata)
    query_id = spark_query_id(DurableDir(location), str(metadata["query_id"]))
    if query_id != metadata["query_id"]:  # Spark's checkpoint was there first
        metadata = {**metadata, "query_id": query_id}
        log_.write_metadata(metadata)
    state_root = state_root_of(metadata, state_option or engine_root)
    return Checkpoint(location, engine_root, state_root, metadata, rescale_to, refusal)


def refuse_rollback_past_migration(location: str, metadata: dict[str, Any]) -> None:
    """Spark's commits deleted back past the batch after which the state was migrated to a
    changed query: the state of those batches is the old query's, in the earlier generation,
    so the batches cannot run again on it."""
    migrated = [int(m["batch_id"]) for m in metadata.get(MIGRATED) or []]
    if not migrated:
        return
    _offsets, commits = spark_batches(DurableDir(location))
    last = max(commits, default=None)
    if last is not None and last >= max(migrated):
        return
    msg = (
        f"the state of {location} was migrated to a changed query after batch "
        f"{max(migrated)}, and the last batch Spark's commit log has is "
        f"{'none' if last is None else last}: batches before a migration cannot run again (their "
        "state is the old query's, in the generation before it). Put back Spark's commits and "
        f"offsets up to batch {max(migrated)}, or start from a new checkpoint location"
    )
    raise ConfigurationError(msg)


def refuse_state_without_offsets(location: str, log_: CheckpointLog) -> None:
    """Spark's offset log is gone while our state has committed batches (Spark's ``offsets/``
    and ``commits/`` deleted): Spark would plan batch 0 again over state that is not empty and
    refuses, and so do we, rather than hand the sink batch ids it has already seen."""
    offsets, _commits = spark_batches(DurableDir(location))
    if offsets or log_.latest_commit() is None:
        return
    msg = (
        f"[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] The checkpoint location {log_.root} should "
        f"be empty on batch 0: Spark's offset log in {location} has no batch while sparkstate's "
        "state has committed batches. Please either use a new checkpoint location, or delete "
        "the existing data in the checkpoint location."
    )
    raise ConfigurationError(msg)
