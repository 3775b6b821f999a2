"""The rocksdb provider's commit of a large overlay: one sort, exact key counts.

A commit puts the overlay in key order once (``key_order``), then reads in bulk whether the keys it
writes were stored (skipping, by bisection, the keys above their family's largest stored key) and
writes changelog and database in that order. These tests hold the order to ``sorted`` and the
counts and committed state to a dict model, with batches above the multi-get chunk size.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkstate.store.families import Row
from sparkstate.store.rocksdb.local import key_order
from sparkstate.testing import ProviderFactory

KEY = pa.schema([("n", pa.int64())])
VALUE = pa.schema([("v", pa.int64())])
NAMES = "names"
FAMILIES = {NAMES: (pa.schema([("name", pa.string())]), VALUE)}

_BYTES = st.lists(st.sampled_from([b"\x00", b"\x01", b"\x7f", b"\x80", b"\xff"]), max_size=20)
_KEYS = st.builds(
    lambda prefix, keys: [prefix + k for k in keys],
    st.binary(max_size=3),
    st.lists(_BYTES.map(b"".join), max_size=60),
)


@given(_KEYS)
def test_key_order_sorts_bytewise(keys: list[bytes]) -> None:
    # Zero bytes, shared prefixes, keys that are prefixes of others, duplicates: the windows
    # after the common prefix tie, and the order must still be bytewise.
    assert [keys[i] for i in key_order(keys)] == sorted(keys)


def test_key_order_of_fixed_width_keys() -> None:
    keys = [b"\x00" + random.Random(3).randbytes(8) for _ in range(5000)]
    keys += [b"\x00" + k[1:5] + b"\x00" * 4 for k in keys[:100]]  # ties in the first window
    assert [keys[i] for i in key_order(keys)] == sorted(keys)


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[ProviderFactory]:
    factory = ProviderFactory(
        "rocksdb",
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
        column_families=FAMILIES,
    )
    yield factory
    factory.close_all()


def test_counts_and_state_of_large_commits_match_a_model(factory: ProviderFactory) -> None:
    """Each version reads some keys (their existence then known), overwrites read and unread
    ones, deletes stored and never stored ones, and adds keys above every stored key (as keys
    that grow with event time do); the family ``names`` is empty until version 2."""
    rng = random.Random(11)
    model: dict[tuple[str, Row], Row] = {}
    provider = factory.open()
    for version in range(5):
        store = provider.get_store(version)
        reads = [(n,) for n in rng.sample(range(8000), 1500)]
        assert store.get_many(reads) == [model.get(("", k)) for k in reads]
        puts = [(n,) for n in rng.sample(range(8000), 3000)]
        puts += [(n,) for n in range(8000 + 2000 * version, 9500 + 2000 * version)]
        store.put_many(puts, [(version,)] * len(puts))
        model.update({("", k): (version,) for k in puts})
        gone = [(n,) for n in rng.sample(range(12000), 1200)]
        store.remove_many(gone)
        for k in gone:
            model.pop(("", k), None)
        if version >= 2:
            names = [(f"{n:05d}",) for n in rng.sample(range(3000 * version), 2000)]
            store.put_many(names, [(version,)] * len(names), NAMES)
            model.update({(NAMES, k): (version,) for k in names})
            store.remove_many(names[:300:3], NAMES)
            for k in names[:300:3]:
                model.pop((NAMES, k), None)
        assert store.metrics().num_keys == len(model)
        assert store.commit() == version + 1
    restored = factory.reopen(local_dir=factory.fresh_local_dir())
    reader = restored.get_read_store(5)
    assert reader.metrics().num_keys == len(model)
    assert dict(reader.iterator()) == {k: v for (cf, k), v in model.items() if cf == ""}
    assert dict(reader.iterator(NAMES)) == {k: v for (cf, k), v in model.items() if cf == NAMES}
    reader.abort()
