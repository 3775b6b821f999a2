"""The state reader: an operator's state after a batch, or its changes over batches, as Arrow.

Options carry Spark's names (``statestore`` source): ``batchId`` (default: the last committed),
``operatorId`` (default 0), ``storeName`` / ``stateVarName``, ``joinSide``,
``flattenCollectionTypes``, and for the change feed ``readChangeFeed``, ``changeStartBatchId``,
``changeEndBatchId``. Each state partition is read on its own (:meth:`StateReader.read`), so
the engine's data source reads them in parallel, one Spark partition per state partition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError, MissingVersionError
from sparkstate.observe.checkpoint import StateCheckpoint, open_checkpoint
from sparkstate.observe.views import CHANGE_COLUMNS, StateView, view_for
from sparkstate.runtime.migration import MIGRATED
from sparkstate.store.capabilities import ReadsChanges

__all__ = ["ReadRequest", "StateReader", "state_metadata", "METADATA_SCHEMA"]

#: Rows read into one Arrow batch.
CHUNK_ROWS = 65536
PARTITION_FIELD = pa.field("partition_id", pa.int32())

#: Spark's ``state-metadata`` source columns.
METADATA_SCHEMA = pa.schema(
    [
        ("operatorId", pa.int64()),
        ("operatorName", pa.string()),
        ("stateStoreName", pa.string()),
        ("numPartitions", pa.int32()),
        ("minBatchId", pa.int64()),
        ("maxBatchId", pa.int64()),
        ("operatorProperties", pa.string()),
    ]
)

_OPTIONS = {
    "path": "path",
    "batchid": "batch_id",
    "operatorid": "operator_id",
    "storename": "store_name",
    "statevarname": "store_name",
    "joinside": "join_side",
    "readchangefeed": "change_feed",
    "changestartbatchid": "change_start",
    "changeendbatchid": "change_end",
    "flattencollectiontypes": "flatten",
    "readregisteredtimers": "timers",
    "snapshotpartitionid": "snapshot_partition",
    "snapshotstartbatchid": "snapshot_start",
}


def _int(name: str, raw: Any) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        msg = f"option {name}={raw!r} is not an integer"
        raise ConfigurationError(msg) from None
    if value < 0:
        msg = f"option {name} must be >= 0, got {value}"
        raise ConfigurationError(msg)
    return value


def _bool(name: str, raw: Any) -> bool:
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        msg = f"option {name}={raw!r} must be true or false"
        raise ConfigurationError(msg)
    return text == "true"


@dataclasses.dataclass(frozen=True)
class ReadRequest:
    """What to read, as the reader's options say it."""

    location: str
    batch_id: int | None = None
    operator_id: int = 0
    store_name: str | None = None
    join_side: str | None = None
    change_feed: bool = False
    change_start: int | None = None
    change_end: int | None = None
    flatten: bool = True
    timers: bool = False
    #: Spark's ``snapshotPartitionId`` / ``snapshotStartBatchId``: the state of one partition,
    #: rebuilt from the snapshot of a batch. Ours reads a version from whatever snapshot and
    #: changelogs lead to it, so the start is checked and the rows are the same.
    snapshot_partition: int | None = None
    snapshot_start: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], location: str | None = None) -> ReadRequest:
        """From Spark-style options (names case-insensitive); ``location`` or ``path``."""
        given: dict[str, Any] = {}
        for name, raw in options.items():
            field = _OPTIONS.get(name.lower())
            if field is None:
                known = sorted({k for k in _OPTIONS.values() if k != "path"})
                msg = (
                    f"unknown option {name!r} of the sparkstate state reader; it takes "
                    "batchId, operatorId, storeName (or stateVarName), joinSide, "
                    "flattenCollectionTypes, readRegisteredTimers, snapshotPartitionId, "
                    "snapshotStartBatchId, readChangeFeed, changeStartBatchId, "
                    f"changeEndBatchId ({len(known)} in all)"
                )
                raise ConfigurationError(msg)
            given[field] = (name, raw)
        where = location or (given.pop("path", (None, None))[1])
        given.pop("path", None)
        if not where:
            msg = "give the checkpoint location: spark.read.format('sparkstate').load(checkpoint)"
            raise ConfigurationError(msg)
        kwargs: dict[str, Any] = {}
        for field, (name, raw) in given.items():
            if field in (
                "batch_id",
                "operator_id",
                "change_start",
                "change_end",
                "snapshot_partition",
                "snapshot_start",
            ):
                kwargs[field] = _int(name, raw)
            elif field in ("change_feed", "flatten", "timers"):
                kwargs[field] = _bool(name, raw)
            elif field == "join_side":
                side = str(raw).lower()
                if side not in ("left", "right"):
                    msg = f"option joinSide must be 'left' or 'right', got {raw!r}"
                    raise ConfigurationError(msg)
                kwargs[field] = side
            else:
                kwargs[field] = str(raw)
        request = cls(str(where), **kwargs)
        request.check()
        return request

    def check(self) -> None:
        if (self.snapshot_partition is None) != (self.snapshot_start is None):
            msg = "snapshotPartitionId and snapshotStartBatchId go together: give both or neither"
            raise ConfigurationError(msg)
        if self.snapshot_start is not None:
            if self.change_feed:
                msg = "snapshotStartBatchId does not go with readChangeFeed"
                raise ConfigurationError(msg)
            if self.batch_id is not None and self.snapshot_start > self.batch_id:
                msg = f"snapshotStartBatchId {self.snapshot_start} is after batchId {self.batch_id}"
                raise ConfigurationError(msg)
        if self.change_feed:
            if self.batch_id is not None:
                msg = "batchId does not go with readChangeFeed: use changeStartBatchId instead"
                raise ConfigurationError(msg)
            if self.change_start is None:
                msg = "readChangeFeed needs changeStartBatchId (the first batch to read)"
                raise ConfigurationError(msg)
            if self.change_end is not None and self.change_end < self.change_start:
                msg = (
                    f"changeEndBatchId {self.change_end} is before changeStartBatchId "
                    f"{self.change_start}"
                )
                raise ConfigurationError(msg)
        elif self.change_start is not None or self.change_end is not None:
            msg = "changeStartBatchId and changeEndBatchId need readChangeFeed=true"
            raise ConfigurationError(msg)


