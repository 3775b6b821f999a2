"""``ValueState``, ``ListState`` and ``MapState`` of a ``StatefulProcessor``, over one store.

Each variable lives in its own column family keyed by the grouping key; the key a call applies to
is the *implicit key* of the handler being run (``KeyContext``). During a batch a variable reads
through a per-key cache (value state is prefetched for all keys of the batch with one multi-get)
and buffers its writes, which ``flush`` hands to the store in bulk at the end of each phase.

Values are encoded with the declared schema (``ValueCodec``). A list is one value per key: its
elements, each ``uint32`` length-prefixed and encoded with the element schema; a map likewise holds
``(user key, value)`` pairs, the user key in the order-preserving key encoding (maps iterate in
user-key order). With a TTL every element carries its expiration (``__expires_ms``) and
``$ttl_<name>`` indexes each key by its earliest expiration (see :mod:`.ttl`).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from sparkstate.operators.grouping import decode_present
from sparkstate.operators.state_errors import (
    InvalidStateValueError,
    UnsupportedStateOperationError,
)
from sparkstate.operators.ts_index import (
    MARKER_SCHEMA,
    NO_TS,
    TimestampIndex,
    index_key_schema,
)
from sparkstate.operators.ttl import TTL_FIELD, expiration_ms, is_expired, ttl_cf_name
from sparkstate.store.base import StateStore
from sparkstate.store.codec import KeyCodec, ValueCodec

__all__ = [
    "LIST_VALUE_SCHEMA",
    "MAP_VALUE_SCHEMA",
    "KeyContext",
    "ListState",
    "MapState",
    "ValueState",
    "VarSpec",
    "decode_list",
    "decode_map",
]

LIST_VALUE_SCHEMA = pa.schema([pa.field("elements", pa.binary(), nullable=False)])
MAP_VALUE_SCHEMA = pa.schema([pa.field("entries", pa.binary(), nullable=False)])
_U32 = struct.Struct("<I")
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
        if self.ttl_ms is not None:
            out[ttl_cf_name(self.name)] = (index_key_schema(grouping), MARKER_SCHEMA)
        return out

    def describe(self) -> dict[str, Any]:
        """What must not change across restarts (the TTL may: Spark allows a new TTL)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "schema": [[f.name, str(f.type)] for f in self.schema],
            "ttl": self.ttl_ms is not None,
        }
        if self.key_schema is not None:
            out["key_schema"] = [[f.name, str(f.type)] for f in self.key_schema]
        return out


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


def _as_value(value: Any, width: int, what: str) -> tuple[Any, ...]:
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


class _StateVar:
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
        self._element_codec = ValueCodec(spec.element_schema)
        self._index = None if self._ttl is None else TimestampIndex(ttl_cf_name(spec.name))
        #: Earliest expiration of each loaded key as stored (what the TTL index holds).
        self._indexed: dict[bytes, int] = {}
        self._dirty: set[bytes] = set()

    def _key(self, what: str) -> bytes:
        kenc = self._ctx.kenc
        if kenc is None:
            raise _no_key(self.kind, self._name, what)
        return kenc

    def _expiration(self) -> int:
        return expiration_ms(self._ctx.batch_ts, self._ttl)

    def _live(self, expiration: int) -> bool:
        return not is_expired(expiration, self._ctx.batch_ts)

    def _raw(self, kenc: bytes) -> bytes | None:
        return self._store.raw_get(self._fam.prefix + kenc)

    def flush(self) -> tuple[int, int]:
        """Write the dirty keys (and TTL index moves); returns (rows written, rows deleted)."""
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


