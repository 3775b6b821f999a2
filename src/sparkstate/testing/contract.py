"""The state store provider contract, as a pytest suite any provider can run.

Subclass :class:`StateStoreContract` in a test module, name the provider, and pytest runs every
test of the contract against it::

    from sparkstate.testing import StateStoreContract

    class TestMyProvider(StateStoreContract):
        provider = "mypackage.store:MyProvider"     # or the class itself, or "memory" / "rocksdb"

Override the ``checkpoint_root`` fixture to run the suite on another file system (the project runs
it against ``s3://`` on a loopback S3 endpoint). The suite starts no Spark and needs only pytest.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from sparkstate.exceptions import (
    ConfigurationError,
    MissingVersionError,
    ProviderMismatchError,
    SchemaMismatchError,
    StoreClosedError,
)
from sparkstate.store.base import DEFAULT_CF, Row, StateStore, StateStoreProvider, StoreId
from sparkstate.store.durable import DurableDir
from sparkstate.testing.factory import (
    ProviderFactory,
    _column_key,
    apply_changes,
    durable_files,
    read_all,
    resolve_provider,
    sort_rows,
)

__all__ = ["StateStoreContract", "expected_failure"]

_NAMES: list[str | None] = [None, "", "a", "a\x00", "a\x00b", "ab", "b", "é", "日本"]
_NUMS: list[int | None] = [None, -(2**63), -1000, -1, 0, 1, 7, 2**63 - 1]
#: Keys that exercise the order of the codec: nulls, empty and multi-byte strings, a string that is
#: a prefix of another, NUL bytes, the extremes of int64, negatives.
ORDER_KEYS: list[Row] = [(s, n) for s, n in itertools.product(_NAMES, _NUMS)]

#: One column family per key type, with its values in ascending order.
TYPED_KEYS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "bool": (pa.bool_(), [False, True]),
    "int8": (pa.int8(), [-128, -1, 0, 1, 127]),
    "int32": (pa.int32(), [-(2**31), -70000, -1, 0, 1, 255, 256, 2**31 - 1]),
    "uint64": (pa.uint64(), [0, 1, 255, 2**32, 2**64 - 1]),
    "float64": (
        pa.float64(),
        [float("-inf"), -1e300, -2.5, -1e-300, 0.0, 1e-300, 1.5, 1e300, float("inf")],
    ),
    "float32": (pa.float32(), [float("-inf"), -2.5, -0.5, 0.0, 0.25, 3.0, float("inf")]),
    "string": (pa.string(), ["", "\x00", "a", "a\x00", "aa", "b", "ÿ", "日"]),
    "binary": (
        pa.binary(),
        [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\x01", b"\xff", b"\xff\x00"],
    ),
    "timestamp": (
        pa.timestamp("us"),
        [
            dt.datetime(1900, 1, 1),
            dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
            dt.datetime(1970, 1, 1),
            dt.datetime(2024, 2, 29, 12, 0, 0, 1),
        ],
    ),
    "date32": (pa.date32(), [dt.date(1, 1, 1), dt.date(1969, 12, 31), dt.date(2024, 1, 1)]),
}

V = pa.schema([("count", pa.int64()), ("label", pa.string())])
KEY = pa.schema([("name", pa.string()), ("n", pa.int64())])


def _commit(
    provider: StateStoreProvider,
    version: int,
    puts: dict[Row, Row],
    removes: list[Row] | None = None,
    cf: str = DEFAULT_CF,
    checkpoint_id: str | None = None,
) -> StateStore:
    """Open ``version``, apply the changes, commit; returns the committed store."""
    store = provider.get_store(version, checkpoint_id)
    for k, v in puts.items():
        store.put(k, v, cf)
    for k in removes or []:
        store.remove(k, cf)
    assert store.commit() == version + 1
    return store


def _history_step(provider: StateStoreProvider, v: int, state: dict[Row, Row]) -> dict[Row, Row]:
    """Commit version ``v`` (from ``v - 1``) of a small evolving state; returns the state at v."""
    puts: dict[Row, Row] = {("k", v % 5): (v, f"v{v}"), ("v", v): (v, None)}
    removes: list[Row] = [("k", (v + 2) % 5), ("v", v - 3)]
    _commit(provider, v - 1, puts, removes)
    return apply_changes(state, puts, removes)


def _history(provider: StateStoreProvider, n: int) -> list[dict[Row, Row]]:
    """Commit versions 1..n; ``result[v]`` is the state at version v."""
    states: list[dict[Row, Row]] = [{}]
    for v in range(1, n + 1):
        states.append(_history_step(provider, v, states[-1]))
    return states


def _providers(
    factory: ProviderFactory, provider: StateStoreProvider
) -> Iterator[StateStoreProvider]:
    """The provider that wrote, then a new instance on the same and on a fresh local directory.

    Each is yielded only once the previous one is done with (a provider may hold one open store
    at a time, and reopening closes the others).
    """
    yield provider
    yield factory.reopen()
    yield factory.reopen(local_dir=factory.fresh_local_dir())


def _store_dir(factory: ProviderFactory) -> DurableDir:
    return DurableDir(factory.checkpoint_root).child(factory.store_id.relative_dir)


def expected_failure(
    name: str, reason: str, *, raises: type[BaseException] | None = None
) -> Callable[..., Any]:
    """Contract test ``name``, marked as failing (strictly) for a provider, e.g. for a known bug::

        class TestMyProvider(StateStoreContract):
            provider = "mypackage.store:MyProvider"
            test_metrics = expected_failure("test_metrics", "num_keys is an estimate", raises=...)

    Strict: when the provider is fixed, the test passes and pytest reports it, so the mark goes.
    """
    test = getattr(StateStoreContract, name)

    @functools.wraps(test)
    def run(self: StateStoreContract, *args: Any, **kwargs: Any) -> Any:
        return test(self, *args, **kwargs)

    mark = pytest.mark.xfail(strict=True, reason=reason, raises=raises)
    return mark(run)  # type: ignore[no-any-return]


def _in_range(row: Row, start: Row | None, end: Row | None, nulls_first: bool) -> bool:
    def key(r: Row) -> tuple[tuple[int, Any], ...]:
        return tuple(_column_key(v, nulls_first) for v in r)

    if start is not None and key(row[: len(start)]) < key(start):
        return False
    return end is None or key(row[: len(end)]) < key(end)


class StateStoreContract:
    """Every behaviour a state store provider promises. Subclass and set ``provider``."""

    #: The provider under test: a registered name, ``"package.module:Class"`` or the class.
    provider: ClassVar[str | type[StateStoreProvider]]
    #: Extra ``StoreConf`` options for every provider the suite opens.
    conf_options: ClassVar[dict[str, Any]] = {}
    #: Whether ``metrics().num_keys`` is exact (True) or an estimate.
    exact_num_keys: ClassVar[bool] = True

    # --- fixtures ------------------------------------------------------------------------------

    @pytest.fixture
    def checkpoint_root(self, tmp_path: Any) -> str:
        """Where durable files go. Override to run the suite on another file system."""
        return str(tmp_path / "checkpoint")

    @pytest.fixture
    def factory(self, checkpoint_root: str, tmp_path: Any) -> Iterator[ProviderFactory]:
        factory = ProviderFactory(
            self.provider, checkpoint_root, str(tmp_path / "local"), conf=dict(self.conf_options)
        )
        yield factory
        factory.close_all()

    # --- reads and writes ----------------------------------------------------------------------

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
        _commit(provider, 0, {("a", 1): (1, None)})
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

    # --- order and scans -----------------------------------------------------------------------

    def _nulls_first(self, got: list[Row], keys: list[Row]) -> bool:
        """Which null placement the iterator used; fails if it matches neither."""
        first, last = sort_rows(keys, nulls_first=True), sort_rows(keys, nulls_first=False)
        assert got in (first, last), "iterator order is not the order of key values"
        return got == first

    def test_iterator_is_in_key_order(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        shuffled = sorted(ORDER_KEYS, key=lambda k: hash(repr(k)))
        store = provider.get_store(0)
        for i, key in enumerate(shuffled[::2]):
            store.put(key, (i, None))
        store.commit()
        store = provider.get_store(1)
        # Pending writes interleave with committed keys; an overwrite must not duplicate a key.
        for i, key in enumerate(shuffled):
            store.put(key, (i, None))
        got = [k for k, _ in store.iterator()]
        nulls_first = self._nulls_first(got, ORDER_KEYS)
        store.commit()
        for p in _providers(factory, provider):
            assert [k for k, _ in p.get_read_store(2).iterator()] == sort_rows(
                ORDER_KEYS, nulls_first=nulls_first
            )

    def test_scans_merge_pending_writes_with_committed_state(
        self, factory: ProviderFactory
    ) -> None:
        provider = factory.open()
        base = {("k", i): (i, None) for i in range(0, 20, 2)}
        _commit(provider, 0, base)
        store = provider.get_store(1)
        puts = {("k", i): (-i, "new") for i in range(1, 20, 3)}
        removes = [("k", 0), ("k", 4), ("k", 7), ("k", 99)]
        for k, v in puts.items():
            store.put(k, v)
        for k in removes:
            store.remove(k)
        store.put(("k", 4), (4, "back"))
        expected = apply_changes(base, puts, removes)
        expected[("k", 4)] = (4, "back")
        ordered = sorted(expected.items())
        assert list(store.iterator()) == ordered
        assert list(store.prefix_scan(("k",))) == ordered
        assert list(store.range_scan(("k", 3), ("k", 11))) == [
            (k, v) for k, v in ordered if 3 <= k[1] < 11
        ]
        store.commit()
        assert list(factory.reopen().get_read_store(2).iterator()) == ordered

    def test_prefix_scan(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        for i, key in enumerate(ORDER_KEYS):
            store.put(key, (i, None))
        nulls_first = self._nulls_first([k for k, _ in store.iterator()], ORDER_KEYS)
        store.commit()
        store = factory.reopen().get_read_store(1)
        for name in _NAMES:
            got = [k for k, _ in store.prefix_scan((name,))]
            want = sort_rows([k for k in ORDER_KEYS if k[0] == name], nulls_first=nulls_first)
            assert got == want, f"prefix_scan(({name!r},))"
        assert [k for k, _ in store.prefix_scan(("a", -1))] == [("a", -1)]
        assert list(store.prefix_scan(("zzz",))) == []

    def test_range_scan(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        store = provider.get_store(0)
        for i, key in enumerate(ORDER_KEYS):
            store.put(key, (i, None))
        nulls_first = self._nulls_first([k for k, _ in store.iterator()], ORDER_KEYS)
        ordered = sort_rows(ORDER_KEYS, nulls_first=nulls_first)
        bounds: list[tuple[Row | None, Row | None]] = [
            (None, None),
            (("a",), ("b",)),
            (("a", -1000), ("a", 7)),
            (("a", -1), ("ab", 0)),
            ((None,), ("",)),
            (("",), None),
            (None, ("a", 0)),
            (("a", None), ("a", -(2**63))),
            (("b",), ("a",)),
            (("a", 1), ("a", 1)),
            (("日本", 2**63 - 1), None),
        ]
        for reader in (store, None):
            if reader is None:
                store.commit()
                reader = factory.reopen().get_read_store(1)
            for start, end in bounds:
                got = [k for k, _ in reader.range_scan(start, end)]
                want = [k for k in ordered if _in_range(k, start, end, nulls_first)]
                assert got == want, f"range_scan({start!r}, {end!r})"

    def test_key_types_keep_their_order(self, factory: ProviderFactory) -> None:
        families = {name: (pa.schema([("k", typ)]), V) for name, (typ, _) in TYPED_KEYS.items()}
        provider = factory.open(column_families=families)
        store = provider.get_store(0)
        for name, (_, values) in TYPED_KEYS.items():
            for i, value in enumerate(reversed(values)):
                store.put((value,), (i, name), name)
        store.commit()
        reader = factory.reopen(column_families=families).get_read_store(1)
        for name, (_, values) in TYPED_KEYS.items():
            got = [k[0] for k, _ in reader.iterator(name)]
            assert got == values, f"order of {name} keys"
            assert reader.get((values[0],), name) == (len(values) - 1, name)

    def test_value_types_round_trip(self, factory: ProviderFactory) -> None:
        schema = pa.schema(
            [
                ("b", pa.bool_()),
                ("i8", pa.int8()),
                ("u32", pa.uint32()),
                ("f32", pa.float32()),
                ("f64", pa.float64()),
                ("s", pa.string()),
                ("bin", pa.binary()),
                ("ts", pa.timestamp("us")),
                ("d", pa.date32()),
                ("dec", pa.decimal128(12, 3)),
            ]
        )
        rows: list[Row] = [
            (
                True,
                -128,
                2**32 - 1,
                0.5,
                -1e300,
                "日本\x00",
                b"\x00\xff",
                dt.datetime(1969, 1, 1),
                dt.date(2024, 2, 29),
                decimal.Decimal("-123456789.123"),
            ),
            (None,) * 10,
            (
                False,
                0,
                0,
                float("-inf"),
                0.0,
                "",
                b"",
                dt.datetime(2024, 1, 1, 0, 0, 0, 1),
                dt.date(1970, 1, 1),
                decimal.Decimal("0.000"),
            ),
        ]
        keys: list[Row] = [(i,) for i in range(len(rows))]
        key_schema = pa.schema([("id", pa.int64())])
        provider = factory.open(key_schema=key_schema, value_schema=schema)
        store = provider.get_store(0)
        store.put_many(keys[:2], rows[:2])
        store.put(keys[2], rows[2])
        assert store.get_many(keys) == rows
        store.commit()
        reader = factory.reopen(key_schema=key_schema, value_schema=schema).get_read_store(1)
        assert reader.get_many(keys) == rows
        assert [v for _, v in reader.iterator()] == rows

    # --- column families -----------------------------------------------------------------------

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
        _commit(provider, 0, {("a", 1): (1, None)})
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
            _commit(provider, 0, {("p", i): (i, None)})
        factory.close_all()
        for i, sid in enumerate(ids):
            reader = factory.open(store_id=sid).get_read_store(1)
            assert read_all(reader) == {DEFAULT_CF: {("p", i): (i, None)}}

    # --- versions ------------------------------------------------------------------------------

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
        _commit(provider, 0, {("a", 1): (1, None), ("a", 2): (2, None)})
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
        _commit(provider, 0, {("a", 1): (1, None), ("a", 2): (2, None)})
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
        store = _commit(provider, 0, {("a", 1): (1, None)})
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

    def test_read_store_is_read_only(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        _commit(provider, 0, {("a", 1): (1, None)})
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
        states = _history(provider, 6)
        for v, state in enumerate(states):
            assert read_all(provider.get_read_store(v)) == {DEFAULT_CF: state}, f"version {v}"
        # Reading an old version leaves the store writable at the newest one.
        _commit(provider, 6, {("after", 0): (0, None)})
        assert provider.get_read_store(7).get(("after", 0)) == (0, None)

    @pytest.mark.parametrize("local", ["same-local-dir", "fresh-local-dir"])
    def test_reopen_at_every_version(self, factory: ProviderFactory, local: str) -> None:
        states = _history(factory.open(), 6)
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
        _commit(provider, 0, {("a", 0): (0, None)})
        first = _commit(provider, 1, {("a", 1): (1, "first")})
        second = _commit(provider, 1, {("a", 2): (2, "second")}, [("a", 0)])
        assert first.checkpoint_id and second.checkpoint_id
        assert first.checkpoint_id != second.checkpoint_id
        ids = {ckpt for v, ckpt, _ in durable_files(factory.store_id) if v == 2}
        assert {first.checkpoint_id, second.checkpoint_id} <= ids
        want_first = {("a", 0): (0, None), ("a", 1): (1, "first")}
        want_second = {("a", 2): (2, "second")}
        for p in _providers(factory, provider):
            assert read_all(p.get_read_store(2, first.checkpoint_id)) == {DEFAULT_CF: want_first}
            assert read_all(p.get_read_store(2, second.checkpoint_id)) == {DEFAULT_CF: want_second}
            # Without a checkpoint id, the newest attempt is the one loaded.
            assert read_all(p.get_read_store(2)) == {DEFAULT_CF: want_second}

    def test_lineage_follows_the_chosen_attempt(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        _commit(provider, 0, {("a", 0): (0, None)})
        first = _commit(provider, 1, {("a", 1): (1, "first")})
        _commit(provider, 1, {("a", 2): (2, "second")})
        assert first.checkpoint_id is not None
        third = _commit(provider, 2, {("a", 3): (3, None)}, checkpoint_id=first.checkpoint_id)
        want = {("a", 0): (0, None), ("a", 1): (1, "first"), ("a", 3): (3, None)}
        for p in _providers(factory, provider):
            assert read_all(p.get_read_store(3)) == {DEFAULT_CF: want}
            assert read_all(p.get_read_store(3, third.checkpoint_id)) == {DEFAULT_CF: want}

    def test_missing_versions_are_errors(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        _history(provider, 2)
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

    # --- maintenance ---------------------------------------------------------------------------

    def test_maintenance_on_an_empty_store(self, factory: ProviderFactory) -> None:
        provider = factory.open()
        provider.do_maintenance()
        provider.do_maintenance()
        assert provider.latest_version() == 0
        _commit(provider, 0, {("a", 1): (1, None)})
        provider.do_maintenance()
        assert provider.get_read_store(1).get(("a", 1)) == (1, None)

    def test_maintenance_writes_snapshots(self, factory: ProviderFactory) -> None:
        provider = factory.open(min_deltas_for_snapshot=3)
        states: list[dict[Row, Row]] = [{}]
        for v in range(1, 9):
            states.append(_history_step(provider, v, states[-1]))
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
            states.append(_history_step(provider, v, states[-1]))
            provider.do_maintenance()
        factory.close_all()
        snapshots = [v for v, _, _ in durable_files(factory.store_id, "snapshot")]
        assert snapshots
        base = max(snapshots)
        directory = _store_dir(factory)
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
            states.append(_history_step(provider, v, states[-1]))
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
            _commit(provider, 10, {("next", 0): (0, None)})
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
            states.append(_history_step(provider, v, states[-1]))
            provider.do_maintenance()
        assert [v for v, _, _ in durable_files(factory.store_id, "snapshot")] == [3]
        # The replay: batch 2 runs again from version 2 and commits a new attempt of version 3.
        provider = factory.reopen(**conf)
        replayed = _commit(provider, 2, {("replayed", 3): (3, None)})
        live = apply_changes(states[2], {("replayed", 3): (3, None)}, [])
        provider.do_maintenance()
        _commit(provider, 3, {("replayed", 4): (4, None)})
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
            states.append(_history_step(provider, v, states[-1]))
            if v <= 3:
                provider.do_maintenance()
        provider = factory.reopen(**conf)
        replayed = _commit(provider, 3, {("replayed", 4): (4, None)})
        want = apply_changes(states[3], {("replayed", 4): (4, None)}, [])
        provider.do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        assert read_all(provider.get_read_store(4)) == {DEFAULT_CF: want}
        assert read_all(provider.get_read_store(4, replayed.checkpoint_id)) == {DEFAULT_CF: want}
        _commit(provider, 4, {("replayed", 5): (5, None)})
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
            states.append(_history_step(provider, v, states[-1]))
            provider.do_maintenance()
        provider = factory.reopen(**conf)
        again = _commit(provider, 0, {("again", 1): (1, None)})
        provider.do_maintenance()
        want = {("again", 1): (1, None)}
        assert read_all(provider.get_read_store(1, again.checkpoint_id)) == {DEFAULT_CF: want}
        _commit(provider, 1, {("again", 2): (2, None)}, checkpoint_id=again.checkpoint_id)
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
            states.append(_history_step(provider, v, states[-1]))
            provider.do_maintenance()
        provider = factory.reopen(**conf)
        again = _commit(provider, 0, {("again", 1): (1, None)})
        factory.close(provider)
        factory.open(local_dir=factory.fresh_local_dir(), **conf).do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir(), **conf)
        want = {("again", 1): (1, None)}
        assert read_all(provider.get_read_store(1, again.checkpoint_id)) == {DEFAULT_CF: want}

    # --- schema checks -------------------------------------------------------------------------

    def test_reopen_with_a_different_key_schema(self, factory: ProviderFactory) -> None:
        _commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        other = pa.schema([("name", pa.string()), ("n", pa.int32())])
        with pytest.raises(SchemaMismatchError, match="key schema"):
            factory.open(key_schema=other)
        with pytest.raises(SchemaMismatchError, match="key schema"):
            factory.open(key_schema=pa.schema([("name", pa.string())]))
        assert factory.open().get_read_store(1).get(("a", 1)) == (1, None)

    def test_reopen_with_a_different_value_schema(self, factory: ProviderFactory) -> None:
        _commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        other = pa.schema([("count", pa.string()), ("label", pa.string())])
        with pytest.raises(SchemaMismatchError, match="value schema.*'count' changed type"):
            factory.open(value_schema=other)
        families = {"cf": (pa.schema([("k", pa.int64())]), V)}
        _commit(factory.open(column_families=families), 1, {(1,): (1, None)}, cf="cf")
        factory.close_all()
        with pytest.raises(SchemaMismatchError, match="cf"):
            factory.open(column_families={"cf": (pa.schema([("k", pa.string())]), V)})

    def test_reopen_with_a_different_provider(self, factory: ProviderFactory) -> None:
        _commit(factory.open(), 0, {("a", 1): (1, None)})
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
        _commit(factory.open(), 0, {("a", 1): (1, None)})
        factory.close_all()
        cls = resolve_provider(self.provider)
        other_key = pa.schema([("name", pa.string()), ("n", pa.int32())])
        with pytest.raises(SchemaMismatchError), cls() as provider:
            provider.init(factory.store_id, other_key, factory.value_schema, factory.conf())
        cls().close()  # closing a provider that was never bound is harmless

    def test_reopen_with_a_different_partition_count(self, factory: ProviderFactory) -> None:
        _commit(factory.open(num_partitions=4), 0, {("a", 1): (1, None)})
        factory.close_all()
        with pytest.raises(SchemaMismatchError, match="partition"):
            factory.open(num_partitions=8)
        assert factory.open(num_partitions=4).get_read_store(1).get(("a", 1)) == (1, None)

    # --- metrics -------------------------------------------------------------------------------

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
        store = _commit(provider, 0, {("a", 1): (1, None)})
        declared = set(type(provider).supported_custom_metrics())
        reported = set(store.metrics().custom)
        assert reported <= declared, f"undeclared custom metrics: {sorted(reported - declared)}"
        for name, value in store.metrics().custom.items():
            assert isinstance(value, int | float), f"{name} = {value!r}"
