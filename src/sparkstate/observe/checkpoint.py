"""A query's checkpoint as a reader sees it: its operators, committed batches and partition stores.

Nothing here writes to the checkpoint, and nothing takes a running query's local databases: a
partition's state is loaded into a private scratch directory, from the durable files alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError, MissingVersionError, SparkstateError
from sparkstate.files.durable import DurableDir
from sparkstate.observe.progress_log import read_progress_log
from sparkstate.operators.registry import layout_of
from sparkstate.operators.state_layout import StateLayout
from sparkstate.runtime.export import ASIDE_DIR, exported_aside
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.runtime.migration import state_root_of
from sparkstate.runtime.records import BatchCommit
from sparkstate.store.base import StateStore, StateStoreProvider
from sparkstate.store.capabilities import provider_over_files
from sparkstate.store.conf import StoreId
from sparkstate.store.schema_file import SCHEMA_FILE, read_schema_file

__all__ = ["OperatorInfo", "StateCheckpoint", "open_checkpoint"]


@dataclasses.dataclass(frozen=True)
class OperatorInfo:
    """One stateful operator of a checkpoint, as ``metadata.json`` describes it."""

    id: int
    kind: str
    #: Spark's ``operatorName`` (from the progress log where it has one, else the class's).
    name: str
    description: dict[str, Any]

    @property
    def layout(self) -> type[StateLayout]:
        """What the operator's class knows of its state (the defaults for an unknown kind)."""
        return layout_of(self.kind)