class ValueState(_StateVar):
    """A single value per grouping key (PySpark's ``ValueState``)."""

    kind: ClassVar[str] = "ValueState"

    def __init__(self, spec: VarSpec, ctx: KeyContext, store: StateStore) -> None:
        super().__init__(spec, ctx, store)
        self._cache: dict[bytes, tuple[Any, ...] | None] = {}
        self._exp: dict[bytes, int] = {}

    def prefetch(self, kencs: list[bytes]) -> None:
        """Read the values of many keys with one multi-get."""
        fam = self._fam
        todo = [k for k in kencs if k not in self._cache] if self._cache else kencs
        rows = decode_present(fam, self._store.raw_get_many([fam.prefix + k for k in todo]))
        self._remember(todo, rows)

    def _remember(self, kencs: list[bytes], rows: list[Any]) -> None:
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

    def get(self) -> tuple[Any, ...] | None:
        """The key's value, or None."""
        kenc = self._ctx.kenc
        if kenc is None:
            raise _no_key(self.kind, self._name, "get")
        value = self._cache.get(kenc, _MISSING)
        if value is _MISSING:
            value = self._load(kenc)
        if self._ttl is not None and value is not None and not self._live(self._exp[kenc]):
            return None
        return value  # type: ignore[no-any-return]

    def update(self, newValue: Any) -> None:  # noqa: N803 - PySpark's name
        """Set the key's value (a tuple of the schema's fields); under TTL, restart its clock."""
        kenc = self._ctx.kenc
        if kenc is None:
            raise _no_key(self.kind, self._name, "update")
        if (
            type(newValue) is tuple
            and len(newValue) == self._width
            and _is_plain(map(type, newValue))
        ):
            value = newValue
        else:
            value = _as_value(newValue, self._width, f"ValueState {self._name!r}")
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

    def flush(self) -> tuple[int, int]:
        if not self._dirty:
            return 0, 0
        dirty, self._dirty = self._dirty, set()
        if self._ttl is not None:
            unknown = [k for k in dirty if k not in self._indexed]
            if unknown:  # written without a read: learn what the TTL index holds for them
                rows = decode_present(
                    self._fam, self._store.raw_get_many([self._fam.prefix + k for k in unknown])
                )
                w = self._width
                self._indexed.update(
                    (k, NO_TS if r is None else r[w]) for k, r in zip(unknown, rows, strict=True)
                )
        cache, exp = self._cache, self._exp
        deletes = [k for k in dirty if cache[k] is None]
        puts = [k for k in dirty if cache[k] is not None] if deletes else list(dirty)
        if self._ttl is None:
            values = [cache[k] for k in puts]
        else:
            values = [(*cache[k], exp[k]) for k in puts]  # type: ignore[misc]
        prefix = self._fam.prefix
        if puts:
            try:
                encoded = self._fam.value_codec.encode_many(values)
            except ValueError as exc:
                exc.add_note(f"sparkstate: in a value of ValueState {self._name!r}")
                raise
            self._store.raw_put_many([prefix + k for k in puts], encoded)
        if deletes:
            self._store.raw_delete_many([prefix + k for k in deletes])
        if self._index is not None:
            for kenc in dirty:
                new = exp[kenc] if cache[kenc] is not None else NO_TS
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), new)
                self._indexed[kenc] = new
            self._index.flush(self._store)
        return len(puts), len(deletes)

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


class _BlobState(_StateVar):
    """List and map state: the key's elements as one value, decoded on first use in a batch."""

    def _min_expiration(self, exps: Iterable[int]) -> int:
        return min(exps, default=NO_TS) if self._ttl is not None else NO_TS

    def _write(self, blobs: dict[bytes, bytes | None]) -> tuple[int, int]:
        puts = [k for k, b in blobs.items() if b is not None]
        deletes = [k for k, b in blobs.items() if b is None]
        prefix, encode = self._fam.prefix, self._fam.value_codec.encode
        if puts:
            self._store.raw_put_many(
                [prefix + k for k in puts], [encode((blobs[k],)) for k in puts]
            )
        if deletes:
            self._store.raw_delete_many([prefix + k for k in deletes])
        return len(puts), len(deletes)


