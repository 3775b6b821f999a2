"""``ListState`` and ``MapState``: a key's elements stored as one value of its column family.

A list is encoded as its elements, each ``uint32`` length-prefixed and encoded with the element
schema; a map as ``(user key, value)`` pairs, the user key in the order-preserving key encoding,
so maps iterate in user-key order. A key's elements are decoded on its first use in a batch and
written back once, at the end of the phase. Under TTL each element carries its own expiration
and the TTL index holds the key's earliest one. ``decode_list`` / ``decode_map`` read the stored
form back (for state readers and the test harness). Elements are encoded with the codec of the
element schema's history (``$elements_<name>``), so old elements read under an evolved schema;
with ``sparkstate.PICKLED`` an element (or map value) is any picklable object.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from sparkstate.operators.arbitrary.state_errors import InvalidStateValueError
from sparkstate.operators.arbitrary.state_rows import RowsOfValue
from sparkstate.operators.arbitrary.state_vars import (
    KeyContext,
    StateVariable,
    VarSpec,
    as_state_value,
)
from sparkstate.operators.ts_index import NO_TS
from sparkstate.store.base import StateStore
from sparkstate.store.codec import KeyCodec, ValueCodec

__all__ = ["ListState", "MapState", "decode_list", "decode_map", "join_blob", "map_rows"]

_U32 = struct.Struct("<I")


class _BlobState(StateVariable):
    """List and map state: the key's elements as one value, decoded on first use in a batch."""

    def _element_encoder(self) -> Callable[[tuple[Any, ...]], bytes]:
        encode = self._element_codec.encode
        if not self._pickled:
            return encode
        pickled = self._pickled_row
        return lambda row: encode(pickled(row))

    def _element_decoder(self) -> Callable[[bytes], tuple[Any, ...]]:
        decode = self._element_codec.decode
        if not self._pickled:
            return decode
        unpickled = self._unpickled_row
        return lambda data: unpickled(decode(data))

    def _min_expiration(self, exps: Iterable[int]) -> int:
        return min(exps, default=NO_TS) if self._ttl is not None else NO_TS

    def _write(self, blobs: dict[bytes, bytes | None]) -> tuple[int, int]:
        puts = [k for k, b in blobs.items() if b is not None]
        deletes = [k for k, b in blobs.items() if b is None]
        encode = self._fam.value_codec.encode
        if puts:
            self._store.put_encoded_many(puts, [encode((blobs[k],)) for k in puts], self._name)
        if deletes:
            self._store.remove_encoded_many(deletes, self._name)
        return len(puts), len(deletes)


