"""The contract of versions: commit and abort, stores unusable once finished, read stores of
every version, immutable attempts and the lineage of the attempt chosen, missing versions."""

from __future__ import annotations

import pytest

from sparkstate.exceptions import MissingVersionError, StoreClosedError
from sparkstate.store.base import DEFAULT_CF, StateStore, StoreStatus
from sparkstate.testing.contract._base import ContractBase, commit, each_provider, history
from sparkstate.testing.factory import ProviderFactory, durable_files, read_all

__all__ = ["VersionContract"]


class VersionContract(ContractBase):
    """Versions, commit and abort (part of ``StateStoreContract``)."""

    def test_commit_returns_the_next_version(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        for v in range(4):
            store = provider.get_store(v)
            assert store.version == v
            assert not store.has_committed
            store.put(("v", v), (v, None))
            assert store.checkpoint_id is None
            assert store.commit() == v + 1
            assert store.has_committed
            assert store.checkpoint_id
            assert provider.last_checkpoint_id() == store.checkpoint_id
            assert provider.latest_version() == v + 1
        assert factory.reopen().latest_version() == 4

    def test_reads_see_own_writes(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None), ("a", 2): (2, None)})
        store = provider.get_store(1)
        store.put(("a", 3), (3, None))
        store.remove(("a", 1))
        store.put(("a", 2), (22, None))
        assert store.get(("a", 3)) == (3, None)
        assert store.get(("a", 1)) is None
        assert store.get_many([("a", 1), ("a", 2), ("a", 3)]) == [None, (22, None), (3, None)]
        assert list(store.iterator()) == [(("a", 2), (22, None)), (("a", 3), (3, None))]
        store.abort()

    def test_abort_discards_writes(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None), ("a", 2): (2, None)})
        files_before = durable_files(factory.store_id)
        store = provider.get_store(1)
        store.put(("a", 1), (100, None))
        store.remove(("a", 2))
        store.put(("a", 3), (3, None))
        store.abort()
        assert not store.has_committed
        assert provider.latest_version() == 1
        assert durable_files(factory.store_id) == files_before
        again = provider.get_store(1)
        assert read_all(again) == {DEFAULT_CF: {("a", 1): (1, None), ("a", 2): (2, None)}}
        again.put(("a", 4), (4, None))
        assert again.commit() == 2
        assert read_all(factory.reopen().get_read_store(2)) == {
            DEFAULT_CF: {("a", 1): (1, None), ("a", 2): (2, None), ("a", 4): (4, None)}
        }

    def test_context_manager_aborts_unless_committed(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        with provider.get_store(0) as store:
            store.put(("a", 1), (1, None))
        assert provider.latest_version() == 0
        with provider.get_store(0) as store:
            store.put(("a", 2), (2, None))
            store.commit()
        assert read_all(provider.get_read_store(1)) == {DEFAULT_CF: {("a", 2): (2, None)}}

    @staticmethod
    def _assert_closed(store: StateStore) -> None:
        calls = {
            "get": lambda: store.get(("a", 1)),
            "put": lambda: store.put(("a", 1), (1, None)),
            "remove": lambda: store.remove(("a", 1)),
            "get_many": lambda: store.get_many([("a", 1)]),
            "put_many": lambda: store.put_many([("a", 1)], [(1, None)]),
            "remove_many": lambda: store.remove_many([("a", 1)]),
            "iterator": lambda: list(store.iterator()),
            "prefix_scan": lambda: list(store.prefix_scan(("a",))),
            "range_scan": lambda: list(store.range_scan(None, None)),
            "commit": store.commit,
        }
        for name, call in calls.items():
            with pytest.raises(StoreClosedError):
                call()
                pytest.fail(f"{name} worked on a finished store")

    def test_store_is_unusable_after_commit(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = commit(provider, 0, {("a", 1): (1, None)})
        self._assert_closed(store)
        store.abort()  # a no-op after commit
        assert store.has_committed
        assert provider.get_read_store(1).get(("a", 1)) == (1, None)

    def test_store_is_unusable_after_abort(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        store.put(("a", 1), (1, None))
        store.abort()
        self._assert_closed(store)
        store.abort()  # twice is fine
        assert not store.has_committed
        assert provider.latest_version() == 0

    def test_status_follows_the_life_of_a_store(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        seen = [store.status]
        store.put(("a", 1), (1, None))
        store.commit()
        seen.append(store.status)
        store.abort()
        seen.append(store.status)
        assert seen == [StoreStatus.UPDATING, StoreStatus.COMMITTED, StoreStatus.COMMITTED]
        aborted = provider.get_store(1)
        aborted.put(("a", 2), (2, None))
        aborted.abort()
        assert aborted.status is StoreStatus.ABORTED
        with pytest.raises(StoreClosedError, match="aborted"):
            aborted.commit()
        assert aborted.status is StoreStatus.ABORTED
        reader = provider.get_read_store(1)
        seen = [reader.status]
        reader.abort()
        assert [*seen, reader.status] == [StoreStatus.UPDATING, StoreStatus.ABORTED]

    def test_discarded_store_is_aborted_and_unusable(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None)})
        store = provider.get_store(1)
        store.put(("a", 2), (2, None))
        store.discard()
        assert store.status is StoreStatus.ABORTED
        self._assert_closed(store)
        store.abort()  # ended already: nothing to do
        again = provider.get_store(1)
        assert read_all(again) == {DEFAULT_CF: {("a", 1): (1, None)}}
        again.commit()
        assert read_all(factory.reopen().get_read_store(2)) == {DEFAULT_CF: {("a", 1): (1, None)}}

    def test_opening_a_version_leaves_the_open_one_ended(self, factory: ProviderFactory) -> None:
        """A provider may discard a version still open when another is opened (rocksdb keeps
        one database per partition, as Spark's); if it does, that version is aborted."""
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None)})
        first = provider.get_store(1)
        first.put(("a", 2), (2, None))
        second = provider.get_store(1)
        assert first.status in (StoreStatus.UPDATING, StoreStatus.ABORTED)
        if first.status is StoreStatus.ABORTED:
            self._assert_closed(first)
        first.abort()
        second.put(("a", 3), (3, None))
        second.commit()
        assert read_all(factory.reopen().get_read_store(2)) == {
            DEFAULT_CF: {("a", 1): (1, None), ("a", 3): (3, None)}
        }

    def test_read_store_is_read_only(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 1): (1, None)})
        reader = provider.get_read_store(1)
        for call in (
            lambda: reader.put(("a", 2), (2, None)),
            lambda: reader.remove(("a", 1)),
            lambda: reader.put_many([("a", 2)], [(2, None)]),
            reader.commit,
        ):
            with pytest.raises(StoreClosedError):
                call()
        assert reader.get(("a", 1)) == (1, None)
        reader.abort()
        assert provider.latest_version() == 1

    def test_read_store_of_every_version(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        states = history(provider, 6)
        for v, state in enumerate(states):
            assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: state}, f"version {v}"
        # Reading an old version leaves the store writable at the newest one.
        commit(provider, 6, {("after", 0): (0, None)})
        assert provider.get_read_store(7).get(("after", 0)) == (0, None)

    @pytest.mark.parametrize("local", ["same-local-dir", "fresh-local-dir"])
    def test_reopen_at_every_version(self, factory: ProviderFactory, local: str) -> None:
        states = history(factory.open(), 6)
        for v in [6, 0, 3, 5, 1, 6, 2, 4]:
            local_dir = (
                factory.local_dir if local == "same-local-dir" else factory.fresh_local_dir()
            )
            provider = factory.reopen(local_dir=local_dir)
            assert provider.latest_version() == 6
            assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: states[v]}, f"read {v}"
            store = provider.get_store(v)
            assert read_all(store) == {DEFAULT_CF: states[v]}, f"write store at {v}"
            store.abort()

    def test_versions_are_immutable(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 0): (0, None)})
        first = commit(provider, 1, {("a", 1): (1, "first")})
        second = commit(provider, 1, {("a", 2): (2, "second")}, [("a", 0)])
        assert first.checkpoint_id and second.checkpoint_id
        assert first.checkpoint_id != second.checkpoint_id
        ids = {ckpt for v, ckpt, _ in durable_files(factory.store_id) if v == 2}
        assert {first.checkpoint_id, second.checkpoint_id} <= ids
        want_first = {("a", 0): (0, None), ("a", 1): (1, "first")}
        want_second = {("a", 2): (2, "second")}
        for p in each_provider(factory, provider):
            assert read_all(p.get_read_store(2, first.checkpoint_id)) == {DEFAULT_CF: want_first}
            assert read_all(p.get_read_store(2, second.checkpoint_id)) == {DEFAULT_CF: want_second}
            # Without a checkpoint id, the newest attempt is the one loaded.
            assert read_all(p.get_read_store(2)) == {DEFAULT_CF: want_second}

    def test_lineage_follows_the_chosen_attempt(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        commit(provider, 0, {("a", 0): (0, None)})
        first = commit(provider, 1, {("a", 1): (1, "first")})
        commit(provider, 1, {("a", 2): (2, "second")})
        assert first.checkpoint_id is not None
        third = commit(provider, 2, {("a", 3): (3, None)}, checkpoint_id=first.checkpoint_id)
        want = {("a", 0): (0, None), ("a", 1): (1, "first"), ("a", 3): (3, None)}
        for p in each_provider(factory, provider):
            assert read_all(p.get_read_store(3)) == {DEFAULT_CF: want}
            assert read_all(p.get_read_store(3, third.checkpoint_id)) == {DEFAULT_CF: want}

    def test_missing_versions_are_errors(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        history(provider, 2)
        with pytest.raises(MissingVersionError, match="version 3"):
            provider.get_store(3)
        with pytest.raises(MissingVersionError, match="version 5"):
            provider.get_read_store(5)
        with pytest.raises(MissingVersionError):
            provider.get_read_store(2, "0" * 24)
        with pytest.raises(ValueError):
            provider.get_store(-1)
        # The provider is still usable after those errors.
        assert provider.get_read_store(2).get(("v", 2)) == (2, None)