def _split_blob(blob: bytes) -> list[bytes]:
    parts, pos, n = [], 0, len(blob)
    while pos < n:
        (size,) = _U32.unpack_from(blob, pos)
        parts.append(blob[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return parts


def _join_blob(parts: Iterable[bytes]) -> bytes:
    return b"".join(_U32.pack(len(p)) + p for p in parts)


def decode_list(codec: ValueCodec, blob: bytes) -> list[tuple[Any, ...]]:
    """The elements of a stored list (with the expiration field under TTL): for state readers."""
    return [codec.decode(p) for p in _split_blob(blob)]


def decode_map(
    key_codec: KeyCodec, value_codec: ValueCodec, blob: bytes
) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """The ``(user key, value)`` entries of a stored map, in user-key order: for state readers."""
    parts = _split_blob(blob)
    return [
        (key_codec.decode(parts[i]), value_codec.decode(parts[i + 1]))
        for i in range(0, len(parts), 2)
    ]


class ListState(_BlobState):
    """A list of values per grouping key (PySpark's ``ListState``)."""

    kind: ClassVar[str] = "ListState"

    def __init__(self, spec: VarSpec, ctx: KeyContext, store: StateStore) -> None:
        super().__init__(spec, ctx, store)
        self._cache: dict[bytes, list[tuple[tuple[Any, ...], int]]] = {}

    def _elements(self, what: str) -> tuple[bytes, list[tuple[tuple[Any, ...], int]]]:
        kenc = self._key(what)
        found = self._cache.get(kenc)
        if found is None:
            found = []
            raw = self._raw(kenc)
            if raw is not None:
                w = self._width
                for row in decode_list(self._element_codec, self._fam.value_codec.decode(raw)[0]):
                    found.append((row[:w], row[w]) if self._ttl is not None else (row, NO_TS))
            self._cache[kenc] = found
            self._indexed[kenc] = self._min_expiration(e for _, e in found)
        return kenc, found

    def exists(self) -> bool:
        _, elements = self._elements("exists")
        return any(self._live(e) for _, e in elements)

    def get(self) -> Iterator[tuple[Any, ...]]:
        """The key's live elements, oldest first."""
        _, elements = self._elements("get")
        return iter([v for v, e in elements if self._live(e)])

    def _checked(self, values: Any, what: str) -> list[tuple[tuple[Any, ...], int]]:
        if values is None or isinstance(values, str | bytes | dict | tuple):
            msg = f"ListState {self._name!r}.{what} needs a list of tuples, got {values!r}"
            raise InvalidStateValueError(msg)
        label = f"ListState {self._name!r}.{what}"
        exp = self._expiration()
        out = [(_as_value(v, self._width, label), exp) for v in values]
        if not out:
            msg = f"{label}: the list of values must not be empty"
            raise InvalidStateValueError(msg)
        return out

    def put(self, newState: Any) -> None:  # noqa: N803
        """Replace the key's elements."""
        kenc, _ = self._elements("put")
        self._cache[kenc] = self._checked(newState, "put")
        self._dirty.add(kenc)

    def appendValue(self, newState: Any) -> None:  # noqa: N802, N803
        """Add one element."""
        kenc, elements = self._elements("appendValue")
        label = f"ListState {self._name!r}.appendValue"
        elements.append((_as_value(newState, self._width, label), self._expiration()))
        self._dirty.add(kenc)

    def appendList(self, newState: Any) -> None:  # noqa: N802, N803
        """Add several elements."""
        kenc, elements = self._elements("appendList")
        elements.extend(self._checked(newState, "appendList"))
        self._dirty.add(kenc)

    def clear(self) -> None:
        """Remove all the key's elements."""
        kenc, _ = self._elements("clear")
        self._cache[kenc] = []
        self._dirty.add(kenc)

    def flush(self) -> tuple[int, int]:
        if not self._dirty:
            return 0, 0
        dirty, self._dirty = self._dirty, set()
        blobs: dict[bytes, bytes | None] = {}
        encode = self._element_codec.encode
        for kenc in dirty:
            elements = self._cache[kenc]
            if not elements:
                blobs[kenc] = None
            elif self._ttl is None:
                blobs[kenc] = _join_blob(encode(v) for v, _ in elements)
            else:
                blobs[kenc] = _join_blob(encode((*v, e)) for v, e in elements)
            if self._index is not None:
                new = self._min_expiration(e for _, e in elements)
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), new)
                self._indexed[kenc] = new
        written = self._write(blobs)
        if self._index is not None:
            self._index.flush(self._store)
        return written

    def _drop_expired(self, kenc: bytes) -> int:
        self._ctx.kenc, saved = kenc, self._ctx.kenc
        try:
            _, elements = self._elements("evict")
        finally:
            self._ctx.kenc = saved
        live = [(v, e) for v, e in elements if self._live(e)]
        self._cache[kenc] = live
        self._dirty.add(kenc)
        return len(elements) - len(live)


