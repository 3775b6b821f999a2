"""State variables of a ``StatefulProcessor`` over one store: their spec and ``ValueState``.

Each variable lives in its own column family keyed by the grouping key; the key a call applies to
is the *implicit key* of the handler being run (``KeyContext``). During a batch a variable reads
through a per-key cache (value state is prefetched for all keys of the batch with one multi-get)
and buffers its writes, which ``flush`` hands to the store in bulk at the end of each phase.

Values are encoded with the declared schema (``ValueCodec``); with a TTL every value carries its
expiration (``__expires_ms``) and ``$ttl_<name>`` indexes keys by expiration (see :mod:`.ttl`).
A schema may evolve across restarts (nullable fields added, fields dropped or reordered): list
elements and map values, stored inside one blob per key, take their codec from the empty column
family ``$elements_<name>``, whose value schema history is the element schema's. With
``sparkstate.PICKLED`` as the schema, values are any picklable objects, kept internally as
1-tuples and stored pickled. List and map state live in :mod:`.state_collections`.

A variable knows whether each key it writes was stored (and a map, its entries), so each flush
changes its rows as Spark counts them in ``$rows_count`` (:mod:`.state_rows`) without a scan.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.operators.arbitrary.nested_values import user_converter
from sparkstate.operators.arbitrary.state_errors import (
    InvalidStateValueError,
    UnsupportedStateOperationError,
)
from sparkstate.operators.arbitrary.state_rows import RowCount, RowsOfValue
from sparkstate.operators.arbitrary.ttl import TTL_FIELD, expiration_ms, is_expired, ttl_cf_name
from sparkstate.operators.grouping import decode_present
from sparkstate.operators.ts_index import (
    MARKER_SCHEMA,
    NO_TS,
    TimestampIndex,
    index_key_schema,
)
from sparkstate.store.base import StateStore
from sparkstate.store.evolution import NOT_COMPATIBLE, show_fields
from sparkstate.store.schema_json import fields_of, schema_to_json

__all__ = [
    "LIST_VALUE_SCHEMA",
    "MAP_VALUE_SCHEMA",
    "KeyContext",
    "StateVariable",
    "ValueState",
    "VarSpec",
    "as_state_value",
    "elements_cf_name",
]

LIST_VALUE_SCHEMA = pa.schema([pa.field("elements", pa.binary(), nullable=False)])
MAP_VALUE_SCHEMA = pa.schema([pa.field("entries", pa.binary(), nullable=False)])
_MISSING: Any = object()
_PLAIN = frozenset({int, float, str, bool, bytes, type(None)})
_is_plain = _PLAIN.issuperset


@dataclasses.dataclass(frozen=True)
class VarSpec:
    """A declared state variable: what ``init`` asked for, fixed for the life of a checkpoint."""

    name: str
    kind: str  # "value", "list" or "map"
    schema: pa.Schema
    key_schema: pa.Schema | None = None
    ttl_ms: int | None = None
    #: Values are pickled Python objects (``sparkstate.PICKLED``); ``schema`` is their one field.
    pickled: bool = False

    @property
    def element_schema(self) -> pa.Schema:
        """Schema of a stored value or element (with the expiration field under TTL)."""
        if self.ttl_ms is None:
            return self.schema
        return pa.schema([*self.schema, pa.field(TTL_FIELD, pa.int64(), nullable=False)])

    def column_families(self, grouping: pa.Schema) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        value = {"value": self.element_schema, "list": LIST_VALUE_SCHEMA}.get(
            self.kind, MAP_VALUE_SCHEMA
        )
        out = {self.name: (grouping, value)}
        if self.kind != "value":  # holds no data: records the element schema's history
            out[elements_cf_name(self.name)] = (grouping, self.element_schema)
        if self.ttl_ms is not None:
            out[ttl_cf_name(self.name)] = (index_key_schema(grouping), MARKER_SCHEMA)
        return out

    def describe(self) -> dict[str, Any]:
        """What is compared across restarts: the schema may evolve compatibly, the rest must not
        change (the TTL may: Spark allows a new TTL)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "schema": schema_to_json(self.schema),
            "ttl": self.ttl_ms is not None,
        }
        if self.key_schema is not None:
            out["key_schema"] = schema_to_json(self.key_schema)
        return out