class StateReader:
    """Reads one operator's store of a checkpoint, a state partition at a time."""

    def __init__(self, request: ReadRequest) -> None:
        self.request = request
        self.checkpoint: StateCheckpoint = open_checkpoint(request.location)
        chk = self.checkpoint
        self.operator = chk.operator(request.operator_id, named=False)
        if request.change_feed:
            last = chk.last_batch()
            self.first = request.change_start or 0
            self.last = last if request.change_end is None else request.change_end
            if self.first > last or self.last > last:
                msg = (
                    f"the change feed asks for batches {self.first} to {self.last} but the "
                    f"checkpoint {chk.location} has committed batches up to {last}"
                )
                raise MissingVersionError(msg)
            chk.commit(self.first)
            self.batch_id = self.last
        else:
            self.batch_id = chk.last_batch() if request.batch_id is None else request.batch_id
            chk.commit(self.batch_id)  # fails clearly when the batch is not committed
            only = request.snapshot_partition
            if only is not None and only >= chk.partitions_at(self.batch_id):
                msg = (
                    f"snapshotPartitionId {only} is not a state partition of batch "
                    f"{self.batch_id} ({chk.partitions_at(self.batch_id)} partitions)"
                )
                raise ConfigurationError(msg)
        self._check_generation(self.first if request.change_feed else self.batch_id)
        self.view = self._view()

    def _check_generation(self, batch_id: int) -> None:
        """A batch before the last migration's was written for the query before it: its
        state is not in the generation the checkpoint reads
        (:mod:`sparkstate.runtime.migration`)."""
        migrated = [int(m["batch_id"]) for m in self.checkpoint.metadata.get(MIGRATED, [])]
        if migrated and batch_id < max(migrated):
            msg = (
                f"the state of batch {batch_id} of {self.checkpoint.location} was written for "
                f"the query before its migration after batch {max(migrated)}: read batch "
                f"{max(migrated)} or later (the older state is kept, in its old form, under the "
                "state's earlier generation)"
            )
            raise MissingVersionError(msg)

    def _view(self) -> StateView:
        families = None
        for p in range(self.checkpoint.num_partitions):
            families = self.checkpoint.families(self.operator.id, p)
            if families is not None:
                break
        if families is None:
            families = {}
            msg = f"operator {self.operator.id} of {self.checkpoint.location} has no state yet"
            raise MissingVersionError(msg)
        return view_for(
            self.operator.description,
            families,
            store_name=self.request.store_name,
            join_side=self.request.join_side,
            flatten=self.request.flatten,
            timers=self.request.timers,
        )

    @property
    def num_partitions(self) -> int:
        return self.checkpoint.partitions_at(self.batch_id)

    @property
    def schema(self) -> pa.Schema:
        fields = list(self.view.schema)
        if self.request.change_feed:
            fields = CHANGE_COLUMNS + fields
        return pa.schema([*fields, PARTITION_FIELD])

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """The rows of one state partition (none but the one ``snapshotPartitionId`` asks
        for, when it is given)."""
        only = self.request.snapshot_partition
        if only is not None and partition != only:
            return
        if self.request.change_feed:
            yield from self._changes(partition)
        else:
            yield from self._state(partition)

    def _with_partition(self, table: pa.Table, partition: int) -> Iterator[pa.RecordBatch]:
        if table.num_rows == 0:
            return
        column = pa.array([partition] * table.num_rows, pa.int32())
        out = pa.Table.from_arrays([*table.columns, column], schema=self.schema)
        yield from out.to_batches()

    def _state(self, partition: int) -> Iterator[pa.RecordBatch]:
        chk, op = self.checkpoint, self.operator.id
        with chk.read_store(op, partition, self.batch_id) as store:
            if store is None:
                return
            names = chk.families(op, partition) or {}
            families = {n: store.column_family(n) for n in names}
            chunks = store.range_scan_encoded_chunks(cf=self.view.family, chunk=CHUNK_ROWS)
            for keys, values in chunks:
                rows = self.view.rows(families, keys, values)
                yield from self._with_partition(rows, partition)

    def _changes(self, partition: int) -> Iterator[pa.RecordBatch]:
        chk, op = self.checkpoint, self.operator.id
        with chk.provider_for(op, partition) as provider:
            if provider is None:
                return
            changes = ReadsChanges.of(provider)
            if changes is None:
                msg = f"provider {chk.provider!r} keeps no changelogs: no change feed"
                raise ConfigurationError(msg)
            families = changes.families
            for batch_id in range(self.first, self.last + 1):
                ckpt = chk.checkpoint_id(op, partition, batch_id)
                try:
                    chunks = changes.read_changes(batch_id + 1, ckpt, self.view.family, CHUNK_ROWS)
                except MissingVersionError as exc:
                    msg = (
                        f"the changes of batch {batch_id} (partition {partition}) are gone: "
                        f"retention removed them ({exc}); read from a later changeStartBatchId"
                    )
                    raise MissingVersionError(msg) from exc
                for keys, values in chunks:  # the view's changes, a chunk of rows at a time
                    rows = self.view.changes(families, batch_id, keys, values)
                    yield from self._with_partition(rows, partition)


def state_metadata(location: str) -> pa.Table:
    """One row per operator and store, with Spark's ``state-metadata`` columns."""
    chk = open_checkpoint(location)
    batches = chk.committed_batches()
    first, last = (batches[0], batches[-1]) if batches else (None, None)
    rows: list[dict[str, Any]] = []
    for op in chk.operators():
        output_mode = str(chk.metadata.get("output_mode"))
        properties = op.layout.spark_properties(op.description, output_mode)
        for store in op.layout.spark_store_names:
            rows.append(
                {
                    "operatorId": op.id,
                    "operatorName": op.name,
                    "stateStoreName": store,
                    "numPartitions": chk.num_partitions,
                    "minBatchId": first,
                    "maxBatchId": last,
                    "operatorProperties": properties,
                }
            )
    return pa.Table.from_pylist(rows, schema=METADATA_SCHEMA)
