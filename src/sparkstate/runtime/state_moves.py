"""One operator's state moved into another partitioning, as a rescale, a take-over and a
migration move it: the :class:`OperatorMove` (its rows' shuffle columns and schema), each new
partition admitted (its ``_schema.json`` written through the provider's
:class:`~sparkstate.store.capabilities.WritesVersions`, with the new partition count added), and
the rows a new partition received written as a version of a new lineage of its store.

What reads the old partitions' rows is the read side's (:mod:`sparkstate.observe.rescale`); the
order of the writes and the records around them are :mod:`sparkstate.runtime.rescale`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.state_layout import DeriveFamilies
from sparkstate.store.capabilities import WritesVersions, provider_over_files
from sparkstate.store.conf import StoreId
from sparkstate.store.registry import provider_class

__all__ = [
    "FAMILY",
    "KEY",
    "VALUE",
    "OperatorMove",
    "admit",
    "key_order",
    "write_partition",
]

#: The columns of a moved row beside the shuffle's key columns (named ``__p0``, ``__p1``...).
FAMILY = "__cf"
KEY = "__key"
VALUE = "__value"
#: Computes a partition's derived column families from its other families' rows (the
#: operator's class says which, and how: ``derived_families``).
Derive = DeriveFamilies


@dataclasses.dataclass(frozen=True)
class OperatorMove:
    """How one operator's state moves: the columns its rows are shuffled by, and their types."""

    location: str
    op_id: int
    kind: str
    #: The state after this batch is read.
    batch_id: int
    #: The shuffle's key columns, in the order the engine hashes them (names in the stores).
    columns: list[str]
    #: The rows a reader task gives: the shuffle's columns as ``__p<i>``, then family, key,
    #: value.
    schema: pa.Schema
    #: The partitions of the old partitioning that hold state.
    partitions: list[int]
    #: The families not moved but computed in each new partition (by ``derive``).
    derived: tuple[str, ...] = ()
    derive: Derive | None = None
    #: The ``_schema.json`` record each new partition is written under (the old partitions'
    #: merged), and the old partition count it adds to the new one.
    schema_record: dict[str, Any] = dataclasses.field(default_factory=dict)
    from_partitions: int = 0

    @property
    def shuffle_columns(self) -> list[str]:
        return [f"__p{i}" for i in range(len(self.columns))]


def admit(state_root: str, provider: str, move: OperatorMove, num_partitions: int) -> None:
    """Let each of ``num_partitions`` new partitions of ``move``'s operator be written: its
    store's ``_schema.json``, with the new count added to the old, written by ``provider``."""
    if not move.schema_record:  # the operator never kept state: nothing moves
        return
    writer = WritesVersions.require_class(
        provider_class(provider), "a rescale writes the state of each new partition"
    )
    for p in range(num_partitions):
        writer.admit_partition_count(
            StoreId(state_root, move.op_id, p),
            move.schema_record,
            [move.from_partitions],
            num_partitions,
        )


def key_order(keys: pa.BinaryArray) -> pa.Array | np.ndarray:
    """The indices that put ``keys`` in ascending byte order: where every key has one size
    (a key of fixed-width columns), as big-endian words sorted by numpy, about twice as fast
    as Arrow's sort of binary values."""
    _, offset_buffer, data = keys.buffers()
    if len(keys) < 2 or offset_buffer is None or data is None or keys.null_count:
        return pc.sort_indices(keys)
    offsets = np.frombuffer(offset_buffer, np.int32, len(keys) + 1, 4 * keys.offset)
    size = int(offsets[1] - offsets[0])
    if size == 0 or int(offsets[-1] - offsets[0]) != size * len(keys):
        return pc.sort_indices(keys)
    if not (np.diff(offsets) == size).all():
        return pc.sort_indices(keys)
    raw = np.frombuffer(data, np.uint8, size * len(keys), int(offsets[0])).reshape(-1, size)
    width = (size + 7) // 8
    padded = np.zeros((len(keys), 8 * width), np.uint8)
    padded[:, :size] = raw
    words = padded.view(">u8")
    if width == 1:
        return np.argsort(words[:, 0], kind="stable")
    return np.lexsort([words[:, i] for i in reversed(range(width))])


def write_partition(
    state_root: str,
    provider: str,
    op_id: int,
    partition: int,
    version: int,
    batches: Iterable[pa.RecordBatch],
    derive: Derive | None = None,
) -> tuple[str, int]:
    """Write the rows a new partition received as version ``version`` of its store, from
    nothing: one changelog under a fresh checkpoint id, with the families ``derive`` computes
    from them. Returns the id and the key count."""
    families: list[pa.Array] = []
    keys: list[pa.Array] = []
    values: list[pa.Array] = []
    for batch in batches:
        families.append(batch.column(FAMILY))
        keys.append(batch.column(KEY))
        values.append(batch.column(VALUE))
    if derive is not None:
        all_families = pa.concat_arrays(families) if families else pa.array([], pa.string())
        all_keys = pa.concat_arrays(keys) if keys else pa.array([], pa.binary())
        all_values = pa.concat_arrays(values) if values else pa.array([], pa.binary())
        derived_keys, derived_values = derive(all_families, all_keys, all_values)
        keys.append(derived_keys)
        values.append(derived_values)
    table = pa.table(
        {
            KEY: pa.concat_arrays(keys) if keys else pa.array([], pa.binary()),
            VALUE: pa.concat_arrays(values) if values else pa.array([], pa.binary()),
        }
    )
    table = table.take(key_order(table.column(KEY).combine_chunks()))
    store_id = StoreId(state_root, op_id, partition)
    with provider_over_files(provider, store_id) as bound:
        if bound is None:  # admit wrote every new partition's _schema.json
            msg = f"{store_id}: no _schema.json to write the rescaled state under"
            raise ConfigurationError(msg)
        writer = WritesVersions.require(bound, "a rescale writes the state of each new partition")
        checkpoint_id = writer.write_version(version, table.column(KEY), table.column(VALUE))
    return checkpoint_id, table.num_rows
