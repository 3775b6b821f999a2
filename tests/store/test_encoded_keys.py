"""The encoded-key methods of ``StateStore``: a family's encoded keys in and out, prefix inside.

Operators encode keys and values in bulk and address the store with those bytes; these tests pin
that the methods store exactly what the typed API stores, keep families apart, scan in key order
with pending writes, count like ``put_many`` / ``remove_many``, refuse closed stores, and that a
write after a read (which may reuse the read's physical keys) writes the keys it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError, StoreClosedError
from sparkstate.store import provider_class
from sparkstate.store.base import StateStore
from sparkstate.store.families import Row
from sparkstate.testing import ProviderFactory

PROVIDERS = ["memory"]
try:  # as in the operator tests: the rocksdb provider is optional
    provider_class("rocksdb")
    PROVIDERS.append("rocksdb")
except Exception:  # noqa: BLE001 - any import problem means "not available"
    pass

KEY = pa.schema([("name", pa.string()), ("n", pa.int64())])
VALUE = pa.schema([("count", pa.int64()), ("label", pa.string())])
OTHER = "other"
FAMILIES = {OTHER: (KEY, pa.schema([("x", pa.float64())]))}
ROWS: dict[Row, Row] = {
    ("b", 2): (2, "two"),
    ("a", -1): (1, None),
    (None, 0): (0, "null name"),
    ("a", 7): (7, "seven"),
}


@pytest.fixture(params=PROVIDERS)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderFactory]:
    factory = ProviderFactory(
        request.param,
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
        column_families=FAMILIES,
    )
    yield factory
    factory.close_all()


def _encoded(store: StateStore, rows: dict[Row, Row]) -> tuple[list[bytes], list[bytes]]:
    """Keys and values of ``rows`` as the default family encodes them."""
    fam = store.column_family()
    return fam.key_codec.encode_many(list(rows)), fam.value_codec.encode_many(list(rows.values()))


def test_encoded_writes_are_what_the_typed_api_writes(factory: ProviderFactory) -> None:
    store = factory.open().get_store(0)
    keys, values = _encoded(store, ROWS)
    store.put_encoded_many(keys, values)
    assert store.get_many(list(ROWS)) == list(ROWS.values())
    fam = store.column_family()
    physical = fam.physical_keys(list(ROWS))
    assert store.raw_get_many(physical) == values  # the same bytes under the same physical keys
    store.put_many([("c", 1)], [(3, "typed")])
    assert store.get_encoded(fam.key_codec.encode(("c", 1))) == fam.value_codec.encode((3, "typed"))
    assert store.get_encoded(fam.key_codec.encode(("c", 2))) is None
    assert store.get_encoded_many([*keys, fam.key_codec.encode(("zz", 0))]) == [*values, None]
    assert store.get_encoded_many([]) == []
    store.commit()
    reader = factory.reopen().get_read_store(1)
    assert reader.get_encoded_many(keys) == values
    assert dict(reader.iterator()) == {**ROWS, ("c", 1): (3, "typed")}


def test_families_are_apart(factory: ProviderFactory) -> None:
    store = factory.open().get_store(0)
    keys, values = _encoded(store, ROWS)
    store.put_encoded_many(keys, values)
    other = store.column_family(OTHER)
    half = other.value_codec.encode((0.5,))
    store.put_encoded_many(keys[:1], [half], OTHER)
    assert store.get_encoded_many(keys, OTHER) == [half, None, None, None]
    assert store.get(list(ROWS)[0], OTHER) == (0.5,)
    store.remove_encoded_many(keys[:1], OTHER)
    assert store.get_encoded(keys[0]) == values[0]
    assert store.get_encoded(keys[0], OTHER) is None
    with pytest.raises(ConfigurationError, match="nope"):
        store.get_encoded_many(keys, "nope")


def test_remove(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    keys, values = _encoded(store, ROWS)
    store.put_encoded_many(keys, values)
    store.commit()
    store = provider.get_store(1)
    absent = store.column_family().key_codec.encode(("absent", 0))
    store.remove_encoded_many([keys[0], absent])
    assert store.get_encoded_many(keys[:2]) == [None, values[1]]
    store.commit()
    assert dict(factory.reopen().get_read_store(2).iterator()) == {
        k: v for k, v in ROWS.items() if k != list(ROWS)[0]
    }


def test_range_scan_in_key_order_with_pending_writes(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    fam = store.column_family()
    keys, values = _encoded(store, ROWS)
    store.put_encoded_many(keys[:2], values[:2])
    store.put(("z", 0), (1.5,), OTHER)  # another family: never in the default family's scan
    store.commit()
    store = provider.get_store(1)
    store.put_encoded_many(keys[2:], values[2:])  # pending, not committed
    store.remove_encoded_many([keys[1]])  # a pending delete of a committed key
    kept = [0, 2, 3]
    expected = sorted((keys[i], values[i]) for i in kept)
    assert list(store.range_scan_encoded()) == expected
    assert [fam.key_codec.decode(k) for k, _ in expected] == [(None, 0), ("a", 7), ("b", 2)]
    # bounds are encoded keys (or key prefixes) of the family, the end excluded
    a = fam.key_codec.encode_prefix(("a",))
    b = fam.key_codec.encode_prefix(("b",))
    assert [k for k, _ in store.range_scan_encoded(a, b)] == [fam.key_codec.encode(("a", 7))]
    assert [k for k, _ in store.range_scan_encoded(start=b)] == [fam.key_codec.encode(("b", 2))]
    assert [k for k, _ in store.range_scan_encoded(end=a)] == [fam.key_codec.encode((None, 0))]
    other = store.column_family(OTHER)
    assert list(store.range_scan_encoded(cf=OTHER)) == [
        (other.key_codec.encode(("z", 0)), other.value_codec.encode((1.5,)))
    ]
    store.commit()
    reader = factory.reopen().get_read_store(2)
    assert list(reader.range_scan_encoded()) == expected


def test_counted_like_put_many_and_remove_many(factory: ProviderFactory) -> None:
    store = factory.open().get_store(0)
    keys, values = _encoded(store, ROWS)
    store.put_encoded_many(keys, values)
    store.remove_encoded_many(keys[:1])
    m = store.metrics()
    assert (m.num_keys, m.num_updated, m.num_removed) == (3, 4, 1)


def test_keys_and_values_must_pair_up(factory: ProviderFactory) -> None:
    store = factory.open().get_store(0)
    keys, values = _encoded(store, ROWS)
    with pytest.raises(ValueError, match="4 keys but 3 values"):
        store.put_encoded_many(keys, values[:3])
    assert store.get_encoded_many(keys) == [None] * 4


def test_closed_and_read_only_stores_refuse(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    keys, values = _encoded(store, ROWS)
    store.put_encoded_many(keys, values)
    store.commit()
    calls = {
        "get_encoded": lambda s: s.get_encoded(keys[0]),
        "get_encoded_many": lambda s: s.get_encoded_many(keys),
        "range_scan_encoded": lambda s: s.range_scan_encoded(),
        "put_encoded_many": lambda s: s.put_encoded_many(keys, values),
        "remove_encoded_many": lambda s: s.remove_encoded_many(keys),
    }
    for name, call in calls.items():
        with pytest.raises(StoreClosedError, match="already committed"):
            call(store)
        reader = provider.get_read_store(1)
        if name.startswith(("put", "remove")):
            with pytest.raises(StoreClosedError, match="read-only"):
                call(reader)
        else:
            call(reader)
        reader.abort()


def test_read_modify_write_writes_the_keys_given(factory: ProviderFactory) -> None:
    """A write after a multi-get may reuse its physical keys; only when the keys are the same."""
    store = factory.open().get_store(0)
    codec = store.column_family().key_codec
    keys, values = _encoded(store, ROWS)
    assert store.get_encoded_many(keys) == [None] * 4
    store.put_encoded_many(keys, values)  # the same keys: a read-modify-write
    assert store.get_encoded_many(keys) == values
    keys[0] = codec.encode(("changed", 0))  # the caller's list changed after the read
    store.put_encoded_many(keys, values)
    assert store.get(("changed", 0)) == ROWS[("b", 2)]
    store.get_encoded_many(keys)
    other = store.column_family(OTHER).value_codec.encode((2.5,))
    store.put_encoded_many(keys[:1], [other], OTHER)  # another family, other keys
    store.get_encoded_many(keys)
    store.remove_encoded_many(keys)
    assert store.get_encoded_many(keys) == [None] * 4
    assert dict(store.iterator()) == {("b", 2): ROWS[("b", 2)]}
    assert list(store.range_scan_encoded(cf=OTHER)) == [(keys[0], other)]


def test_lookups_around_each_familys_largest_key(factory: ProviderFactory) -> None:
    """Keys above a family's largest stored key are absent without a read (rocksdb): lookups
    below, at and above it, in either family, with an empty family, read what was written."""
    provider = factory.open()
    store = provider.get_store(0)
    store.put_many([("m", 5), ("m", 9)], [(5, "five"), (9, "nine")])
    store.commit()
    store = provider.get_store(1)  # "other" is empty in the database
    probes = [("m", 9), ("z", 0), ("m", 4), ("m", 5), ("a", 0), ("m", 10)]
    assert store.get_many(probes) == [(9, "nine"), None, None, (5, "five"), None, None]
    assert store.get_many(probes, OTHER) == [None] * len(probes)
    store.put(("z", 1), (1.5,), OTHER)
    store.put(("zz", 0), (0, "pending"))  # a pending write above the stored keys is seen
    assert store.get(("zz", 0)) == (0, "pending")
    assert store.get(("z", 1), OTHER) == (1.5,)
    assert store.metrics().num_keys == 4
    store.commit()
    store = provider.get_store(2)
    assert store.get_many([("z", 1), ("z", 2), ("a", 0)], OTHER) == [(1.5,), None, None]
    assert store.get_many([("zz", 0), ("zz", 1)]) == [(0, "pending"), None]
    store.remove(("zz", 0))
    assert store.metrics().num_keys == 3
    store.abort()
