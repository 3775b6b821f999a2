"""The contract of key order: the iterator, prefix and range scans over committed and pending
writes, every key type in the order of its values, and every value type round-tripped."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
from typing import Any

import pyarrow as pa

from sparkstate.store.families import Row
from sparkstate.testing.contract._base import ContractBase, V, commit, each_provider
from sparkstate.testing.factory import ProviderFactory, _column_key, apply_changes, sort_rows

__all__ = ["ORDER_KEYS", "TYPED_KEYS", "ScanContract"]

_NAMES: list[str | None] = [None, "", "a", "a\x00", "a\x00b", "ab", "b", "é", "日本"]
_NUMS: list[int | None] = [None, -(2**63), -1000, -1, 0, 1, 7, 2**63 - 1]
#: Keys that exercise the order of the codec: nulls, empty and multi-byte strings, a string that is
#: a prefix of another, NUL bytes, the extremes of int64, negatives.
ORDER_KEYS: list[Row] = [(s, n) for s, n in itertools.product(_NAMES, _NUMS)]

#: One column family per key type, with its values in ascending order.
TYPED_KEYS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "bool": (pa.bool_(), [False, True]),
    "int8": (pa.int8(), [-128, -1, 0, 1, 127]),
    "int32": (pa.int32(), [-(2**31), -70000, -1, 0, 1, 255, 256, 2**31 - 1]),
    "uint64": (pa.uint64(), [0, 1, 255, 2**32, 2**64 - 1]),
    "float64": (
        pa.float64(),
        [float("-inf"), -1e300, -2.5, -1e-300, 0.0, 1e-300, 1.5, 1e300, float("inf")],
    ),
    "float32": (pa.float32(), [float("-inf"), -2.5, -0.5, 0.0, 0.25, 3.0, float("inf")]),
    "string": (pa.string(), ["", "\x00", "a", "a\x00", "aa", "b", "ÿ", "日"]),
    "binary": (
        pa.binary(),
        [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\x01", b"\xff", b"\xff\x00"],
    ),
    "timestamp": (
        pa.timestamp("us"),
        [
            dt.datetime(1900, 1, 1),
            dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
            dt.datetime(1970, 1, 1),
            dt.datetime(2024, 2, 29, 12, 0, 0, 1),
        ],
    ),
    "date32": (pa.date32(), [dt.date(1, 1, 1), dt.date(1969, 12, 31), dt.date(2024, 1, 1)]),
}


def _in_range(row: Row, start: Row | None, end: Row | None, nulls_first: bool) -> bool:
    def key(r: Row) -> tuple[tuple[int, Any], ...]:
        return tuple(_column_key(v, nulls_first) for v in r)

    if start is not None and key(row[: len(start)]) < key(start):
        return False
    return end is None or key(row[: len(end)]) < key(end)


class ScanContract(ContractBase):
    """Key order and scans (part of ``StateStoreContract``)."""

    def _nulls_first(self, got: list[Row], keys: list[Row]) -> bool:
        """Which null placement the iterator used; fails if it matches neither."""
        first, last = sort_rows(keys, nulls_first=True), sort_rows(keys, nulls_first=False)
        assert got in (first, last), "iterator order is not the order of key values"
        return got == first

    def test_iterator_is_in_key_order(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        shuffled = sorted(ORDER_KEYS, key=lambda k: hash(repr(k)))
        store = provider.get_store(0)
        for i, key in enumerate(shuffled[::2]):
            store.put(key, (i, None))
        store.commit()
        store = provider.get_store(1)
        # Pending writes interleave with committed keys; an overwrite must not duplicate a key.
        for i, key in enumerate(shuffled):
            store.put(key, (i, None))
        got = [k for k, _ in store.iterator()]
        nulls_first = self._nulls_first(got, ORDER_KEYS)
        store.commit()
        for p in each_provider(factory, provider):
            assert [k for k, _ in p.get_read_store(2).iterator()] == sort_rows(
                ORDER_KEYS, nulls_first=nulls_first
            )

    def test_scans_merge_pending_writes_with_committed_state(
        self, factory: ProviderFactory
    ) -> None:
        provider = factory.open()
        base = {("k", i): (i, None) for i in range(0, 20, 2)}
        commit(provider, 0, base)
        store = provider.get_store(1)
        puts = {("k", i): (-i, "new") for i in range(1, 20, 3)}
        removes = [("k", 0), ("k", 4), ("k", 7), ("k", 99)]
        for k, v in puts.items():
            store.put(k, v)
        for k in removes:
            store.remove(k)
        store.put(("k", 4), (4, "back"))
        expected = apply_changes(base, puts, removes)
        expected[("k", 4)] = (4, "back")
        ordered = sorted(expected.items())
        assert list(store.iterator()) == ordered
        assert list(store.prefix_scan(("k",))) == ordered
        assert list(store.range_scan(("k", 3), ("k", 11))) == [
            (k, v) for k, v in ordered if 3 <= k[1] < 11
        ]
        store.commit()
        assert list(factory.reopen().get_read_store(2).iterator()) == ordered

    def test_prefix_scan(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        for i, key in enumerate(ORDER_KEYS):
            store.put(key, (i, None))
        nulls_first = self._nulls_first([k for k, _ in store.iterator()], ORDER_KEYS)
        store.commit()
        store = factory.reopen().get_read_store(1)
        for name in _NAMES:
            got = [k for k, _ in store.prefix_scan((name,))]
            want = sort_rows([k for k in ORDER_KEYS if k[0] == name], nulls_first=nulls_first)
            assert got == want, f"prefix_scan(({name!r},))"
        assert [k for k, _ in store.prefix_scan(("a", -1))] == [("a", -1)]
        assert list(store.prefix_scan(("zzz",))) == []

    def test_range_scan(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        for i, key in enumerate(ORDER_KEYS):
            store.put(key, (i, None))
        nulls_first = self._nulls_first([k for k, _ in store.iterator()], ORDER_KEYS)
        ordered = sort_rows(ORDER_KEYS, nulls_first=nulls_first)
        bounds: list[tuple[Row | None, Row | None]] = [
            (None, None),
            (("a",), ("b",)),
            (("a", -1000), ("a", 7)),
            (("a", -1), ("ab", 0)),
            ((None,), ("",)),
            (("",), None),
            (None, ("a", 0)),
            (("a", None), ("a", -(2**63))),
            (("b",), ("a",)),
            (("a", 1), ("a", 1)),
            (("日本", 2**63 - 1), None),
        ]
        for reader in (store, None):
            if reader is None:
                store.commit()
                reader = factory.reopen().get_read_store(1)
            for start, end in bounds:
                got = [k for k, _ in reader.range_scan(start, end)]
                want = [k for k in ordered if _in_range(k, start, end, nulls_first)]
                assert got == want, f"range_scan({start!r}, {end!r})"

    def test_key_types_keep_their_order(self, factory: ProviderFactory) -> None:
        families = {name: (pa.schema([("k", typ)]), V) for name, (typ, _) in TYPED_KEYS.items()}
        provider = factory.open(column_families=families)
        store = provider.get_store(0)
        for name, (_, values) in TYPED_KEYS.items():
            for i, value in enumerate(reversed(values)):
                store.put((value,), (i, name), name)
        store.commit()
        reader = factory.reopen(column_families=families).get_read_store(1)
        for name, (_, values) in TYPED_KEYS.items():
            got = [k[0] for k, _ in reader.iterator(name)]
            assert got == values, f"order of {name} keys"
            assert reader.get((values[0],), name) == (len(values) - 1, name)

    def test_value_types_round_trip(self, factory: ProviderFactory) -> None:
        schema = pa.schema(
            [
                ("b", pa.bool_()),
                ("i8", pa.int8()),
                ("u32", pa.uint32()),
                ("f32", pa.float32()),
                ("f64", pa.float64()),
                ("s", pa.string()),
                ("bin", pa.binary()),
                ("ts", pa.timestamp("us")),
                ("d", pa.date32()),
                ("dec", pa.decimal128(12, 3)),
            ]
        )
        rows: list[Row] = [
            (
                True,
                -128,
                2**32 - 1,
                0.5,
                -1e300,
                "日本\x00",
                b"\x00\xff",
                dt.datetime(1969, 1, 1),
                dt.date(2024, 2, 29),
                decimal.Decimal("-123456789.123"),
            ),
            (None,) * 10,
            (
                False,
                0,
                0,
                float("-inf"),
                0.0,
                "",
                b"",
                dt.datetime(2024, 1, 1, 0, 0, 0, 1),
                dt.date(1970, 1, 1),
                decimal.Decimal("0.000"),
            ),
        ]
        keys: list[Row] = [(i,) for i in range(len(rows))]
        key_schema = pa.schema([("id", pa.int64())])
        provider = factory.open(key_schema=key_schema, value_schema=schema)
        store = provider.get_store(0)
        store.put_many(keys[:2], rows[:2])
        store.put(keys[2], rows[2])
        assert store.get_many(keys) == rows
        store.commit()
        reader = factory.reopen(key_schema=key_schema, value_schema=schema).get_read_store(1)
        assert reader.get_many(keys) == rows
        assert [v for _, v in reader.iterator()] == rows