def elements_cf_name(state_name: str) -> str:
    """The (empty) column family that records the element schema of a list or map state."""
    return f"$elements_{state_name}"


class KeyContext:
    """The implicit grouping key of the handler being run, and the batch's processing time."""

    __slots__ = ("batch_ts", "kenc", "key")

    def __init__(self, batch_ts: int) -> None:
        self.batch_ts = batch_ts
        self.kenc: bytes | None = None
        self.key: tuple[Any, ...] | None = None


def _no_key(kind: str, name: str, method: str) -> UnsupportedStateOperationError:
    msg = (
        f"{kind} {name!r}.{method} needs the implicit grouping key: use state variables in "
        "handleInputRows, "
        "handleExpiredTimer or handleInitialState, not in init or close"
    )
    return UnsupportedStateOperationError(msg)


def as_state_value(value: Any, width: int, what: str) -> tuple[Any, ...]:
    """A state value as a tuple of plain Python values, checked for arity."""
    if value is None:
        msg = f"{what}: None is not a valid state value"
        raise InvalidStateValueError(msg)
    if type(value) is not tuple:
        if isinstance(value, dict | str | bytes):
            msg = f"{what}: a state value must be a tuple of field values, got {value!r}"
            raise InvalidStateValueError(msg)
        try:
            value = tuple(value)
        except TypeError:
            msg = f"{what}: a state value must be a tuple of field values, got {value!r}"
            raise InvalidStateValueError(msg) from None
    if len(value) != width:
        msg = f"{what}: value {value!r} has {len(value)} fields, the schema has {width}"
        raise InvalidStateValueError(msg)
    checked: tuple[Any, ...] = value
    for v in checked:
        if type(v) not in _PLAIN:
            return tuple(v.item() if isinstance(v, np.generic) else v for v in checked)
    return checked


def _check_store_schema(spec: VarSpec, stored: pa.Schema) -> None:
    """Refuse a store whose values have another schema than the variable declares (rather than
    blame the first value written for its arity)."""
    want = spec.element_schema
    if [(f.name, f.type) for f in stored] != [(f.name, f.type) for f in want]:
        msg = (
            f"{spec.kind} state {spec.name!r} declares the value schema "
            f"{show_fields(fields_of(want))}, but its store was opened with "
            f"{show_fields(fields_of(stored))}"
        )
        raise SchemaMismatchError(msg, NOT_COMPATIBLE)


