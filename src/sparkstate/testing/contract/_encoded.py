"""The contract of encoded keys: what operators address a store with (a family's encoded keys,
the prefix added inside the store) reads and scans as the typed API does, over committed and
pending writes; a provider's own ``raw_scan_suffixes`` cuts keys as the base class does."""

from __future__ import annotations

import pyarrow as pa

from sparkstate.store.base import Row, StateStore
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
