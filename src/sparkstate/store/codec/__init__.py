"""Row codecs: an order-preserving key encoding and a compact, versioned value encoding.

``KeyCodec`` (:mod:`._keys`) maps a key row to bytes whose bytewise order is the row's value order,
so RocksDB and the scans of every provider compare keys as bytes. ``ValueCodec`` (:mod:`._values`)
packs a value row behind a version byte and a null bitmap; values of a column family whose schema
evolved start with a header naming their schema (:mod:`sparkstate.store.evolution`). Both check
Python values column by column (:mod:`._columns`) and have batch methods (``encode_many``,
``decode_many_arrow``) that work on whole Arrow columns (:mod:`._arrow`).

``schema_to_json`` and ``schema_from_json`` are :mod:`sparkstate.store.schema_json`'s, re-exported.
"""

from sparkstate.store.codec._keys import KEY_FORMAT_VERSION, KeyCodec
from sparkstate.store.codec._values import VALUE_FORMAT_VERSION, ValueCodec
from sparkstate.store.schema_json import schema_from_json, schema_to_json

__all__ = [
    "KEY_FORMAT_VERSION",
    "VALUE_FORMAT_VERSION",
    "KeyCodec",
    "ValueCodec",
    "schema_from_json",
    "schema_to_json",
]