@dataclasses.dataclass
class StateCheckpoint:
    """A sparkstate checkpoint opened for reading."""

    location: str
    log: CheckpointLog
    metadata: dict[str, Any]
    #: The root the state stores live under (the engine directory or ``stateLocation``).
    state_root: str

    @property
    def num_partitions(self) -> int:
        return int(self.metadata["num_partitions"])

    @property
    def provider(self) -> str:
        return str(self.metadata["provider"])

    def operators(self, *, named: bool = True) -> list[OperatorInfo]:
        """The operators by id; ``named=False`` skips reading the progress log for Spark's
        names (a reader's task needs none)."""
        names = self._progress_names() if named else {}
        out = []
        for described in self.metadata.get("operators", []):
            op_id, kind = int(described["id"]), str(described["kind"])
            name = names.get(op_id) or layout_of(kind).progress_name or kind
            out.append(OperatorInfo(op_id, kind, name, described))
        return sorted(out, key=lambda o: o.id)

    def operator(self, op_id: int, *, named: bool = True) -> OperatorInfo:
        ops = self.operators(named=named)
        for op in ops:
            if op.id == op_id:
                return op
        msg = (
            f"the checkpoint {self.location} has no stateful operator {op_id}; its operators: "
            f"{[(o.id, o.name) for o in ops] or 'none'}"
        )
        raise ConfigurationError(msg)

    def _progress_names(self) -> dict[int, str]:
        """``operatorName`` by operator id, from the last batch's progress (index = id)."""
        try:
            progress = read_progress_log(self.location).batches
        except SparkstateError:  # the names are a nicety; metadata has the kinds
            return {}
        ops = progress[-1].get("stateOperators") or []
        return {i: str(o.get("operatorName")) for i, o in enumerate(ops) if o.get("operatorName")}

    # --- batches ---------------------------------------------------------------------------------

    def committed_batches(self) -> list[int]:
        names = self.log.commits.names()
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def last_batch(self) -> int:
        batches = self.committed_batches()
        if not batches:
            msg = f"the checkpoint {self.location} has no committed batch yet: no state to read"
            raise MissingVersionError(msg)
        return batches[-1]

    def commit(self, batch_id: int) -> BatchCommit:
        found = self.log.read_commit(batch_id)
        if found is None:
            batches = self.committed_batches()
            span = f"{batches[0]} to {batches[-1]}" if batches else "none"
            msg = (
                f"batch {batch_id} of the checkpoint {self.location} is not committed "
                f"(committed batches: {span})"
            )
            raise MissingVersionError(msg)
        return found

    def partitions_at(self, batch_id: int) -> int:
        """The state's partition count after batch ``batch_id`` (a rescale changes it)."""
        counts = [len(c.checkpoint_ids) for c in self.commit(batch_id).operators.values()]
        return max(counts, default=0) or self.num_partitions

    def checkpoint_id(self, op_id: int, partition: int, batch_id: int) -> str | None:
        """The attempt of the operator's partition that batch ``batch_id`` committed."""
        entry = self.commit(batch_id).operators.get(op_id)
        return None if entry is None else entry.checkpoint_ids.get(partition)

    # --- stores ----------------------------------------------------------------------------------

    def store_dir(self, op_id: int, partition: int) -> DurableDir:
        return DurableDir(self.state_root).child(
            StoreId(self.state_root, op_id, partition).relative_dir
        )

    def families(self, op_id: int, partition: int) -> dict[str, tuple[pa.Schema, pa.Schema]] | None:
        """The column families of a partition's store and their schemas (None: it never ran)."""
        directory = self.store_dir(op_id, partition)
        if not directory.exists(SCHEMA_FILE):
            return None
        return read_schema_file(directory)

    def operator_families(self, op_id: int) -> dict[str, tuple[pa.Schema, pa.Schema]] | None:
        """The column families of the operator's stores, from the first partition that has a
        store (None: no partition ran yet)."""
        for p in range(self.num_partitions):
            families = self.families(op_id, p)
            if families is not None:
                return families
        return None

    @contextlib.contextmanager
    def provider_for(
        self, op_id: int, partition: int, *, keep_open: bool = False
    ) -> Iterator[StateStoreProvider | None]:
        """A provider bound to the partition's durable files, with a scratch local directory
        of its own (None when the partition has no store); ``keep_open``: see
        :func:`~sparkstate.store.capabilities.provider_over_files`."""
        store_id = StoreId(self.state_root, op_id, partition)
        with provider_over_files(self.provider, store_id, keep_open=keep_open) as p:
            yield p

    @contextlib.contextmanager
    def read_store(self, op_id: int, partition: int, batch_id: int) -> Iterator[StateStore | None]:
        """The partition's state after batch ``batch_id`` (None: the partition has none)."""
        ckpt = self.checkpoint_id(op_id, partition, batch_id)
        with self.provider_for(op_id, partition) as provider:
            if provider is None:
                yield None
                return
            store = provider.get_read_store(batch_id + 1, ckpt)
            try:
                yield store
            finally:
                store.abort()


def open_checkpoint(location: str) -> StateCheckpoint:
    """Open the checkpoint at ``location`` (a path or URI, as given to ``checkpointLocation``)."""
    log = CheckpointLog.of_checkpoint(location)
    location = str(log.location)
    metadata = log.read_metadata()
    if metadata is None:
        exported = exported_aside(location)
        if exported:
            msg = (
                f"{location} was handed back to Spark's own operators by sparkstate export "
                f"after batch {exported[-1]} (sparkstate's logs of it are in "
                f"{ASIDE_DIR}/{exported[-1]}); read its state with Spark's own reader: "
                "spark.read.format('statestore')"
            )
        elif DurableDir(location).exists("commits"):
            msg = (
                f"{location} is a checkpoint of a query that ran without sparkstate; read its "
                "state with Spark's own reader: spark.read.format('statestore')"
            )
        elif not DurableDir(location).present():
            msg = f"{location} does not exist"
        else:
            msg = f"{location} is not a sparkstate checkpoint: it has no sparkstate/metadata.json"
        raise ConfigurationError(msg)
    state_root = state_root_of(metadata, str(metadata.get("state_location") or log.root))
    return StateCheckpoint(location, log, metadata, str(state_root))
