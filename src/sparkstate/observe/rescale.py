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

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.checkpoint import open_checkpoint
from sparkstate.observe.key_lookup import partition_columns
from sparkstate.runtime.state_moves import FAMILY, KEY, VALUE, OperatorMove
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.schema_file import merged_schema_record, read_schema_record
from sparkstate.store.schema_json import schema_from_json

__all__ = ["plan_moves", "read_partition"]

_CHUNK = 65536


def plan_moves(
    location: str, batch_id: int, from_partitions: int, to_partitions: int
) -> list[OperatorMove]:
    """How each operator of the checkpoint moves, checked before anything is written (each new
    partition's ``_schema.json`` is written by :func:`~sparkstate.runtime.state_moves.admit`)."""
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
                schema_record=merged,
                from_partitions=from_partitions,
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
