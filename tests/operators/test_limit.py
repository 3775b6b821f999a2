"""The streaming limit operator: the first rows in arrival order, the count kept across batches
and across a reload of the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.limit import LIMIT_KEY, StreamingLimit
from sparkstate.store import StoreConf, StoreId, provider_class

from .conftest import PROVIDERS, OperatorRunner

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), (LIMIT_KEY, pa.int32())])
Runner = Callable[[StreamingLimit], OperatorRunner]


def rows(*values: int) -> list[dict[str, object]]:
    return [{"k": f"k{v % 2}", "v": v, LIMIT_KEY: None} for v in values]


def emitted(out: pa.Table) -> list[int]:
    return [r["v"] for r in out.to_pylist()]


def test_first_rows_in_arrival_order_until_the_limit(make_runner: Runner) -> None:
    runner = make_runner(StreamingLimit(SCHEMA, 5))
    out, m = runner.run(rows(7, 3, 9), "append")
    assert emitted(out) == [7, 3, 9]
    assert out.schema.names == ["k", "v"]  # the shuffle column is not output
    assert (m.num_input_rows, m.num_output_rows, m.num_rows_updated) == (3, 3, 1)
    out, m = runner.run(rows(4, 8, 1, 6, 2), "append")  # the limit falls in this batch
    assert emitted(out) == [4, 8]
    assert (m.num_input_rows, m.num_output_rows, m.num_rows_updated) == (5, 2, 1)
    out, m = runner.run(rows(5), "append")
    assert emitted(out) == []
    assert (m.num_input_rows, m.num_output_rows, m.num_rows_updated) == (1, 0, 0)


def test_limit_zero_emits_nothing(make_runner: Runner) -> None:
    out, m = make_runner(StreamingLimit(SCHEMA, 0)).run(rows(1, 2), "append")
    assert out.num_rows == 0 and m.num_rows_updated == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_count_survives_a_reload(tmp_path: Path, provider: str) -> None:
    op = StreamingLimit(SCHEMA, 4)
    store_id = StoreId(str(tmp_path / "chk"), 0, 0)

    def runner_at(batch_id: int, local: str) -> OperatorRunner:
        p = provider_class(provider)()
        conf = StoreConf(local_dir=str(tmp_path / local))
        p.init(store_id, op.key_schema, op.value_schema, conf, None)
        runner = OperatorRunner(op, p)
        runner.batch_id = batch_id
        return runner

    first = runner_at(0, "local-a")
    assert emitted(first.run(rows(1, 2, 3), "append")[0]) == [1, 2, 3]
    first.provider.close()
    again = runner_at(1, "local-b")  # another worker, nothing local: loads the checkpoint
    assert emitted(again.run(rows(4, 5, 6), "append")[0]) == [4]
    assert emitted(again.run(rows(7), "append")[0]) == []
    again.provider.close()


def test_bad_limits_are_refused() -> None:
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ConfigurationError, match="limit"):
            StreamingLimit(SCHEMA, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=LIMIT_KEY):
        StreamingLimit(pa.schema([("v", pa.int64())]), 1)
    with pytest.raises(ConfigurationError, match="update"):
        StreamingLimit(SCHEMA, 1).check_output_mode("update")


def test_event_time_of_every_input_row_is_observed(make_runner: Runner) -> None:
    """The watermark follows the input, as Spark's does, not only the rows the limit emits."""
    schema = pa.schema([("t", pa.timestamp("us", tz="UTC")), (LIMIT_KEY, pa.int32())])
    runner = make_runner(StreamingLimit(schema, 1, event_time="t"))
    out, m = runner.run(
        [{"t": 5_000_000, LIMIT_KEY: None}, {"t": 9_000_000, LIMIT_KEY: None}], "append"
    )
    assert out.num_rows == 1 and m.max_event_time_ms == 9_000
    out, m = runner.run([{"t": 7_000_000, LIMIT_KEY: None}], "append")
    assert out.num_rows == 0 and m.max_event_time_ms == 7_000
