"""The count of a timestamp index's entries, where callers say which entries are stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sparkstate.operators import ts_index
from sparkstate.operators.ts_index import (
    COUNT_KEY_SCHEMA,
    COUNT_SCHEMA,
    MARKER_SCHEMA,
    TimestampIndex,
    decode_ts_many,
    encode_ts_many,
    index_key_schema,
)
from sparkstate.store import StateStoreProvider
from sparkstate.store.base import StateStore
from sparkstate.store.codec import KeyCodec
from sparkstate.testing.factory import ProviderFactory

from .conftest import PROVIDERS

KEYS = pa.schema([pa.field("k", pa.int64(), nullable=False)])
FAMILIES = {
    "idx": (index_key_schema(KEYS), MARKER_SCHEMA),
    "idx_count": (COUNT_KEY_SCHEMA, COUNT_SCHEMA),
}


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStoreProvider]:
    factory = ProviderFactory(
        request.param, str(tmp_path / "ckpt"), str(tmp_path / "local"), column_families=FAMILIES
    )
    yield factory.open()
    factory.close_all()


def kenc(store: StateStore, k: int) -> bytes:
    """An encoded grouping key, as the index's users give them."""
    return KeyCodec(KEYS).encode((k,))


def scanned(store: StateStore) -> int:
    return sum(len(keys) for keys, _ in store.range_scan_encoded_chunks(cf="idx"))


def test_count_with_known_and_unknown_entries_equals_a_scan(provider: StateStoreProvider) -> None:
    store = provider.get_store(0)
    index = TimestampIndex("idx", "idx_count")
    index.add_many([kenc(store, k) for k in range(10)], list(range(10)))  # not known
    index.flush(store)
    assert index.size(store) == 10
    version = store.commit()

    store = provider.get_store(version, store.checkpoint_id)
    index = TimestampIndex("idx", "idx_count")
    k = [kenc(store, i) for i in range(20)]
    index.remove_many(k[0:4], [0, 1, 2, 3], stored=True)  # four go
    index.add_many(k[0:2], [0, 100], stored=False)  # (0, k0) put back; (100, k1) new
    index.add_many(k[10:13], [10, 11, 12], stored=False)  # three new
    index.remove_many(k[15:17], [15, 16])  # not stored, not known: read back
    index.add_many(k[4:6], [4, 50])  # (4, k4) stored, (50, k5) new, not known: read back
    index.move(k[6], 6, 60)  # not known
    index.flush(store)
    assert index.size(store) == scanned(store) == 10 - 4 + 1 + 1 + 3 + 1
    version = store.commit()

    # A version without the count (a rescale does not move it): counted once by a scan.
    store = provider.get_store(version, store.checkpoint_id)
    store.remove(("idx",), "idx_count")
    index = TimestampIndex("idx", "idx_count")
    index.remove_many([k[10], k[11]], [10, 11], stored=True)
    index.add_many([k[10], k[19]], [10, 19], stored=False)
    index.flush(store)
    assert index.size(store) == scanned(store) == 12
    store.commit()
    assert store.metrics().num_keys == 13  # the entries and the count row


def test_timestamps_encode_and_decode_as_the_codec_does() -> None:
    """The index's own encoding of timestamps is the key codec's, byte for byte, and sorts as
    the numbers do."""
    codec = KeyCodec(pa.schema([pa.field("ts_ms", pa.int64(), nullable=False)]))
    ts = np.array([-(2**63), -(2**40) - 7, -1, 0, 1, 1_704_067_200_000, 2**63 - 1], np.int64)
    encoded = encode_ts_many(ts)
    assert encoded == [codec.encode((int(t),)) for t in ts]
    one_by_one = [
        ts_index._TS_PREFIX + (int(t) + ts_index._SIGN_BIT).to_bytes(8, "big") for t in ts
    ]
    assert one_by_one == encoded
    assert sorted(encoded) == encoded
    keyed = [e + b"key" for e in encoded]
    assert decode_ts_many(keyed).tolist() == ts.tolist()
    assert encode_ts_many(ts[:0]) == [] and decode_ts_many([]).tolist() == []


@pytest.mark.parametrize("in_arrays_from", [0, ts_index._IN_ARRAYS_FROM], ids=["arrays", "few"])
def test_buffered_writes_leave_each_entry_as_its_last_write(
    provider: StateStoreProvider, in_arrays_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random runs of writes (single and bulk, entries written more than once, what the caller
    says of them true to the store) leave the store with each entry as its last write left it,
    and the count equal to a scan: resolved in arrays, and one by one."""
    monkeypatch.setattr(ts_index, "_IN_ARRAYS_FROM", in_arrays_from)
    rng = np.random.default_rng(7)
    store = provider.get_store(0)
    model: set[tuple[int, int]] = set()
    for _ in range(6):
        index = TimestampIndex("idx", "idx_count")
        stored_before = set(model)
        removed_as_stored: set[tuple[int, int]] = set()
        for _ in range(40):
            entries = {
                (int(t), int(k)) for t, k in rng.integers(0, 6, (int(rng.integers(1, 8)), 2))
            }
            kind = int(rng.integers(0, 4))
            if kind == 0:  # single calls
                for t, k in entries:
                    if rng.random() < 0.5:
                        index.add(kenc(store, k), t)
                        model.add((t, k))
                    else:
                        index.remove(kenc(store, k), t)
                        model.discard((t, k))
            elif kind == 1:  # removed, known stored where they are
                known = entries & stored_before
                index.remove_many(
                    [kenc(store, k) for _, k in known], [t for t, _ in known], stored=True
                )
                removed_as_stored |= known
                model -= known
            elif kind == 2:  # added, known not stored (or put back)
                new = {e for e in entries if e not in stored_before or e in removed_as_stored}
                new -= model
                index.add_many([kenc(store, k) for _, k in new], [t for t, _ in new], stored=False)
                model |= new
            else:  # not known
                if rng.random() < 0.5:
                    index.add_many([kenc(store, k) for _, k in entries], [t for t, _ in entries])
                    model |= entries
                else:
                    index.remove_many([kenc(store, k) for _, k in entries], [t for t, _ in entries])
                    model -= entries
        index.flush(store)
        found = {(ts, KeyCodec(KEYS).decode(k)[0]) for ts, k in index.due(store, 10)}
        assert found == model
        assert index.size(store) == scanned(store) == len(model)
        version = store.commit()
        store = provider.get_store(version, store.checkpoint_id)
