"""The state of one partition, taken apart for a rescale and put together in another partitioning.

A rescale (:mod:`sparkstate.runtime.rescale`) reads each old partition's state as rows: every
column family's keys and values as stored, beside the key columns the engine shuffles the
operator's input by (:func:`~sparkstate.observe.key_lookup.partition_columns`), typed. Spark's
``repartition(n, *those columns)`` then sends each row where the next batch's shuffle sends its
key, and each new partition has its provider write what it received as a version of a new
lineage (:class:`~sparkstate.store.capabilities.WritesVersions`): the whole state of the
version, from nothing (parent none), under a fresh checkpoint id.

Every column family of an operator must have the shuffle's columns in its key (an index's key is
its time, then the key), or be derived from the others, as a join's per-side row counts are:
those are not moved, each new partition computes them from the rows it received (the operator's
class says which families, and how: ``derived_families``). Any other family that is not per key
cannot be split, and its operator is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.checkpoint import open_checkpoint
from sparkstate.observe.key_lookup import partition_columns
from sparkstate.operators.state_layout import DeriveFamilies
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.capabilities import WritesVersions, provider_over_files
from sparkstate.store.conf import StoreId
from sparkstate.store.schema_json import schema_from_json
from sparkstate.store.versions.layout import (
    merged_schema_record,
    read_schema_record,
    write_rescaled_schema,
)

__all__ = [
    "FAMILY",
    "KEY",
    "VALUE",
    "OperatorMove",
    "plan_moves",
    "read_partition",
    "write_partition",
]

#: The columns of a moved row beside the shuffle's key columns (named ``__p0``, ``__p1``...).
FAMILY = "__cf"
KEY = "__key"
VALUE = "__value"
_CHUNK = 65536
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

    @property
    def shuffle_columns(self) -> list[str]:
        return [f"__p{i}" for i in range(len(self.columns))]


def plan_moves(
    location: str, batch_id: int, from_partitions: int, to_partitions: int
) -> list[OperatorMove]:
    """How each operator of the checkpoint moves, checked before anything is written; and each
    new partition's ``_schema.json``, with the new count added, written."""
    chk = open_checkpoint(location)
    moves = []
    for op in chk.operators(named=False):
        records = {}
        for p in range(from_partitions):
            record = read_schema_record(chk.store_dir(op.id, p))
            if record is not None:
                records[p] = record
        if not records:  # the operator never kept state: nothing to move
            moves.append(OperatorMove(location, op.id, op.kind, batch_id, [], pa.schema([]), []))
            continue
        merged = merged_schema_record(list(records.values()))
        families = {
            name: schema_from_json(f["key"]) for name, f in merged["column_families"].items()
        }
        columns = partition_columns(op.description, families[DEFAULT_CF])
        derived, derive = op.layout.derived_families()
        for name, key_schema in families.items():
            lacking = [c for c in columns if c not in key_schema.names and name not in derived]
            if lacking:
                msg = (
                    f"operator {op.id} ({op.kind}) keeps state that is not per key (column "
                    f"family {name!r} has no {', '.join(lacking)} in its key), so it cannot be "
                    "split into other partitions; rescaling it is not supported"
                )
                raise ConfigurationError(msg)
        key_schema = families[DEFAULT_CF]
        fields = [
            pa.field(f"__p{i}", key_schema.field(c).type, nullable=True)
            for i, c in enumerate(columns)
        ]
        schema = pa.schema(
            [
                *fields,
                pa.field(FAMILY, pa.string()),
                pa.field(KEY, pa.binary()),
                pa.field(VALUE, pa.binary()),
            ]
        )
        for p in range(to_partitions):
            write_rescaled_schema(chk.store_dir(op.id, p), merged, [from_partitions], to_partitions)
        moves.append(
            OperatorMove(
                location,
                op.id,
                op.kind,
                batch_id,
                columns,
                schema,
                sorted(records),
                derived,
                derive,
            )
        )
    return moves


def read_partition(move: OperatorMove, partition: int) -> Iterator[pa.RecordBatch]:
    """Every key and value of the operator's old partition ``partition``, with the key columns
    the engine shuffles by."""
    chk = open_checkpoint(move.location)
    with chk.read_store(move.op_id, partition, move.batch_id) as store:
        if store is None:
            return
        for name in chk.families(move.op_id, partition) or {}:
            if name in move.derived:
                continue
            family = store.column_family(name)
            chunks = store.raw_scan_chunks(
                family.prefix, family.end_of_family(), len(family.prefix), _CHUNK
            )
            prefix = pa.scalar(family.prefix, pa.binary())
            for suffixes, values in chunks:
                keys = family.key_codec.decode_many_arrow(suffixes)
                n = len(suffixes)
                columns = [keys.column(c).combine_chunks() for c in move.columns]
                arrays = [
                    *(c.cast(move.schema.field(i).type) for i, c in enumerate(columns)),
                    pa.repeat(pa.scalar(name, pa.string()), n),
                    pc.binary_join_element_wise(prefix, pa.array(suffixes, pa.binary()), b""),
                    pa.array(values, pa.binary()),
                ]
                yield pa.RecordBatch.from_arrays(arrays, schema=move.schema)


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
        if bound is None:  # plan_moves wrote every new partition's _schema.json
            msg = f"{store_id}: no _schema.json to write the rescaled state under"
            raise ConfigurationError(msg)
        writer = WritesVersions.require(bound, "a rescale writes the state of each new partition")
        checkpoint_id = writer.write_version(version, table.column(KEY), table.column(VALUE))
    return checkpoint_id, table.num_rows
