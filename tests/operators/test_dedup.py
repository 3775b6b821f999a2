"""The deduplication operator: first row per key, across batches, null keys included."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.dedup import Deduplicate

from .conftest import OperatorRunner

SCHEMA = pa.schema([("k", pa.string()), ("j", pa.int64()), ("v", pa.float64())])
Runner = Callable[[Deduplicate], OperatorRunner]


def test_first_row_per_key_across_batches(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(SCHEMA, ["k", "j"]))
    out, m = runner.run(
        [
            {"k": "a", "j": 1, "v": 1.0},
            {"k": "a", "j": 1, "v": 2.0},
            {"k": None, "j": 1, "v": 3.0},
            {"k": None, "j": 1, "v": 4.0},
            {"k": "a", "j": None, "v": 5.0},
        ],
        "append",
    )
    assert [r["v"] for r in out.to_pylist()] == [1.0, 3.0, 5.0]
    assert m.num_input_rows == 5 and m.num_rows_updated == 3 and m.num_output_rows == 3
    out, m = runner.run(
        [
            {"k": "a", "j": 1, "v": 9.0},
            {"k": "b", "j": 1, "v": 6.0},
            {"k": None, "j": None, "v": 7.0},
        ],
        "append",
    )
    assert [r["v"] for r in out.to_pylist()] == [6.0, 7.0]
    out, _ = runner.run([], "append")
    assert out.num_rows == 0


def test_all_columns_when_none_given(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(SCHEMA, []))
    rows = [
        {"k": "a", "j": 1, "v": 1.0},
        {"k": "a", "j": 1, "v": 1.0},
        {"k": "a", "j": 1, "v": 2.0},
    ]
    out, _ = runner.run(rows, "update")
    assert out.num_rows == 2


def test_unknown_column_and_complete_mode_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="no column"):
        Deduplicate(SCHEMA, ["nope"])
    with pytest.raises(ConfigurationError, match="complete"):
        Deduplicate(SCHEMA, ["k"]).check_output_mode("complete")


def test_first_rows_of_interleaved_keys_in_input_order(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(SCHEMA, ["j"]))
    js = [3, 1, 3, 2, 1, 4, 2, 5]
    out, m = runner.run([{"k": "x", "j": j, "v": float(i)} for i, j in enumerate(js)], "append")
    assert [(r["j"], r["v"]) for r in out.to_pylist()] == [
        (3, 0.0),
        (1, 1.0),
        (2, 3.0),
        (4, 5.0),
        (5, 7.0),
    ]
    assert m.num_rows_updated == 5
    out, m = runner.run([{"k": "y", "j": j, "v": -1.0} for j in (5, 6, 6, 1, 7)], "append")
    assert [(r["j"], r["v"]) for r in out.to_pylist()] == [(6, -1.0), (7, -1.0)]
    assert m.num_rows_updated == 2
