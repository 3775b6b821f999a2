"""Fixtures for operator tests: a real provider in a temporary directory, no Spark."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.operators.base import BatchContext, OperatorMetrics, StatefulOperator
from sparkstate.runtime.partition import run_partition
from sparkstate.store import StateStoreProvider, StoreConf, StoreId, provider_class
from sparkstate.store.base import StateStore

PROVIDERS = ["memory"]
try:  # the rocksdb provider lands separately; test it once it is there
    provider_class("rocksdb")
    PROVIDERS.append("rocksdb")
except Exception:  # noqa: BLE001 - any import problem means "not available yet"
    pass


#: The event times of the operator tests count from here.
BASE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    """The event time ``seconds`` after :data:`BASE`."""
    return BASE + dt.timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    """:func:`at` in epoch milliseconds, as watermarks are given."""
    return int(at(seconds).timestamp() * 1000)


class OperatorRunner:
    """Runs an operator batch after batch on one partition's store, like the engine would."""

    def __init__(self, op: StatefulOperator, provider: StateStoreProvider) -> None:
        self.op = op
        self.provider = provider
        self.batch_id = 0

    def run(
        self, rows: list[dict[str, object]], mode: str, *, watermark_ms: int = 0
    ) -> tuple[pa.Table, OperatorMetrics]:
        table = pa.Table.from_pylist(rows, schema=self.op.input_schema)
        ctx = BatchContext(batch_id=self.batch_id, output_mode=mode, watermark_ms=watermark_ms)
        batches = iter(table.to_batches(max_chunksize=3))
        out = list(run_partition(self.op, self.provider, ctx, batches))
        self.batch_id += 1
        return pa.Table.from_batches(out, schema=self.op.output_schema), ctx.metrics


@pytest.fixture(params=PROVIDERS)
def make_runner(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[StatefulOperator], OperatorRunner]]:
    providers: list[StateStoreProvider] = []

    def make(op: StatefulOperator) -> OperatorRunner:
        provider = provider_class(request.param)()
        conf = StoreConf(local_dir=str(tmp_path / "local"))
        provider.init(
            StoreId(str(tmp_path / "chk"), 0, len(providers)),
            op.key_schema,
            op.value_schema,
            conf,
            op.column_families() or None,
        )
        providers.append(provider)
        return OperatorRunner(op, provider)

    yield make
    for p in providers:
        p.close()


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows returned by every range scan of a store, counted as they are read."""
    seen = [0]
    pairs, chunks = StateStore.range_scan_encoded, StateStore.range_scan_encoded_chunks

    def counting(self: StateStore, *args: Any, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        for pair in pairs(self, *args, **kwargs):
            seen[0] += 1
            yield pair

    def counting_chunks(
        self: StateStore, *args: Any, **kwargs: Any
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        for keys, values in chunks(self, *args, **kwargs):
            seen[0] += len(keys)
            yield keys, values

    monkeypatch.setattr(StateStore, "range_scan_encoded", counting)
    monkeypatch.setattr(StateStore, "range_scan_encoded_chunks", counting_chunks)
    return seen
