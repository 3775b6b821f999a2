"""The contract of maintenance: snapshots that are complete bases, and retention that keeps
what the newest attempts (replays included) still need, whichever instance runs it."""

from __future__ import annotations

from typing import Any

import pytest

from sparkstate.exceptions import MissingVersionError
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.families import Row
from sparkstate.testing.contract._base import ContractBase, commit, history_step, store_dir
from sparkstate.testing.factory import ProviderFactory, apply_changes, durable_files, read_all

__all__ = ["MaintenanceContract"]


class MaintenanceContract(ContractBase):
    """Snapshots and retention (part of ``StateStoreContract``)."""

    def test_maintenance_on_an_empty_store(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        provider.do_maintenance()
        provider.do_maintenance()
        assert provider.latest_version() == 0
        commit(provider, 0, {("a", 1): (1, None)})
        provider.do_maintenance()
        assert provider.get_read_store(1).get(("a", 1)) == (1, None)

    def test_maintenance_writes_snapshots(self, factory: ProviderFactory) -> None:
        provider = factory.open(min_deltas_for_snapshot=3)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 9):
            states.append(history_step(provider, v, states[-1]))
            provider.do_maintenance()
        factory.close_all()
        snapshots = sorted({v for v, _, _ in durable_files(factory.store_id, "snapshot")})
        assert snapshots, "no snapshot after 8 versions with min_deltas_for_snapshot=3"
        assert snapshots[0] >= 3, f"snapshot before 3 deltas piled up: {snapshots}"
        assert len(snapshots) < 8, f"a snapshot for every version: {snapshots}"
        for local_dir in (factory.local_dir, factory.fresh_local_dir()):
            provider = factory.reopen(local_dir=local_dir, min_deltas_for_snapshot=3)
            for v, state in enumerate(states):
                assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: state}, f"{v}"

    def test_snapshot_is_a_complete_base(self, factory: ProviderFactory) -> None:
        provider = factory.open(min_deltas_for_snapshot=2)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 5):
            states.append(history_step(provider, v, states[-1]))
            provider.do_maintenance()
        factory.close_all()
        snapshots = [v for v, _, _ in durable_files(factory.store_id, "snapshot")]
        assert snapshots
        base = max(snapshots)
        directory = store_dir(factory)
        for v, _, name in durable_files(factory.store_id):
            if v <= base and not name.split(".", 1)[1].startswith("snapshot"):
                directory.delete(name)
        provider = factory.reopen(local_dir=factory.fresh_local_dir())
        for v in range(base, len(states)):
            assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: states[v]}, f"{v}"

    def test_retention(self, factory: ProviderFactory) -> None:
        conf: dict[str, Any] = {"min_deltas_for_snapshot": 2, "min_versions_to_retain": 3}
        provider = factory.open(**conf)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 11):
            states.append(history_step(provider, v, states[-1]))
            provider.do_maintenance()
        retained = range(10 - 3 + 1, 11)
        for v in retained:
            assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: states[v]}
        factory.close_all()
        versions = {v for v, _, _ in durable_files(factory.store_id)}
        assert min(versions) > 1, f"nothing was deleted: versions {sorted(versions)}"
        assert set(retained) <= versions
        for local_dir in (factory.local_dir, factory.fresh_local_dir()):
            provider = factory.reopen(local_dir=local_dir, **conf)
            for v in retained:
                assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: states[v]}, f"{v}"
            with pytest.raises(MissingVersionError) as info:
                provider.get_read_store(1)
            message = str(info.value)
            assert "version 1" in message, message
            assert factory.checkpoint_root in message, message
            commit(provider, 10, {("next", 0): (0, None)})
            assert provider.get_read_store(11).get(("next", 0)) == (0, None)

    def test_retention_keeps_the_lineage_of_a_replayed_version(
        self, factory: ProviderFactory
    ) -> None:
        """A batch replayed after a crash re-commits a version whose first attempt was snapshotted.

        Retention must keep what the newest attempts need, not the abandoned attempt's snapshot.
        """
        conf: dict[str, Any] = {"min_deltas_for_snapshot": 3, "min_versions_to_retain": 2}
        provider = factory.open(**conf)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 4):
            states.append(history_step(provider, v, states[-1]))
            provider.do_maintenance()
        assert [v for v, _, _ in durable_files(factory.store_id, "snapshot")] == [3]
        # The replay: batch 2 runs again from version 2 and commits a new attempt of version 3.
        provider = factory.reopen(**conf)
        replayed = commit(provider, 2, {("replayed", 3): (3, None)})
        live = apply_changes(states[2], {("replayed", 3): (3, None)}, [])
        provider.do_maintenance()
        commit(provider, 3, {("replayed", 4): (4, None)})
        provider.do_maintenance()
        want = apply_changes(live, {("replayed", 4): (4, None)}, [])
        assert read_all(provider.get_read_store(3)) == {DEFAULT_CF: live}
        assert read_all(provider.get_read_store(3, replayed.checkpoint_id)) == {DEFAULT_CF: live}
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        assert read_all(provider.get_read_store(4)) == {DEFAULT_CF: want}

    def test_retention_keeps_a_replay_behind_an_abandoned_attempt(
        self, factory: ProviderFactory
    ) -> None:
        """Versions 4 and 5 committed, then the process died before maintenance; the replay
        restarts from version 3. Until the replay catches up, the highest version on durable
        storage is the abandoned 5: retention must still keep what the replayed 4 needs.
        """
        conf: dict[str, Any] = {"min_deltas_for_snapshot": 2, "min_versions_to_retain": 2}
        provider = factory.open(**conf)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 6):
            states.append(history_step(provider, v, states[-1]))
            if v <= 3:
                provider.do_maintenance()
        provider = factory.reopen(**conf)
        replayed = commit(provider, 3, {("replayed", 4): (4, None)})
        want = apply_changes(states[3], {("replayed", 4): (4, None)}, [])
        provider.do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        assert read_all(provider.get_read_store(4)) == {DEFAULT_CF: want}
        assert read_all(provider.get_read_store(4, replayed.checkpoint_id)) == {DEFAULT_CF: want}
        commit(provider, 4, {("replayed", 5): (5, None)})
        provider.do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        want = apply_changes(want, {("replayed", 5): (5, None)}, [])
        assert read_all(provider.get_read_store(5)) == {DEFAULT_CF: want}

    def test_maintenance_keeps_the_version_just_committed(self, factory: ProviderFactory) -> None:
        """A restart from an old version commits again below the highest version on durable
        storage; the maintenance after that commit must not delete the commit itself.
        """
        conf: dict[str, Any] = {"min_deltas_for_snapshot": 2, "min_versions_to_retain": 3}
        provider = factory.open(**conf)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 5):
            states.append(history_step(provider, v, states[-1]))
            provider.do_maintenance()
        provider = factory.reopen(**conf)
        again = commit(provider, 0, {("again", 1): (1, None)})
        provider.do_maintenance()
        want = {("again", 1): (1, None)}
        assert read_all(provider.get_read_store(1, again.checkpoint_id)) == {DEFAULT_CF: want}
        commit(provider, 1, {("again", 2): (2, None)}, checkpoint_id=again.checkpoint_id)
        provider.do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        want = {**want, ("again", 2): (2, None)}
        assert read_all(provider.get_read_store(2)) == {DEFAULT_CF: want}

    def test_maintenance_by_another_instance_keeps_the_version_just_committed(
        self, factory: ProviderFactory
    ) -> None:
        """As above, but maintenance runs in another provider instance (another worker process,
        or the restarted worker before its first commit), which knows only the durable files.
        """
        conf: dict[str, Any] = {"min_deltas_for_snapshot": 2, "min_versions_to_retain": 3}
        provider = factory.open(**conf)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 5):
            states.append(history_step(provider, v, states[-1]))
            provider.do_maintenance()
        provider = factory.reopen(**conf)
        again = commit(provider, 0, {("again", 1): (1, None)})
        factory.close(provider)
        factory.open(local_dir=factory.fresh_local_dir(), **conf).do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        want = {("again", 1): (1, None)}
        assert read_all(provider.get_read_store(1, again.checkpoint_id)) == {DEFAULT_CF: want}