def _split_blob(blob: bytes) -> list[bytes]:
    parts, pos, n = [], 0, len(blob)
    while pos < n:
        (size,) = _U32.unpack_from(blob, pos)
        parts.append(blob[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return parts


def map_rows(value_codec: ValueCodec) -> Callable[[bytes], int]:
    """The entries of a stored value of a map's family: Spark keeps each in a row."""
    decode, unpack = value_codec.decode, _U32.unpack_from

    def entries(raw: bytes) -> int:
        blob = decode(raw)[0]
        parts, pos, n = 0, 0, len(blob)
        while pos < n:
            pos += 4 + unpack(blob, pos)[0]
            parts += 1
        return parts // 2

    return entries


def join_blob(parts: Iterable[bytes]) -> bytes:
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
                decode = self._element_decoder()
                for part in _split_blob(self._fam.value_codec.decode(raw)[0]):
                    row = decode(part)
                    found.append((row[:w], row[w]) if self._ttl is not None else (row, NO_TS))
            self._cache[kenc] = found
            self._indexed[kenc] = self._min_expiration(e for _, e in found)
            self._stored[kenc] = raw is not None
        return kenc, found

    def exists(self) -> bool:
        _, elements = self._elements("exists")
        return any(self._live(e) for _, e in elements)

    def get(self) -> Iterator[tuple[Any, ...]]:
        """The key's live elements (tuples; PICKLED: the objects), oldest first."""
        _, elements = self._elements("get")
        live = [v for v, e in elements if self._live(e)]
        if self._pickled or self._to_user is not None:
            return iter([self._user_value(v) for v in live])
        return iter(live)

    def _checked(self, values: Any, what: str) -> list[tuple[tuple[Any, ...], int]]:
        if values is None or isinstance(values, str | bytes | dict | tuple):
            msg = f"ListState {self._name!r}.{what} needs a list of tuples, got {values!r}"
            raise InvalidStateValueError(msg)
        label = f"ListState {self._name!r}.{what}"
        exp = self._expiration()
        out = [(self._as_value(v, label), exp) for v in values]
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
        elements.append((self._as_value(newState, label), self._expiration()))
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

    def _flush(self, dirty: set[bytes]) -> tuple[int, int, int]:
        blobs: dict[bytes, bytes | None] = {}
        encode = self._element_encoder()
        rows = 0
        for kenc in dirty:
            elements = self._cache[kenc]
            now = bool(elements)
            rows += now - self._stored[kenc]
            self._stored[kenc] = now
            if not elements:
                blobs[kenc] = None
            elif self._ttl is None:
                blobs[kenc] = join_blob(encode(v) for v, _ in elements)
            else:
                blobs[kenc] = join_blob(encode((*v, e)) for v, e in elements)
            if self._index is not None:
                new = self._min_expiration(e for _, e in elements)
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), new)
                self._indexed[kenc] = new
        written, deleted = self._write(blobs)
        if self._index is not None:
            self._index.flush(self._store)
        return written, deleted, rows

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

    def _rows_of_value(self) -> RowsOfValue:
        return map_rows(self._fam.value_codec)

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
                decode_key, decode_value = self._user_key_codec.decode, self._element_decoder()
                w = self._width
                for i in range(0, len(parts), 2):
                    row = decode_value(parts[i + 1])
                    exp = row[w] if self._ttl is not None else NO_TS
                    found[parts[i]] = (decode_key(parts[i]), row[:w], exp)
            self._cache[kenc] = found
            self._indexed[kenc] = self._min_expiration(e for _, _, e in found.values())
            self._stored[kenc] = len(found)
        return kenc, found

    def _user_key(self, key: Any, what: str) -> tuple[tuple[Any, ...], bytes]:
        label = f"MapState {self._name!r}.{what} key"
        if key is not None and self._key_width == 1 and not isinstance(key, tuple | list):
            key = (key,)
        user_key = as_state_value(key, self._key_width, label)
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
        """The value of ``key`` (PICKLED: the object), or None."""
        _, entries = self._entries("getValue")
        found = entries.get(self._user_key(key, "getValue")[1])
        return self._user_value(found[1]) if found is not None and self._live(found[2]) else None

    def containsKey(self, key: Any) -> bool:  # noqa: N802
        return self.getValue(key) is not None

    def updateValue(self, key: Any, value: Any) -> None:  # noqa: N802
        """Set the value of ``key``; under TTL, restart that entry's clock."""
        kenc, entries = self._entries("updateValue")
        user_key, kbytes = self._user_key(key, "updateValue")
        label = f"MapState {self._name!r}.updateValue"
        entries[kbytes] = (user_key, self._as_value(value, label), self._expiration())
        self._dirty.add(kenc)

    def removeKey(self, key: Any) -> None:  # noqa: N802
        kenc, entries = self._entries("removeKey")
        if entries.pop(self._user_key(key, "removeKey")[1], None) is not None:
            self._dirty.add(kenc)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(key, value)`` pairs in user-key order."""
        return iter([(k, self._user_value(v)) for _, (k, v, _) in self._live_items("iterator")])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter([k for _, (k, _, _) in self._live_items("keys")])

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter([self._user_value(v) for _, (_, v, _) in self._live_items("values")])

    def clear(self) -> None:
        kenc, _ = self._entries("clear")
        self._cache[kenc] = {}
        self._dirty.add(kenc)

    def _flush(self, dirty: set[bytes]) -> tuple[int, int, int]:
        blobs: dict[bytes, bytes | None] = {}
        encode = self._element_encoder()
        ttl = self._ttl is not None
        rows = 0
        for kenc in dirty:
            entries = self._cache[kenc]
            rows += len(entries) - self._stored[kenc]
            self._stored[kenc] = len(entries)
            if not entries:
                blobs[kenc] = None
            else:
                parts: list[bytes] = []
                for kbytes in sorted(entries):
                    _, value, exp = entries[kbytes]
                    parts += (kbytes, encode((*value, exp) if ttl else value))
                blobs[kenc] = join_blob(parts)
            if self._index is not None:
                new = self._min_expiration(e for _, _, e in entries.values())
                self._index.move(kenc, self._indexed.get(kenc, NO_TS), new)
                self._indexed[kenc] = new
        written, deleted = self._write(blobs)
        if self._index is not None:
            self._index.flush(self._store)
        return written, deleted, rows

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
