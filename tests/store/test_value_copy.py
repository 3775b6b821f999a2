"""The rocksdb store's copy of a small partition's state in memory: lookups read it instead of
RocksDB and answer what RocksDB would, it follows commits, aborts and restores, and it gives
way, with its memory, when the state outgrows the process's budget."""

from __future__ import annotations

import random

from sparkstate.store.base import StateStoreProvider
from sparkstate.store.rocksdb.provider import RocksDBStateStoreProvider
from sparkstate.store.rocksdb.value_copy import BUDGET
from sparkstate.testing.factory import ProviderFactory

Key = tuple[str, int]
Value = tuple[int, str]


def key(i: int) -> Key:
    return (f"k{i:07d}", i)


def batch(
    provider: StateStoreProvider,
    version: int,
    model: dict[Key, Value],
    rng: random.Random,
    n: int,
    *,
    commit: bool = True,
) -> tuple[list[Value | None], float]:
    """Look up ``n`` keys (stored and new ones), update most, delete some; the lookups' answers
    and the RocksDB gets the version counted (Spark's ``rocksdbGetCount``)."""
    store = provider.get_store(version)
    keys = [key(rng.randrange(3 * n)) for _ in range(n)]
    found = store.get_many(keys)
    assert found == [model.get(k) for k in keys]
    puts = {k: (version, "v" * rng.randrange(40)) for k in keys[: n * 3 // 4]}
    removes = [k for k in keys[n * 3 // 4 :] if k not in puts]
    store.put_many(list(puts), list(puts.values()))
    store.remove_many(removes)
    if not commit:
        store.abort()
        return found, 0.0
    store.commit()
    model.update(puts)
    for k in removes:
        model.pop(k, None)
    assert store.metrics().num_keys == len(model)
    return found, store.metrics().custom["rocksdbGetCount"]


def memtable_bytes(provider: RocksDBStateStoreProvider) -> int:
    """Where the partition's local database flushes its memtable (a setting of the database the
    provider holds open, which nothing public reports)."""
    db = provider._db  # noqa: SLF001
    assert db is not None
    return db.memtable_bytes


def test_lookups_read_the_copy_and_answer_what_rocksdb_holds(
    rocksdb_factory: ProviderFactory,
) -> None:
    rng = random.Random(7)
    provider = rocksdb_factory.open(min_deltas_for_snapshot=3)
    model: dict[Key, Value] = {}
    models = [dict(model)]
    for version in range(6):
        _, gets = batch(provider, version, model, rng, 2_000)
        assert gets == 0  # every lookup answered by the copy, new keys too
        models.append(dict(model))
    batch(provider, 6, model, rng, 2_000, commit=False)  # aborted: neither copy nor db moves
    _, gets = batch(provider, 6, model, rng, 2_000)
    assert gets == 0
    models.append(dict(model))
    provider.do_maintenance()
    # Another executor restores version 7 from the files: its copy is read from its database.
    elsewhere = rocksdb_factory.open(local_dir=rocksdb_factory.fresh_local_dir())
    for version in range(7, 9):
        _, gets = batch(elsewhere, version, model, rng, 2_000)
        assert gets == 0
        models.append(dict(model))
    # An older version moves the database back: the copy goes, and RocksDB answers as of then.
    reader = elsewhere.get_read_store(4)
    assert dict(reader.iterator()) == models[4]
    assert reader.get_many([key(i) for i in range(6_000)]) == [
        models[4].get(key(i)) for i in range(6_000)
    ]
    reader.abort()
    # Back to the newest: caught up from the changelogs, and copied again.
    _, gets = batch(elsewhere, 9, model, rng, 2_000)
    assert gets == 0
    reader = elsewhere.get_read_store(10)
    assert dict(reader.iterator()) == model
    reader.abort()
    rocksdb_factory.close_all()


def test_a_state_that_outgrows_the_budget_reads_rocksdb_and_frees_its_copy(
    rocksdb_factory: ProviderFactory,
) -> None:
    rng = random.Random(11)
    held_before = BUDGET.used
    provider = rocksdb_factory.open(value_copy_mb=1, block_cache_mb=128, write_buffer_mb=64)
    assert isinstance(provider, RocksDBStateStoreProvider)
    model: dict[Key, Value] = {}
    _, gets = batch(provider, 0, model, rng, 2_000)
    assert gets == 0
    # A copied state flushes its memtable early: a write into a large one costs more.
    assert memtable_bytes(provider) == 8 << 20
    assert BUDGET.used > held_before  # charged to the process
    store = provider.get_read_store(1)
    with_copy = store.metrics().memory_used_bytes
    store.abort()
    version = 1
    while BUDGET.used > held_before:  # about 10k pairs of ~150 bytes pass 1 MB
        _, gets = batch(provider, version, model, rng, 5_000)
        version += 1
        assert version < 20, "the copy never gave way"
    _, gets = batch(provider, version, model, rng, 5_000)
    assert gets > 0  # RocksDB answers now, as right as before (batch checks every answer)
    assert memtable_bytes(provider) >= 32 << 20  # half the process's memtables' 64 MB or more
    store = provider.get_read_store(version + 1)
    assert dict(store.iterator()) == model
    assert store.metrics().num_keys == len(model) and with_copy > 0
    store.abort()
    rocksdb_factory.close_all()
    assert BUDGET.used == held_before
