"""The contract of reads and writes: get, put and remove, one key at a time and in batches
of Python rows or Arrow tables, and what a reopened provider reads back."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.families import Row
from sparkstate.testing.contract._base import ContractBase, commit
from sparkstate.testing.factory import ProviderFactory, read_all

__all__ = ["ReadWriteContract"]


class ReadWriteContract(ContractBase):
    """Reads and writes (part of ``StateStoreContract``)."""

    def test_fresh_store_is_empty_at_version_zero(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        assert provider.latest_version() == 0
        store = provider.get_store(0)
        assert store.version == 0
        assert store.id == factory.store_id
        assert store.get(("a", 1)) is None
        assert list(store.iterator()) == []
        assert store.get_many([("a", 1), ("b", 2)]) == [None, None]
        store.abort()

    def test_put_get_remove(self, factory: ProviderFactory) -> None:
        store = factory.open().get_store(0)
        store.put(("a", 1), (10, "x"))
        store.put(("a", -1), (-10, "y"))
        assert store.get(("a", 1)) == (10, "x")
        assert store.get(("a", -1)) == (-10, "y")
        assert store.get(("a", 2)) is None
        store.remove(("a", 1))
        assert store.get(("a", 1)) is None
        assert store.get(("a", -1)) == (-10, "y")
        assert store.commit() == 1

    def test_overwrite_keeps_the_last_value(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        store.put(("a", 1), (1, "first"))
        store.put(("a", 1), (2, "second"))
        assert store.get(("a", 1)) == (2, "second")
        store.commit()
        store = provider.get_store(1)
        store.put(("a", 1), (3, "third"))
        assert store.get(("a", 1)) == (3, "third")
        assert list(store.iterator()) == [(("a", 1), (3, "third"))]
        store.commit()
        assert factory.reopen().get_read_store(2).get(("a", 1)) == (3, "third")

    def test_remove_of_an_absent_key_is_a_noop(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None)})
        store = provider.get_store(1)
        store.remove(("zz", 9))
        store.remove(("a", 1))
        store.remove(("a", 1))
        assert store.get(("a", 1)) is None
        store.commit()
        assert read_all(factory.reopen().get_read_store(2)) == {DEFAULT_CF: {}}

    def test_values_with_nulls_are_not_absent(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        store.put(("a", None), (None, None))
        store.put((None, None), (0, ""))
        assert store.get(("a", None)) == (None, None)
        assert store.get((None, None)) == (0, "")
        store.commit()
        reopened = factory.reopen().get_read_store(1)
        assert reopened.get(("a", None)) == (None, None)
        assert reopened.get((None, None)) == (0, "")
        assert reopened.get(("a", 0)) is None

    def test_batch_calls_over_lists(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        keys: list[Row] = [("a", i) for i in range(-50, 50)]
        store.put_many(keys, [(i, str(i)) for i in range(100)])
        got = store.get_many([("a", -50), ("missing", 0), ("a", 49)])
        assert got == [(0, "0"), None, (99, "99")]
        store.remove_many(keys[:10])
        assert store.get_many(keys[:11]) == [None] * 10 + [(10, "10")]
        assert store.get_many([]) == []
        store.put_many([], [])
        store.remove_many([])
        store.commit()
        reopened = factory.reopen().get_read_store(1)
        assert reopened.get_many(keys) == [None] * 10 + [(i, str(i)) for i in range(10, 100)]

    def test_batch_calls_over_arrow(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        keys = pa.table({"name": ["a", "b", None, "c"], "n": [1, -2, 3, None]})
        values = pa.table({"count": [1, 2, None, 4], "label": ["x", None, "z", "w"]})
        store = provider.get_store(0)
        store.put_many(keys, values)
        expected = [(1, "x"), (2, None), (None, "z"), (4, "w")]
        assert store.get_many(keys) == expected
        assert store.get_many(keys.to_batches()[0]) == expected
        assert store.get_many(list(zip(*keys.to_pydict().values(), strict=True))) == expected
        store.remove_many(keys.slice(1, 2).to_batches()[0])
        assert store.get_many(keys) == [(1, "x"), None, None, (4, "w")]
        store.put_many(keys.slice(2, 1), values.to_batches()[0].slice(0, 1))
        assert store.get((None, 3)) == (1, "x")
        store.commit()
        reopened = factory.reopen().get_read_store(1)
        assert reopened.get_many(keys) == [(1, "x"), None, (1, "x"), (4, "w")]

    def test_put_many_last_duplicate_wins(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        store.put_many([("a", 1), ("a", 1), ("b", 1)], [(1, "1"), (2, "2"), (3, "3")])
        assert store.get(("a", 1)) == (2, "2")
        store.commit()
        assert factory.reopen().get_read_store(1).get(("a", 1)) == (2, "2")

    def test_put_many_length_mismatch_is_an_error(self, factory: ProviderFactory) -> None:
        store = factory.open().get_store(0)
        with pytest.raises(ValueError, match="2 keys but 1 values"):
            store.put_many([("a", 1), ("a", 2)], [(1, "1")])
        assert store.get(("a", 1)) is None
        store.abort()