class MapState(_BlobState):
    """A map from user keys to values per grouping key (PySpark's ``MapState``)."""

    kind: ClassVar[str] = "MapState"

    def __init__(self, spec: VarSpec, ctx: KeyContext, store: StateStore) -> None:
        super().__init__(spec, ctx, store)
        assert spec.key_schema is not None
        self._user_key_codec = KeyCodec(spec.key_schema)
        self._key_width = len(spec.key_schema)
        #: grouping key -> user key bytes -> (user key, value, expiration)
        self._cache: dict[bytes, dict[bytes, tuple[tuple[Any, ...], tuple[Any, ...], int]]] = {}

    def _entries(
        self, what: str
    ) -> tuple[bytes, dict[bytes, tuple[tuple[Any, ...], tuple[Any, ...], int]]]:
        kenc = self._key(what)
        found = self._cache.get(kenc)
        if found is None:
            found = {}
            raw = self._raw(kenc)
            if raw is not None:
                parts = _split_blob(self._fam.value_codec.decode(raw)[0])
                decode_key, decode_value = self._user_key_codec.decode, self._element_codec.decode
                w = self._width
                for i in range(0, len(parts), 2):
                    row = decode_value(parts[i + 1])
                    exp = row[w] if self._ttl is not None else NO_TS
                    found[parts[i]] = (decode_key(parts[i]), row[:w], exp)
            self._cache[kenc] = found
            self._indexed[kenc] = self._min_expiration(e for _, _, e in found.values())
        return kenc, found

    def _user_key(self, key: Any, what: str) -> tuple[tuple[Any, ...], bytes]:
        label = f"MapState {self._name!r}.{what} key"
        if key is not None and self._key_width == 1 and not isinstance(key, tuple | list):
            key = (key,)
        user_key = _as_value(key, self._key_width, label)
        try:
            return user_key, self._user_key_codec.encode(user_key)
        except ValueError as exc:
            exc.add_note(f"sparkstate: in {label}")
            raise

    def _live_items(
        self, what: str
    ) -> list[tuple[bytes, tuple[tuple[Any, ...], tuple[Any, ...], int]]]:
        _, entries = self._entries(what)
        return sorted((k, v) for k, v in entries.items() if self._live(v[2]))

    def exists(self) -> bool:
        _, entries = self._entries("exists")
        return any(self._live(e) for _, _, e in entries.values())

    def getValue(self, key: Any) -> tuple[Any, ...] | None:  # noqa: N802
        """The value of ``key``, or None."""
        _, entries = self._entries("getValue")
        found = entries.get(self._user_key(key, "getValue")[1])
        return found[1] if found is not None and self._live(found[2]) else None

    def containsKey(self, key: Any) -> bool:  # noqa: N802
        return self.getValue(key) is not None

    def updateValue(self, key: Any, value: Any) -> None:  # noqa: N802
        """Set the value of ``key``; under TTL, restart that entry's clock."""
        kenc, entries = self._entries("updateValue")
        user_key, kbytes = self._user_key(key, "updateValue")
        label = f"MapState {self._name!r}.updateValue"
        entries[kbytes] = (user_key, _as_value(value, self._width, label), self._expiration())
        self._dirty.add(kenc)

    def removeKey(self, key: Any) -> None:  # noqa: N802
        kenc, entries = self._entries("removeKey")
        if entries.pop(self._user_key(key, "removeKey")[1], None) is not None:
            self._dirty.add(kenc)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(key, value)`` pairs in user-key order."""
        return iter([(k, v) for _, (k, v, _) in self._live_items("iterator")])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter([k for _, (k, _, _) in self._live_items("keys")])

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter([v for _, (_, v, _) in self._live_items("values")])

    def clear(self) -> None:
        kenc, _ = self._entries("clear")
        self._cache[kenc] = {}
        self._dirty.add(kenc)

    def flush(self) -> tuple[int, int]:
        if not self._dirty:
            return 0, 0
        dirty, self._dirty = self._dirty, set()
        blobs: dict[bytes, bytes | None] = {}
        encode = self._element_codec.encode
        ttl = self._ttl is not None
        for kenc in dirty:
            entries = self._cache[kenc]
            if not entries:
                blobs[kenc] = None
            else:
                parts: list[bytes] = []
                for kbytes in sorted(entries):
                    _, value, exp = entries[kbytes]
                    parts += (kbytes, encode((*value, exp) if ttl else value))
                blobs[kenc] = _join_blob(parts)
            if self._index is not None:
                new = self._min_expiration(e for _, _, e in entries.values())
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), new)
                self._indexed[kenc] = new
        written = self._write(blobs)
        if self._index is not None:
            self._index.flush(self._store)
        return written

    def _drop_expired(self, kenc: bytes) -> int:
        self._ctx.kenc, saved = kenc, self._ctx.kenc
        try:
            _, entries = self._entries("evict")
        finally:
            self._ctx.kenc = saved
        expired = [k for k, (_, _, e) in entries.items() if not self._live(e)]
        for k in expired:
            del entries[k]
        self._dirty.add(kenc)
        return len(expired)
