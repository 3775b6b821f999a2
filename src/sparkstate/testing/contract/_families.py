"""The contract of keyspaces: column families of one store, families registered later, and
the stores of other partitions and operators, each isolated from the others."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.store.base import DEFAULT_CF, StoreId
from sparkstate.testing.contract._base import KEY, ContractBase, commit
from sparkstate.testing.factory import ProviderFactory, read_all

__all__ = ["ColumnFamilyContract"]


class ColumnFamilyContract(ContractBase):
    """Column families and other stores (part of ``StateStoreContract``)."""

    def test_column_families_are_isolated(self, factory: ProviderFactory) -> None:
        families = {
            "timers": (pa.schema([("ts", pa.int64()), ("name", pa.string())]), pa.schema([])),
            "lists": (KEY, pa.schema([("items", pa.string())])),
        }
        provider = factory.open(column_families=families)
        store = provider.get_store(0)
        store.put(("a", 1), (1, "default"))
        store.put(("a", 1), ("lists",), "lists")
        store.put((5, "a"), (), "timers")
        store.put((-5, "b"), (), "timers")
        assert store.get(("a", 1)) == (1, "default")
        assert store.get(("a", 1), "lists") == ("lists",)
        assert list(store.iterator("timers")) == [((-5, "b"), ()), ((5, "a"), ())]
        assert list(store.iterator()) == [(("a", 1), (1, "default"))]
        store.remove(("a", 1), "lists")
        assert store.get(("a", 1)) == (1, "default")
        assert list(store.range_scan(None, (0,), "timers")) == [((-5, "b"), ())]
        store.commit()
        reopened = factory.reopen(column_families=families)
        reader = reopened.get_read_store(1)
        assert read_all(reader, [DEFAULT_CF, "lists", "timers"]) == {
            DEFAULT_CF: {("a", 1): (1, "default")},
            "lists": {},
            "timers": {(-5, "b"): (), (5, "a"): ()},
        }
        # A family unknown to this provider instance is an error, not an empty keyspace.
        with pytest.raises(ConfigurationError, match="nope"):
            reader.get(("a", 1), "nope")

    def test_register_column_family(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None)})
        register = provider.register_column_family  # type: ignore[attr-defined]
        register("extra", pa.schema([("id", pa.int32())]), pa.schema([("v", pa.float64())]))
        store = provider.get_store(1)
        store.put((7,), (0.5,), "extra")
        assert store.get((7,), "extra") == (0.5,)
        assert store.get(("a", 1)) == (1, None)
        store.commit()
        provider = factory.reopen()
        provider.register_column_family(  # type: ignore[attr-defined]
            "extra", pa.schema([("id", pa.int32())]), pa.schema([("v", pa.float64())])
        )
        assert provider.get_read_store(2).get((7,), "extra") == (0.5,)
        with pytest.raises(SchemaMismatchError, match="extra"):
            provider.register_column_family(  # type: ignore[attr-defined]
                "extra", pa.schema([("id", pa.int64())]), pa.schema([("v", pa.float64())])
            )

    def test_stores_of_other_partitions_are_isolated(self, factory: ProviderFactory) -> None:
        root = factory.checkpoint_root
        ids = [
            factory.store_id,
            StoreId(root, 0, 1),
            StoreId(root, 1, 0),
            StoreId(root, 0, 0, "other"),
        ]
        providers = [factory.open(store_id=sid) for sid in ids]
        for i, provider in enumerate(providers):
            commit(provider, 0, {("p", i): (i, None)})
        factory.close_all()
        for i, sid in enumerate(ids):
            reader = factory.open(store_id=sid).get_read_store(1)
            assert read_all(reader) == {DEFAULT_CF: {("p", i): (i, None)}}