class StateVariable:
    """What all three kinds share: the spec, the key context, TTL bookkeeping, dirty keys."""

    kind: ClassVar[str]

    def __init__(self, spec: VarSpec, ctx: KeyContext, store: StateStore) -> None:
        self._spec = spec
        self._name = spec.name
        self._ctx = ctx
        self._store = store
        self._fam = store.column_family(spec.name)
        self._ttl = spec.ttl_ms
        self._width = len(spec.schema)
        self._pickled = spec.pickled
        #: Nested values as PySpark gives them (lists, Rows, dicts); None: no nested column.
        self._to_user = None if spec.pickled else user_converter(spec.schema)
        if spec.kind == "value":
            self._element_codec = self._fam.value_codec
        else:
            self._element_codec = store.column_family(elements_cf_name(spec.name)).value_codec
        _check_store_schema(spec, self._element_codec.schema)
        self._index = None if self._ttl is None else TimestampIndex(ttl_cf_name(spec.name))
        #: Earliest expiration of each loaded key as stored (what the TTL index holds).
        self._indexed: dict[bytes, int] = {}
        self._dirty: set[bytes] = set()
        #: Rows of each loaded key as stored (Spark's: a map's entries, a value or list one).
        self._stored: dict[bytes, int] = {}
        self._rows = RowCount(store, spec.name, self._rows_of_value())

    def _key(self, what: str) -> bytes:
        kenc = self._ctx.kenc
        if kenc is None:
            raise _no_key(self.kind, self._name, what)
        return kenc

    def _expiration(self) -> int:
        return expiration_ms(self._ctx.batch_ts, self._ttl)

    def _live(self, expiration: int) -> bool:
        return not is_expired(expiration, self._ctx.batch_ts)

    def _as_value(self, value: Any, what: str) -> tuple[Any, ...]:
        """A value the user gives, as kept in the caches (PICKLED: a 1-tuple of the object)."""
        if not self._pickled:
            return as_state_value(value, self._width, what)
        if value is None:
            msg = f"{what}: None is not a valid state value"
            raise InvalidStateValueError(msg)
        return (value,)

    def _user_value(self, value: tuple[Any, ...]) -> Any:
        """A cached value as the user sees it."""
        if self._pickled:
            return value[0]
        return value if self._to_user is None else self._to_user(value)

    @staticmethod
    def _pickled_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A cached PICKLED row (object first, then the expiration under TTL) as stored."""
        return (pickle.dumps(row[0], pickle.HIGHEST_PROTOCOL), *row[1:])

    @staticmethod
    def _unpickled_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return (pickle.loads(row[0]), *row[1:])

    def _raw(self, kenc: bytes) -> bytes | None:
        return self._store.get_encoded(kenc, self._name)

    def _rows_of_value(self) -> RowsOfValue:
        """The rows of one stored value as Spark counts them (None: one)."""
        return None

    def flush(self) -> tuple[int, int]:
        """Write the dirty keys (and TTL index moves) and the variable's rows; returns (rows
        written, rows deleted)."""
        if not self._dirty:
            self._rows.add(0)
            return 0, 0
        dirty, self._dirty = self._dirty, set()
        written, deleted, rows = self._flush(dirty)
        self._rows.add(rows)
        return written, deleted

    def _flush(self, dirty: set[bytes]) -> tuple[int, int, int]:
        """Write ``dirty``; returns (rows written, rows deleted, rows Spark counts added)."""
        raise NotImplementedError

    def evict_expired(self) -> int:
        """Delete what expired by this batch's processing time; returns values removed."""
        if self._index is None:
            return 0
        self.flush()
        removed = 0
        for _, kenc in self._index.due(self._store, self._ctx.batch_ts):
            removed += self._drop_expired(kenc)
        self.flush()
        return removed

    def _drop_expired(self, kenc: bytes) -> int:
        raise NotImplementedError


