"""The state of a ``StatefulProcessor`` that ran under Spark's own ``transformWithState``, as
ours keeps it: the take-over of its checkpoint.

Spark's state data source reads a processor's state one state variable at a time
(``stateVarName``: a value state's ``value``, a list's ``list_element`` per element, a map's
``user_map_key`` and ``user_map_value`` per entry) and its registered timers
(``readRegisteredTimers``: ``expiration_timestamp_ms`` per timer). The take-over reads each
(:meth:`TransformWithState.spark_reads`) and hands them over as one ``value`` struct: the read
a row is of (:data:`~sparkstate.operators.spark_state.READ`), and a field per read, null on
the other reads' rows. Here each read's rows become the column families a batch writes: a
value state's value per key; a list's elements per key, in Spark's order, in one value; a
map's entries per key, in user-key order; a key's timers, in expiry order, and their index.

A variable with a TTL: Spark's reader shows each value, element and entry as a struct of the
user's ``value`` and its ``ttlExpirationMs`` (the batch's processing time at its write plus the
TTL, as ours). Each keeps its expiration in our field (:data:`~.ttl.TTL_FIELD`), and the
variable's TTL index holds each key at its earliest expiration, as a batch writes them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.operators.arbitrary.state_collections import join_blob
from sparkstate.operators.arbitrary.state_vars import (
    LIST_VALUE_SCHEMA,
    MAP_VALUE_SCHEMA,
    VarSpec,
)
from sparkstate.operators.arbitrary.timers import (
    TIMER_INDEX_CF,
    TIMERS_CF,
    TIMERS_VALUE_SCHEMA,
    pack_expiries,
)
from sparkstate.operators.arbitrary.ttl import TTL_FIELD, ttl_cf_name
from sparkstate.operators.spark_state import (
    KEY_NOT_COMPATIBLE,
    READ,
    VALUE_NOT_COMPATIBLE,
    SparkRows,
    by_name,
    fields_of,
)
from sparkstate.operators.ts_index import index_entries
from sparkstate.store.codec import KeyCodec, ValueCodec

__all__ = ["TIMERS_READ", "processor_reads", "processor_state"]

#: The read of the registered timers (a state variable's name cannot start with ``$``).
TIMERS_READ = "$timers"


def processor_reads(specs: dict[str, VarSpec], timers: bool) -> dict[str, dict[str, str]]:
    """The reads of Spark's state data source a take-over makes, by name: each state variable,
    and the timers where the processor has a time mode."""
    reads = {name: {"stateVarName": name} for name in sorted(specs)}
    if timers:
        reads[TIMERS_READ] = {"readRegisteredTimers": "true"}
    return reads


def processor_state(
    key_schema: pa.Schema, specs: dict[str, VarSpec], key: pa.Array, value: pa.Array
) -> SparkRows:
    """Our column families of the rows of every read (:func:`processor_reads`)."""
    keys = by_name(fields_of(key), key_schema, KEY_NOT_COMPATIBLE, "grouping key column")
    values = dict(fields_of(value))
    reads = values.get(READ, pa.array([], pa.string()))
    out: SparkRows = {}
    for name, spec in specs.items():
        mine = pc.equal(reads, name)
        if name not in values:
            continue  # no read of it (the empty check of the state's types)
        read = dict(fields_of(values[name].filter(mine)))
        owners = keys.filter(mine)
        what = f"state variable {name!r}'s field"
        column = {"value": "value", "list": "list_element"}.get(spec.kind, "user_map_value")
        stored, expirations = _stored(read[column], spec, what)
        if spec.kind == "value":
            out[name] = (owners, stored)
            if expirations is not None:
                out[ttl_cf_name(name)] = index_entries(expirations, owners)
            continue
        encoded = ValueCodec(spec.element_schema).encode_many(stored)
        firsts, groups = _groups(owners, key_schema)
        firsts_of = owners.take(pa.array(firsts, pa.int64()))
        if expirations is not None:  # a key at its elements' earliest expiration
            times = expirations.to_pylist()
            earliest = pa.array([min(times[i] for i in g) for g in groups], pa.int64())
            out[ttl_cf_name(name)] = index_entries(earliest, firsts_of)
        if spec.kind == "list":
            blobs = [join_blob(encoded[i] for i in group) for group in groups]
            out[name] = (firsts_of, _blobs(blobs, LIST_VALUE_SCHEMA))
            continue
        assert spec.key_schema is not None
        user_keys = by_name(
            fields_of(read["user_map_key"]), spec.key_schema, KEY_NOT_COMPATIBLE, what
        )
        user_encoded = KeyCodec(spec.key_schema).encode_many(user_keys)
        blobs = [
            join_blob(
                part
                for i in sorted(group, key=user_encoded.__getitem__)
                for part in (user_encoded[i], encoded[i])
            )
            for group in groups
        ]
        out[name] = (firsts_of, _blobs(blobs, MAP_VALUE_SCHEMA))
    if TIMERS_READ in values:
        out.update(_timers(key_schema, keys, values, pc.equal(reads, TIMERS_READ)))
    return out


def _stored(read: pa.Array, spec: VarSpec, what: str) -> tuple[pa.Table, pa.Array | None]:
    """The values (elements, entries) of a variable as it stores them, and under a TTL their
    expirations (Spark's read of each: a struct of the ``value`` and its ``ttlExpirationMs``)."""
    if spec.ttl_ms is None:
        return by_name(fields_of(read), spec.schema, VALUE_NOT_COMPATIBLE, what), None
    parts = dict(fields_of(read))
    if "ttlExpirationMs" not in parts or "value" not in parts:
        msg = f"Spark keeps state variable {spec.name!r} without a TTL; this query gives it one"
        raise SchemaMismatchError(msg, VALUE_NOT_COMPATIBLE)
    expirations = parts["ttlExpirationMs"].cast(pa.int64())
    stored = by_name(fields_of(parts["value"]), spec.schema, VALUE_NOT_COMPATIBLE, what)
    field = pa.field(TTL_FIELD, pa.int64(), nullable=False)
    return stored.append_column(field, expirations), expirations


def _timers(
    key_schema: pa.Schema, keys: pa.Table, values: dict[str, pa.Array], mine: pa.Array
) -> SparkRows:
    """A key's timers in expiry order (each once), and their index by expiry."""
    read = dict(fields_of(values[TIMERS_READ].filter(mine)))
    expiries = read["expiration_timestamp_ms"].cast(pa.int64())
    unique, marks = index_entries(expiries, keys.filter(mine))
    times = unique.column(0).to_pylist()
    firsts, groups = _groups(unique.drop_columns([unique.column_names[0]]), key_schema)
    blobs = [pack_expiries(sorted(times[i] for i in g)) for g in groups]
    owners_of = unique.drop_columns([unique.column_names[0]]).take(pa.array(firsts, pa.int64()))
    return {
        TIMERS_CF: (owners_of.cast(key_schema), _blobs(blobs, TIMERS_VALUE_SCHEMA)),
        TIMER_INDEX_CF: (unique, marks),
    }


def _groups(keys: pa.Table, key_schema: pa.Schema) -> tuple[list[int], list[list[int]]]:
    """The rows of each key, in the order they came: the first row of each, and all of them."""
    encoded = KeyCodec(key_schema).encode_many_arrow(keys.cast(key_schema))
    ids = np.asarray(pc.dictionary_encode(encoded).indices, np.int64)
    groups: list[list[int]] = [[] for _ in range(int(ids.max()) + 1 if len(ids) else 0)]
    for row, group in enumerate(ids.tolist()):
        groups[group].append(row)
    return [g[0] for g in groups], groups


def _blobs(blobs: list[bytes], schema: pa.Schema) -> pa.Table:
    return pa.table([pa.array(blobs, pa.binary())], schema=schema)
