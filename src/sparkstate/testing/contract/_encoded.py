"""The contract of encoded keys: what operators address a store with (a family's encoded keys,
the prefix added inside the store) reads and scans as the typed API does, over committed and
pending writes; a provider's own ``raw_scan_suffixes`` cuts keys as the base class does."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from sparkstate.store.base import StateStore
from sparkstate.store.families import Row
from sparkstate.testing.contract._base import KEY, ContractBase
from sparkstate.testing.factory import ProviderFactory

__all__ = ["EncodedKeyContract"]

_ROWS: dict[Row, Row] = {
    ("b", 2): (2, "two"),
    ("a", -1): (1, None),
    (None, 0): (0, "null name"),
    ("a", 7): (7, "seven"),
}
_OTHER = {"other": (KEY, pa.schema([("x", pa.float64())]))}


def _encoded(store: StateStore) -> tuple[list[bytes], list[bytes]]:
    fam = store.column_family()
    return fam.key_codec.encode_many(list(_ROWS)), fam.value_codec.encode_many(list(_ROWS.values()))


def _pairs(chunks: Iterable[tuple[list[bytes], list[bytes]]]) -> list[tuple[bytes, bytes]]:
    return [pair for keys, values in chunks for pair in zip(keys, values, strict=True)]


class EncodedKeyContract(ContractBase):
    """Encoded-key reads, writes and scans (part of ``StateStoreContract``)."""

    def test_encoded_keys_read_and_scan_as_the_typed_api(self, factory: ProviderFactory) -> None:
        provider = factory.open(column_families=_OTHER)
        store = provider.get_store(0)
        keys, values = _encoded(store)
        store.put_encoded_many(keys[:2], values[:2])
        store.put(("z", 0), (1.5,), "other")  # another family: never in the default's scan
        store.commit()
        store = provider.get_store(1)
        store.put_encoded_many(keys[2:], values[2:])  # pending
        store.remove_encoded_many([keys[1]])  # a pending delete of a committed key
        expected = sorted((keys[i], values[i]) for i in (0, 2, 3))
        assert list(store.range_scan_encoded()) == expected
        assert store.get_encoded_many(keys) == [values[0], None, values[2], values[3]]
        assert store.get_encoded(keys[0]) == values[0]
        fam = store.column_family()
        assert [fam.key_codec.encode(k) for k, _ in store.iterator()] == [k for k, _ in expected]
        store.commit()
        reader = factory.reopen(column_families=_OTHER).get_read_store(2)
        assert list(reader.range_scan_encoded()) == expected

    def test_scanned_keys_are_cut_as_the_base_class_does(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        keys, values = _encoded(store)
        store.put_encoded_many(keys[:2], values[:2])
        store.commit()
        store = provider.get_store(1)
        store.put_encoded_many(keys[2:], values[2:])
        store.remove_encoded_many(keys[:1])
        for start, end, skip in [(b"", b"\xff", 0), (b"\x00", b"\x01", 1)]:
            own = list(store.raw_scan_suffixes(start, end, skip))
            assert own == list(StateStore.raw_scan_suffixes(store, start, end, skip))
            assert own == [(k[skip:], v) for k, v in store.raw_scan(start, end)]
        store.abort()

    def test_chunked_scans_read_what_scans_read(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        keys, values = _encoded(store)
        store.put_encoded_many(keys[:3], values[:3])
        store.commit()
        store = provider.get_store(1)
        committed = sorted(zip(keys[:3], values[:3], strict=True))
        # Ranges without a write of this version read the committed rows as they are.
        for chunk in (1, 2, 100):
            got = list(store.range_scan_encoded_chunks(chunk=chunk))
            assert all(0 < len(ks) == len(vs) <= chunk for ks, vs in got)
            assert _pairs(got) == committed
        store.remove_encoded_many([committed[0][0]])
        store.put_encoded_many(keys[3:], values[3:])
        expected = list(store.range_scan_encoded())
        assert committed[0] not in expected
        assert (keys[3], values[3]) in expected
        for chunk in (1, 3):
            assert _pairs(store.range_scan_encoded_chunks(chunk=chunk)) == expected
        # Bounds, and a range the pending writes miss.
        lo, hi = expected[0][0], expected[-1][0]
        assert _pairs(store.range_scan_encoded_chunks(lo, hi)) == expected[:-1]
        assert list(store.range_scan_encoded_chunks(hi + b"\x00", None)) == []
        store.commit()
        # Keys counted after a chunked scan and deletes of what it read.
        store = provider.get_store(2)
        doomed = [k for ks, _ in store.range_scan_encoded_chunks(chunk=2) for k in ks]
        store.remove_encoded_many(doomed)
        assert store.metrics().num_keys == 0
        assert store.commit() == 3
        assert list(provider.get_read_store(3).range_scan_encoded()) == []

    def test_a_removed_range_is_gone_in_its_version_and_after_a_reload(
        self, factory: ProviderFactory
    ) -> None:
        """``remove_range`` removes the committed keys and this version's writes in the range,
        keeps those outside it and a key written into it after, counts what it removed, and
        what a reload from the durable files reads agrees."""
        provider = factory.open()
        store = provider.get_store(0)
        keys, values = _encoded(store)
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        keys, values = [keys[i] for i in order], [values[i] for i in order]
        store.put_encoded_many(keys[:3], values[:3])
        store.commit()
        store = provider.get_store(1)
        store.put_encoded_many(keys[3:], values[3:])  # pending, outside the range
        store.put_encoded_many(keys[1:2], values[1:2])  # pending, inside it
        assert store.remove_range(None, keys[2]) == 2  # keys[0] and keys[1]
        store.put_encoded_many(keys[:1], values[:1])  # written back into the range: kept
        expected = [(keys[i], values[i]) for i in (0, 2, 3)]
        assert list(store.range_scan_encoded()) == expected
        assert store.get_encoded(keys[1]) is None
        assert store.remove_range(keys[2], keys[2]) == 0  # an empty range removes nothing
        store.commit()
        assert list(provider.get_read_store(2).range_scan_encoded()) == expected
        reader = factory.reopen().get_read_store(2)
        assert list(reader.range_scan_encoded()) == expected
