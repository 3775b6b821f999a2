"""A hypothesis state machine: a store against a ``dict`` model, for both providers.

Rules: put / put_many / remove / remove_many / get / get_many / range and prefix scans / commit /
abort / open any version / reopen (a new provider instance, on the same or a fresh local directory)
at any version / maintenance / read any version. Keys are composite ``(str | None, int)`` from a
domain of 15, so overwrites, removals of live keys and re-inserts happen all the time.

What must hold: every load of a version either fails with ``MissingVersionError`` or returns exactly
the state that attempt committed; the versions on the live lineage (the ancestors of the last
commit) that retention keeps always load.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
)

from sparkstate.exceptions import MissingVersionError
from sparkstate.store.base import StateStore
from sparkstate.store.families import Row
from sparkstate.testing.factory import ProviderFactory, sort_rows

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None
RETAIN = 3
SNAPSHOT_EVERY = 2
#: A provider instance that has not committed yet (here: after ``reopen``) runs retention from
#: the highest version on durable storage and can delete a lineage behind an abandoned higher
#: attempt (RETENTION_WITHOUT_A_COMMIT, xfailed in test_contract.py): until that is fixed, such
#: an instance skips maintenance while the last commit is below the highest version.
RETENTION_WITHOUT_A_COMMIT_OPEN = False

names = st.sampled_from([None, "a", "b"])
keys = st.tuples(names, st.integers(-2, 2))
values = st.tuples(st.one_of(st.none(), st.integers(-3, 3)), st.sampled_from([None, "", "x"]))
bounds = st.one_of(st.none(), st.tuples(names), keys)


@dataclasses.dataclass(eq=False)
class Attempt:
    """One committed attempt of a version, as the model remembers it."""

    version: int
    checkpoint_id: str | None
    parent: Attempt | None
    data: dict[Row, Row]


def _in_range(key: Row, start: Row | None, end: Row | None) -> bool:
    def order(r: Row) -> tuple[tuple[int, Any], ...]:
        return tuple((0, 0) if v is None else (1, v) for v in r)

    if start is not None and order(key[: len(start)]) < order(start):
        return False
    return end is None or order(key[: len(end)]) < order(end)


class StoreMachine(RuleBasedStateMachine):
    provider_name = "memory"
    provider_conf: dict[str, Any] = {}  # noqa: RUF012 - a class's setting, not changed

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="sparkstate-sm-")
        self.factory = ProviderFactory(
            self.provider_name,
            f"{self.tmp}/checkpoint",
            f"{self.tmp}/local",
            conf={
                "min_deltas_for_snapshot": SNAPSHOT_EVERY,
                "min_versions_to_retain": RETAIN,
                **self.provider_conf,
            },
        )
        self.provider = self.factory.open()
        genesis = Attempt(0, None, None, {})
        self.attempts: dict[int, list[Attempt]] = {0: [genesis]}
        self.last_commit = genesis
        self.fresh_instance = True
        self.base = genesis
        self.pending: dict[Row, Row] = {}
        self.store: StateStore = self.provider.get_store(0)

    def teardown(self) -> None:
        try:
            self.store.abort()
            self.factory.close_all()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # --- the model -----------------------------------------------------------------------------

    @property
    def latest(self) -> int:
        return max(self.attempts)

    def live(self) -> set[int]:
        """Identities of the attempts on the lineage of the last commit."""
        out: set[int] = set()
        att: Attempt | None = self.last_commit
        while att is not None:
            out.add(id(att))
            att = att.parent
        return out

    def must_load(self, att: Attempt) -> bool:
        if att.version == 0:
            return True
        return id(att) in self.live() and att.version >= self.latest - RETAIN + 1

    def pick(self, version: int, checkpoint_id: str | None) -> Attempt:
        if checkpoint_id is None:
            return self.attempts[version][-1]
        return next(a for a in self.attempts[version] if a.checkpoint_id == checkpoint_id)

    def check_load(self, att: Attempt, store: StateStore) -> None:
        got = dict(store.iterator())
        assert got == att.data, f"version {att.version} attempt {att.checkpoint_id}"

    def open_store(self, version: int, checkpoint_id: str | None = None) -> bool:
        """Make the writable store version ``version``; False if it was (allowed to be) gone."""
        att = self.pick(version, checkpoint_id)
        try:
            store = self.provider.get_store(version, checkpoint_id)
        except MissingVersionError:
            assert not self.must_load(att), f"retained version {version} is missing"
            return False
        self.check_load(att, store)
        self.store, self.base, self.pending = store, att, dict(att.data)
        return True

    def reset_to_latest(self) -> None:
        self.store.abort()
        live = self.last_commit
        assert self.open_store(live.version, live.checkpoint_id)

    # --- writes and reads ----------------------------------------------------------------------

    @rule(key=keys, value=values)
    def put(self, key: Row, value: Row) -> None:
        self.store.put(key, value)
        self.pending[key] = value

    @rule(key=keys)
    def remove(self, key: Row) -> None:
        self.store.remove(key)
        self.pending.pop(key, None)

    @rule(pairs=st.lists(st.tuples(keys, values), max_size=6))
    def put_many(self, pairs: list[tuple[Row, Row]]) -> None:
        self.store.put_many([k for k, _ in pairs], [v for _, v in pairs])
        self.pending.update(pairs)

    @rule(ks=st.lists(keys, max_size=6))
    def remove_many(self, ks: list[Row]) -> None:
        self.store.remove_many(ks)
        for k in ks:
            self.pending.pop(k, None)

    @rule(key=keys)
    def get(self, key: Row) -> None:
        assert self.store.get(key) == self.pending.get(key)

    @rule(ks=st.lists(keys, max_size=6))
    def get_many(self, ks: list[Row]) -> None:
        assert self.store.get_many(ks) == [self.pending.get(k) for k in ks]

    @rule(start=bounds, end=bounds)
    def range_scan(self, start: Row | None, end: Row | None) -> None:
        want = [k for k in sort_rows(self.pending, nulls_first=True) if _in_range(k, start, end)]
        got = list(self.store.range_scan(start, end))
        assert [k for k, _ in got] == want
        assert all(self.pending[k] == v for k, v in got)

    @rule(name=names)
    def prefix_scan(self, name: str | None) -> None:
        want = sort_rows([k for k in self.pending if k[0] == name], nulls_first=True)
        assert [k for k, _ in self.store.prefix_scan((name,))] == want

    # --- versions ------------------------------------------------------------------------------

    @rule()
    def commit(self) -> None:
        version = self.store.commit()
        assert version == self.base.version + 1
        assert self.store.checkpoint_id is not None
        att = Attempt(version, self.store.checkpoint_id, self.base, dict(self.pending))
        self.attempts.setdefault(version, []).append(att)
        self.last_commit = att
        self.fresh_instance = False
        assert self.provider.latest_version() == self.latest
        assert self.open_store(version, att.checkpoint_id)

    @rule(
        batches=st.lists(
            st.tuples(st.lists(st.tuples(keys, values), max_size=4), st.lists(keys, max_size=2)),
            min_size=1,
            max_size=4,
        ),
        maintain=st.booleans(),
    )
    def advance(
        self, batches: list[tuple[list[tuple[Row, Row]], list[Row]]], maintain: bool
    ) -> None:
        """Commit a few versions in a row (with maintenance after each), as batches do."""
        for puts, removes in batches:
            self.put_many(puts)
            self.remove_many(removes)
            self.commit()
            if maintain:
                self.provider.do_maintenance()

    @rule()
    def abort(self) -> None:
        self.store.abort()
        if not self.open_store(self.base.version, self.base.checkpoint_id):
            self.reset_to_latest()  # maintenance deleted the base version meanwhile

    @rule(data=st.data())
    def open_version(self, data: st.DataObject) -> None:
        version = data.draw(st.integers(0, self.latest), label="version")
        self.store.abort()
        if not self.open_store(version):
            self.reset_to_latest()

    @rule(data=st.data(), fresh_local_dir=st.booleans())
    def reopen(self, data: st.DataObject, fresh_local_dir: bool) -> None:
        version = data.draw(st.integers(0, self.latest), label="version")
        self.store.abort()
        local = self.factory.fresh_local_dir() if fresh_local_dir else self.factory.local_dir
        self.provider = self.factory.reopen(local_dir=local)
        self.fresh_instance = True
        assert self.provider.latest_version() == self.latest
        if not self.open_store(version):
            self.reset_to_latest()

    @rule()
    def maintenance(self) -> None:
        behind = self.last_commit.version < self.latest
        if RETENTION_WITHOUT_A_COMMIT_OPEN and self.fresh_instance and behind:
            return
        if self.base.version >= self.latest - RETAIN + 1:
            self.provider.do_maintenance()
            return
        # Writing on top of a version that retention may delete is outside the contract (the
        # engine writes on the newest version): the open store goes first.
        self.store.abort()
        self.provider.do_maintenance()
        self.reset_to_latest()

    @rule(data=st.data(), by_id=st.booleans())
    def read_version(self, data: st.DataObject, by_id: bool) -> None:
        """Read any attempt of any version, then go back to the writable store (writes dropped).

        A provider may keep one open store at a time (rocksdb: one local database), so the
        writable store is aborted first.
        """
        version = data.draw(st.integers(0, self.latest), label="version")
        att = data.draw(st.sampled_from(self.attempts[version]), label="attempt")
        ckpt = att.checkpoint_id if by_id else None
        att = self.pick(version, ckpt)
        self.store.abort()
        try:
            reader = self.provider.get_read_store(version, ckpt)
        except MissingVersionError:
            assert not self.must_load(att), f"retained version {version} is missing"
        else:
            self.check_load(att, reader)
            reader.abort()
        if not self.open_store(self.base.version, self.base.checkpoint_id):
            self.reset_to_latest()

    @rule()
    def retained_live_versions_load(self) -> None:
        """Every retained version on the live lineage loads, on a fresh local directory too."""
        event(f"latest version {self.latest // 5 * 5}+")
        if self.latest <= RETAIN:
            return
        self.store.abort()
        provider = self.factory.reopen(local_dir=self.factory.fresh_local_dir())
        att: Attempt | None = self.last_commit
        while att is not None and self.must_load(att):
            reader = provider.get_read_store(att.version, att.checkpoint_id)
            self.check_load(att, reader)
            reader.abort()
            att = att.parent
        self.provider = self.factory.reopen()
        self.fresh_instance = True
        if not self.open_store(self.base.version, self.base.checkpoint_id):
            self.reset_to_latest()

    @invariant()
    def store_is_at_its_base(self) -> None:
        assert self.store.version == self.base.version
        assert not self.store.has_committed


def machine_test(
    provider: str, max_examples: int, steps: int, conf: dict[str, Any] | None = None
) -> Any:
    fields = {"provider_name": provider, "provider_conf": conf or {}}
    machine = type(f"{provider.title()}StoreMachine", (StoreMachine,), fields)
    machine.TestCase.settings = settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    return machine.TestCase


TestMemoryStore = machine_test("memory", max_examples=80, steps=40)

if HAVE_ROCKSDB:
    TestRocksDBStore = machine_test("rocksdb", max_examples=20, steps=30)
    # Every lookup a read of RocksDB (no copy of the state in memory).
    TestRocksDBStoreReadingRocksDB = machine_test(
        "rocksdb", max_examples=10, steps=30, conf={"value_copy_mb": 0}
    )
else:

    @pytest.mark.skip(reason="sparkstate.store.rocksdb.provider has not landed yet")
    def test_rocksdb_store_machine() -> None:
        """Placeholder: runs the rocksdb state machine once the provider lands."""
