"""The contract of restarts on a checkpoint: a different key or value schema, provider or
partition count is refused with an error that says what changed."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkstate.exceptions import ProviderMismatchError, SchemaMismatchError
from sparkstate.store.base import StateStoreProvider
from sparkstate.testing.contract._base import ContractBase, V, commit
from sparkstate.testing.factory import ProviderFactory, resolve_provider

__all__ = ["SchemaContract"]


class SchemaContract(ContractBase):
    """Schema, provider and partition checks on restart (part of ``StateStoreContract``)."""

    def test_reopen_with_a_different_key_schema(self, factory: ProviderFactory) -> None:
        commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        other = pa.schema([("name", pa.string()), ("n", pa.int32())])
        with pytest.raises(SchemaMismatchError, match="key schema"):
            factory.open(key_schema=other)
        with pytest.raises(SchemaMismatchError, match="key schema"):
            factory.open(key_schema=pa.schema([("name", pa.string())]))
        assert factory.open().get_read_store(1).get(("a", 1)) == (1, None)

    def test_reopen_with_a_different_value_schema(self, factory: ProviderFactory) -> None:
        commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        other = pa.schema([("count", pa.string()), ("label", pa.string())])
        with pytest.raises(SchemaMismatchError, match="value schema.*'count' changed type"):
            factory.open(value_schema=other)
        families = {"cf": (pa.schema([("k", pa.int64())]), V)}
        commit(factory.open(column_families=families), 1, {(1,): (1, None)}, cf="cf")
        factory.close_all()
        with pytest.raises(SchemaMismatchError, match="cf"):
            factory.open(column_families={"cf": (pa.schema([("k", pa.string())]), V)})

    def test_reopen_with_a_different_provider(self, factory: ProviderFactory) -> None:
        commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        cls = resolve_provider(self.provider)
        other: type[StateStoreProvider] = type(
            f"Other{cls.__name__}", (cls,), {"name": f"{cls.name}-other"}
        )
        with pytest.raises(ProviderMismatchError) as info:
            factory.open(provider_cls=other)
        assert cls.name in str(info.value)
        assert f"{cls.name}-other" in str(info.value)

    def test_a_failed_init_is_reported_by_the_context_manager(
        self, factory: ProviderFactory
    ) -> None:
        """``with provider: provider.init(...)`` surfaces the init error, not a close() error."""
        commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        cls = resolve_provider(self.provider)
        other_key = pa.schema([("name", pa.string()), ("n", pa.int32())])
        with pytest.raises(SchemaMismatchError), cls() as provider:
            provider.init(factory.store_id, other_key, factory.value_schema, factory.conf())
        cls().close()  # closing a provider that was never bound is harmless

    def test_reopen_with_a_different_partition_count(self, factory: ProviderFactory) -> None:
        commit(factory.open(num_partitions=4), 0, {("a", 1): (1, None)})
        factory.close_all()
        with pytest.raises(SchemaMismatchError, match="partition"):
            factory.open(num_partitions=8)
        assert factory.open(num_partitions=4).get_read_store(1).get(("a", 1)) == (1, None)