class ValueState(StateVariable):
    """A single value per grouping key (PySpark's ``ValueState``)."""

    kind: ClassVar[str] = "ValueState"

    def __init__(self, spec: VarSpec, ctx: KeyContext, store: StateStore) -> None:
        super().__init__(spec, ctx, store)
        self._cache: dict[bytes, tuple[Any, ...] | None] = {}
        self._exp: dict[bytes, int] = {}

    def prefetch(self, kencs: list[bytes]) -> None:
        """Read the values of many keys with one multi-get."""
        todo = [k for k in kencs if k not in self._cache] if self._cache else kencs
        rows = decode_present(self._fam, self._store.get_encoded_many(todo, self._name))
        self._remember(todo, rows)

    def _remember(self, kencs: list[bytes], rows: list[Any]) -> None:
        self._stored.update(zip(kencs, [r is not None for r in rows], strict=True))
        if self._pickled:
            rows = [None if r is None else self._unpickled_row(r) for r in rows]
        if self._ttl is None:
            self._cache.update(zip(kencs, rows, strict=True))
            return
        w = self._width
        for kenc, row in zip(kencs, rows, strict=True):
            exp = NO_TS if row is None else row[w]
            self._cache[kenc] = None if row is None else row[:w]
            self._exp[kenc] = self._indexed[kenc] = exp

    def _load(self, kenc: bytes) -> tuple[Any, ...] | None:
        raw = self._raw(kenc)
        self._remember([kenc], [None if raw is None else self._fam.value_codec.decode(raw)])
        return self._cache[kenc]

    def exists(self) -> bool:
        """Whether the key has a (live) value."""
        return self.get() is not None

    def get(self) -> Any:
        """The key's value (a tuple; PICKLED: the object), or None."""
        kenc = self._ctx.kenc
        if kenc is None:
            raise _no_key(self.kind, self._name, "get")
        value = self._cache.get(kenc, _MISSING)
        if value is _MISSING:
            value = self._load(kenc)
        if self._ttl is not None and value is not None and not self._live(self._exp[kenc]):
            return None
        return None if value is None else self._user_value(value)

    def update(self, newValue: Any) -> None:  # noqa: N803 - PySpark's name
        """Set the key's value (a tuple of the schema's fields); under TTL, restart its clock."""
        kenc = self._ctx.kenc
        if kenc is None:
            raise _no_key(self.kind, self._name, "update")
        if self._pickled:
            value = self._as_value(newValue, f"ValueState {self._name!r}")
        elif (
            type(newValue) is tuple
            and len(newValue) == self._width
            and _is_plain(map(type, newValue))
        ):
            value = newValue
        else:
            value = as_state_value(newValue, self._width, f"ValueState {self._name!r}")
        self._cache[kenc] = value
        if self._ttl is not None:
            self._exp[kenc] = self._expiration()
        self._dirty.add(kenc)

    def clear(self) -> None:
        """Remove the key's value."""
        kenc = self._key("clear")
        self._cache[kenc] = None
        self._exp[kenc] = NO_TS
        self._dirty.add(kenc)

    def _flush(self, dirty: set[bytes]) -> tuple[int, int, int]:
        stored = self._stored
        unknown = [k for k in dirty if k not in stored]
        if unknown:  # written without a read: learn whether they are stored (and their TTL)
            raws = self._store.get_encoded_many(unknown, self._name)
            stored.update(zip(unknown, [r is not None for r in raws], strict=True))
            if self._ttl is not None:
                rows = decode_present(self._fam, raws)
                w = self._width
                self._indexed.update(
                    (k, NO_TS if r is None else r[w]) for k, r in zip(unknown, rows, strict=True)
                )
        before = sum(map(stored.__getitem__, dirty))
        cache, exp = self._cache, self._exp
        deletes = [k for k in dirty if cache[k] is None]
        puts = [k for k in dirty if cache[k] is not None] if deletes else list(dirty)
        if self._ttl is None:
            values = [cache[k] for k in puts]
        else:
            values = [(*cache[k], exp[k]) for k in puts]  # type: ignore[misc]
        if self._pickled:
            values = [self._pickled_row(v) for v in values]  # type: ignore[arg-type]
        if puts:
            try:
                encoded = self._fam.value_codec.encode_many(values)
            except ValueError as exc:
                exc.add_note(f"sparkstate: in a value of ValueState {self._name!r}")
                raise
            self._store.put_encoded_many(puts, encoded, self._name)
        if deletes:
            self._store.remove_encoded_many(deletes, self._name)
        if self._index is not None:
            for kenc in dirty:
                new = exp[kenc] if cache[kenc] is not None else NO_TS
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), new)
                self._indexed[kenc] = new
            self._index.flush(self._store)
        stored.update(dict.fromkeys(puts, True))
        stored.update(dict.fromkeys(deletes, False))
        return len(puts), len(deletes), len(puts) - before

    def _drop_expired(self, kenc: bytes) -> int:
        value = self._cache.get(kenc, _MISSING)
        if value is _MISSING:
            value = self._load(kenc)
        if value is None or self._live(self._exp[kenc]):
            if value is None and self._index is not None:  # a stale index entry
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), NO_TS)
                self._indexed[kenc] = NO_TS
            return 0
        self._cache[kenc] = None
        self._exp[kenc] = NO_TS
        self._dirty.add(kenc)
        return 1
