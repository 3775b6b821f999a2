"""The memory provider's key order across versions: scans after puts, removals and re-puts, in
one store and in the stores of later versions (which start from the order an earlier one kept),
against a dict model, aborted versions included."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa

from sparkstate.store.memory import KeyOrder
from sparkstate.testing import ProviderFactory

KEY = pa.schema([("k", pa.int64())])
VALUE = pa.schema([("v", pa.int64())])


def test_scans_follow_a_model_across_versions(tmp_path: Path) -> None:
    rng = random.Random(7)
    factory = ProviderFactory(
        "memory",
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
    )
    provider = factory.open()
    model: dict[int, int] = {}
    version = 0
    for step in range(14):
        store = provider.get_store(version)
        assert [k for (k,), _ in store.range_scan()] == sorted(model)  # the order kept so far
        pending = dict(model)
        for _ in range(rng.randrange(1, 40)):
            k = rng.randrange(60)
            if rng.random() < 0.4 and k in pending:
                store.remove((k,))
                del pending[k]
            else:
                store.put((k,), (version,))
                pending[k] = version
            if rng.random() < 0.2:  # scans in the middle of the writes
                lo, hi = sorted((rng.randrange(60), rng.randrange(60)))
                got = [k for (k,), _ in store.range_scan((lo,), (hi,))]
                assert got == sorted(k for k in pending if lo <= k < hi)
        assert [(k, v) for (k,), (v,) in store.range_scan()] == sorted(pending.items())
        if step % 5 == 4:
            store.abort()  # the next store starts again from the last committed version
            continue
        assert store.commit() == version + 1
        version += 1
        model = pending
    factory.close_all()


def test_order_lists_each_key_once() -> None:
    data = {b"b": b"", b"a": b""}
    order = KeyOrder(b"")
    assert order.keys(data) == [b"a", b"b"]
    del data[b"a"]
    order.removed([b"a"])
    data[b"a"] = b""
    order.added([b"a"])  # back again: already in the list
    data[b"c"] = b""
    order.added([b"c"])
    assert order.keys(data) == [b"a", b"b", b"c"]


def test_removed_runs_and_scattered_keys_follow_a_model() -> None:
    """Evictions remove a run of the order (cut out at once), other removals scattered keys
    (skipped until dropped); either way the order lists the map's keys, each once."""
    rng = random.Random(11)
    data: dict[bytes, bytes] = {}
    order = KeyOrder(b"")
    order.keys(data)  # tracking from the start
    for _ in range(300):
        fresh = [rng.randrange(500).to_bytes(2, "big") for _ in range(rng.randrange(30))]
        new = list(dict.fromkeys(k for k in fresh if k not in data))
        data.update(dict.fromkeys(new, b""))
        order.added(new)
        listed = [k for k in order.keys(data) if k in data]
        assert listed == sorted(data)
        if not listed:
            continue
        lo = rng.randrange(len(listed))
        if rng.random() < 0.6:  # a run, as a range scan gives it
            doomed = listed[lo : lo + rng.randrange(1, 40)]
        else:
            doomed = rng.sample(listed, min(len(listed), rng.randrange(1, 10)))
        for k in doomed:
            del data[k]
        order.removed(doomed)
        current = order.keys(data)
        assert len(current) == len(set(current))
        assert [k for k in current if k in data] == sorted(data)


def test_workers_taking_turns_catch_up_from_their_own_older_version(tmp_path: Path) -> None:
    """Two workers (two providers) run a partition's batches in a random order, as PySpark's
    pooled workers do: each catches up from the version it last held by replaying the others'
    deltas, and its scans and reads match the model."""
    rng = random.Random(5)
    factory = ProviderFactory(
        "memory",
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
    )
    workers = [factory.open(), factory.open()]
    model: dict[int, int] = {}
    version, checkpoint_id = 0, None
    for _ in range(20):
        store = rng.choice(workers).get_store(version, checkpoint_id)
        assert [(k, v) for (k,), (v,) in store.range_scan()] == sorted(model.items())
        for k in rng.sample(range(200), 40):
            store.put((k,), (version,))
            model[k] = version
        lo = rng.randrange(200)
        doomed = [k for (k,), _ in store.range_scan((lo,), (lo + 30,))]
        for k in doomed:
            store.remove((k,))
            del model[k]
        version = store.commit()
        checkpoint_id = store.checkpoint_id
    factory.close_all()


def test_each_family_keeps_its_own_order(tmp_path: Path) -> None:
    """A scan of one family orders that family alone: writes to another family, never scanned,
    keep no order, and scans of each family, in later versions too, follow a model."""
    rng = random.Random(5)
    factory = ProviderFactory(
        "memory",
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
        column_families={"index": (KEY, VALUE)},
    )
    provider = factory.open()
    models: dict[str, dict[int, int]] = {"default": {}, "index": {}}
    for version in range(8):
        store = provider.get_store(version)
        for _ in range(60):
            cf = rng.choice(["default", "default", "index"])
            k = rng.randrange(50)
            if rng.random() < 0.3 and k in models[cf]:
                store.remove_many([(k,)], cf)
                del models[cf][k]
            else:
                store.put_many([(k,)], [(version,)], cf)
                models[cf][k] = version
        scanned = [(k, v) for (k,), (v,) in store.range_scan(cf="index")]
        assert scanned == sorted(models["index"].items())
        orders = getattr(store, "_order")  # noqa: B009 - what the store keeps
        assert orders.tracks(store.column_family("index").prefix)
        assert not orders.tracks(store.column_family().prefix)  # never scanned: no order
        store.commit()
    store = provider.get_store(8)
    assert [k for (k,), _ in store.range_scan()] == sorted(models["default"])
    assert [k for (k,), _ in store.range_scan(cf="index")] == sorted(models["index"])
    store.abort()
    factory.close_all()
