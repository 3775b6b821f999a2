"""A store's column families: typed keyspaces of one store, each a key and a value schema with
their codecs, and a physical key prefix (one length byte, then the family's UTF-8 name) in front
of every key of the family. The physical key layout is known to this package alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.store.codec import KeyCodec, ValueCodec
from sparkstate.store.conf import DEFAULT_CF

__all__ = [
    "MAX_CF_NAME_BYTES",
    "ColumnFamily",
    "KeyRows",
    "Row",
    "cf_prefix",
    "family_of",
    "key_successor",
]

MAX_CF_NAME_BYTES = 200

Row: TypeAlias = tuple[Any, ...]
KeyRows: TypeAlias = Sequence[Row] | pa.Table | pa.RecordBatch


def cf_prefix(name: str) -> bytes:
    """The physical key prefix of a column family: one length byte, then the UTF-8 name.

    The default family has the empty name, so its prefix is the single byte ``0x00``.
    """
    raw = b"" if name == DEFAULT_CF else name.encode("utf-8")
    if len(raw) > MAX_CF_NAME_BYTES:
        msg = f"column family name {name!r} is longer than {MAX_CF_NAME_BYTES} bytes"
        raise ConfigurationError(msg)
    return bytes([len(raw)]) + raw


def family_of(key: bytes) -> bytes:
    """The column family prefix of a physical key (:func:`cf_prefix`): its length byte and the
    name."""
    return key[: 1 + key[0]] if key else key


class ColumnFamily:
    """A typed keyspace of a store: its codecs and physical key prefix."""

    def __init__(self, name: str, key_schema: pa.Schema, value_schema: pa.Schema) -> None:
        self.name = name
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.prefix = cf_prefix(name)
        self.key_codec = KeyCodec(key_schema)
        self.value_codec = ValueCodec(value_schema)

    def physical_key(self, key: Row) -> bytes:
        return self.prefix + self.key_codec.encode(key)

    def physical_keys(self, keys: KeyRows) -> list[bytes]:
        return self.key_codec.encode_many(keys, self.prefix)

    def end_of_family(self) -> bytes:
        """The smallest physical key greater than every key of this family."""
        return key_successor(self.prefix)


def key_successor(prefix: bytes) -> bytes:
    """Smallest byte string greater than every string that starts with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\xff" * (len(prefix) + 1)
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
