"""The contract of metrics: counts of a batch's updates and removals, the state size, and
custom metrics that the provider declares."""

from __future__ import annotations

from sparkstate.testing.contract._base import ContractBase, commit
from sparkstate.testing.factory import ProviderFactory

__all__ = ["MetricsContract"]


class MetricsContract(ContractBase):
    """Metrics (part of ``StateStoreContract``)."""

    def test_metrics(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        store.put_many([("a", i) for i in range(3)], [(i, None) for i in range(3)])
        store.remove(("a", 0))
        m = store.metrics()
        if self.exact_num_keys:
            assert m.num_keys == 2
        assert (m.num_updated, m.num_removed) == (3, 1)
        store.commit()
        m = store.metrics()
        assert (m.num_updated, m.num_removed) == (3, 1)
        for field in ("num_keys", "commit_time_ms", "memory_used_bytes", "load_time_ms"):
            value = getattr(m, field)
            assert isinstance(value, int) and value >= 0, f"{field} = {value!r}"
        assert isinstance(m.custom, dict)
        store = provider.get_store(1)
        store.put(("a", 1), (10, None))
        store.put(("b", 1), (1, None))
        store.remove(("a", 2))
        m = store.metrics()
        if self.exact_num_keys:
            assert m.num_keys == 2
        assert (m.num_updated, m.num_removed) == (2, 1)
        store.commit()
        if self.exact_num_keys:
            assert factory.reopen().get_read_store(2).metrics().num_keys == 2

    def test_custom_metrics_are_declared(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = commit(provider, 0, {("a", 1): (1, None)})
        declared = set(type(provider).supported_custom_metrics())
        prefixes = tuple(p + ".partition_" for p in type(provider).supported_instance_metrics())
        reported = {n for n in store.metrics().custom if not n.startswith(prefixes)}
        assert reported <= declared, f"undeclared custom metrics: {sorted(reported - declared)}"
        for name, value in store.metrics().custom.items():
            assert isinstance(value, int | float), f"{name} = {value!r}"
