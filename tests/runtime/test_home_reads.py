"""The live reads' wire messages and what a provider answers them with, without Spark."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.runtime.home_reads import (
    REFUSED,
    VALUES,
    BadRequest,
    answer,
    decode_message,
    encode_message,
)
from sparkstate.runtime.providers import ProviderCache, StoreSettings
from sparkstate.store.base import StoreConf

KEY = pa.schema([("k", pa.string())])
VALUE = pa.schema([("n", pa.int64())])


def test_a_message_round_trips_and_anything_else_is_refused() -> None:
    blobs = [b"a", None, b"", b"\x00" * 300]
    payload = encode_message({"op": "get", "x": [1, 2]}, blobs)
    assert decode_message(payload) == ({"op": "get", "x": [1, 2]}, blobs)
    rng = random.Random(7)
    for cut in range(len(payload)):  # every truncation
        with pytest.raises(BadRequest):
            decode_message(payload[:cut])
    with pytest.raises(BadRequest):
        decode_message(payload + b"x")
    with pytest.raises(BadRequest):
        decode_message(encode_message([1, 2]))  # type: ignore[arg-type]
    for _ in range(2000):  # random bytes never parse into anything but BadRequest
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        with contextlib.suppress(BadRequest):
            decode_message(junk)


@pytest.mark.parametrize("provider", ["memory", "rocksdb"])
def test_a_provider_answers_from_its_committed_versions_only(tmp_path: Path, provider: str) -> None:
    cache = ProviderCache()
    settings = StoreSettings(str(tmp_path / "state"), provider, StoreConf(local_dir=str(tmp_path)))
    key = (settings.state_root, 0, 0)
    store_provider = cache.provider(key, settings, 1, KEY, VALUE, {})
    fam = None
    for version, n in enumerate((1, 2, 3)):
        store = store_provider.get_store(version)
        fam = store.column_family()
        store.put(("a",), (n,))
        store.commit()
    assert fam is not None
    pkey = fam.physical_key(("a",))
    request = {"op": "get", "root": settings.state_root, "operator": 0, "partition": 0}
    kind, payload = answer({**request, "version": 3}, [pkey], cache)
    assert kind == VALUES
    reply, values = decode_message(payload)
    assert 3 in reply["held"] and fam.value_codec.decode(values[0]) == (3,)
    kind, payload = answer({**request, "version": 2}, [pkey], cache)
    assert kind == VALUES and fam.value_codec.decode(decode_message(payload)[1][0]) == (2,)
    # A version being written is no version a reader sees.
    store = store_provider.get_store(3)
    store.put(("a",), (99,))
    kind, payload = answer({**request, "version": 3}, [pkey], cache)
    assert fam.value_codec.decode(decode_message(payload)[1][0]) == (3,)
    kind, _ = answer({**request, "version": 4}, [pkey], cache)
    assert kind == REFUSED
    # Another attempt of the version than the one asked for: refused too.
    kind, _ = answer({**request, "version": 3, "checkpoint_id": "other"}, [pkey], cache)
    assert kind == REFUSED
    store.abort()
    # A partition this process does not hold: refused, as is a request that makes no sense.
    kind, _ = answer({**request, "partition": 1, "version": 3}, [pkey], cache)
    assert kind == REFUSED
    for bad in ({**request, "op": "put"}, {**request, "version": -1}, {"op": "get"}):
        with pytest.raises(BadRequest):
            answer(bad, [pkey], cache)
    cache.close_all()
