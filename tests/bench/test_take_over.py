"""``sparkstate bench take-over``: its sizes, its checks, its ratio and the take-over's log line,
without Spark (the whole bench runs with ``--quick`` in docs/benchmarks.md's numbers)."""

from __future__ import annotations

import argparse
import copy
import logging
from typing import Any

import pytest

from sparkstate.bench import repartition, take_over
from sparkstate.engine.spark.session import REMOTE_ENV

PARAMS = {
    "state_rows": 10_000,
    "rows_per_batch": 5_000,
    "partitions": 4,
    "spark_provider": "hdfs",
    "check_keys": 100,
}


def _good_run(system: str) -> dict[str, Any]:
    """What a system whose restart does everything right reports."""
    exp = repartition.expected_check_batch(PARAMS)
    check = {
        "batchId": 2,
        "numInputRows": exp["rows"],
        "numRowsTotal": exp["numRowsTotal"],
        "numRowsUpdated": exp["numRowsUpdated"],
        "output": {f: exp[f] for f in repartition.SUMMARY_FIELDS},
    }
    ours = system != take_over.SPARK
    old, _ = repartition.check_keys(PARAMS)
    back = {
        "batchId": 3,
        "numRowsTotal": exp["numRowsTotal"],
        "numRowsUpdated": PARAMS["check_keys"],
        "output": {
            "rows": PARAMS["check_keys"],
            "count": 3 * PARAMS["check_keys"],
            "sum": 3 * sum(k % repartition.VALUE_MOD for k in old),
        },
    }
    return {
        "available": True,
        "build_batches": 2,
        "restart_s": 2.0,
        "take_over_s": 1.0 if ours else None,
        "take_over_rows": PARAMS["state_rows"] if ours else None,
        "check": [check],
        "export_s": 1.0 if ours else None,
        "back_s": 2.0,
        "back_check": [back],
    }


def test_params() -> None:
    params = take_over.params_for(argparse.Namespace(quick=True))
    assert params["state_rows"] == 1_000_000
    assert params["check_keys"] == 10_000
    assert params["spark_provider"] == "hdfs"
    params = take_over.params_for(
        argparse.Namespace(state_rows=300, rows_per_batch=100, spark_provider="rocksdb")
    )
    assert (params["state_rows"], params["check_keys"]) == (300, 3)
    with pytest.raises(ValueError, match="rows per batch"):
        take_over.params_for(argparse.Namespace(state_rows=10, rows_per_batch=20))


def test_check_passes_a_right_run_and_names_what_is_wrong() -> None:
    for system in take_over.SYSTEMS:
        assert take_over.check_system(PARAMS, system, _good_run(system)) == []
    lost = copy.deepcopy(_good_run("sparkstate-rocksdb"))  # a key the take-over lost
    lost["check"][0]["numRowsTotal"] -= 1
    lost["check"][0]["output"]["old_rows"] -= 1
    lost["take_over_rows"] -= 1
    assert take_over.check_system(PARAMS, "sparkstate-rocksdb", lost) == [
        "check batch: numRowsTotal 10099, expected 10100",
        "check batch: output old_rows 99, expected 100",
        "take-over: 9999 rows, 10000 expected",
    ]
    renumbered = {**_good_run("spark"), "build_batches": 3}
    assert take_over.check_system(PARAMS, "spark", renumbered) == [
        "check batch: id 2, 3 expected",
        "back: batchId 3, expected 4",
    ]
    dropped = copy.deepcopy(_good_run("sparkstate-memory"))  # a key the export lost
    dropped["back_check"][0]["numRowsTotal"] += 1
    dropped["back_check"][0]["output"]["count"] -= 2
    assert take_over.check_system(PARAMS, "sparkstate-memory", dropped) == [
        "back: numRowsTotal 10101, expected 10100",
        "back: output count 298, expected 300",
    ]


def test_ratio_is_sparks_restart_over_ours() -> None:
    results = {
        "spark": {"restart_s": 6.0, "back_s": 4.0},
        "sparkstate-rocksdb": {
            "restart_s": 3.0,
            "take_over_s": 1.5,
            "export_s": 1.0,
            "back_s": 4.0,
        },
        "sparkstate-memory": {"error": "failed"},
    }
    assert take_over.ratios(results) == {
        "restart:sparkstate-rocksdb/spark": 2.0,
        "take-over:sparkstate-rocksdb/spark": 4.0,
        "back:sparkstate-rocksdb/spark": 0.8,
    }


def test_the_take_over_is_read_from_its_log_line() -> None:
    handler = take_over._TakeOverLog()  # noqa: SLF001 - the bench's own reader of the line
    record = logging.LogRecord(
        "sparkstate.engine",
        logging.WARNING,
        __file__,
        1,
        "/chk: took over the state of 1 operator(s) from Spark's RocksDBStateStoreProvider after "
        "its batch 4 (10,000,000 rows, 12.8 s; 1 read from Spark's files, 0 by its state reader)",
        None,
        None,
    )
    handler.emit(record)
    assert handler.found == (10_000_000, 12.8)


def test_refused_over_spark_connect_and_for_unknown_systems(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert take_over.run(argparse.Namespace(quick=True, systems="nope", json_out=None)) == 2
    monkeypatch.setenv(REMOTE_ENV, "sc://127.0.0.1:1")
    assert take_over.run(argparse.Namespace(quick=True, json_out=None)) == 2
