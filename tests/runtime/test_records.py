"""The driver's records: JSON round trips, the files they were always written as, the reports'
directory and the rule that picks one report per partition."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.operators.base import OperatorMetrics
from sparkstate.operators.dedup import Deduplicate
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.runtime.progress import build_progress
from sparkstate.runtime.records import (
    BatchCommit,
    BatchIntent,
    OperatorCommit,
    StoreReport,
    TaskReport,
)
from sparkstate.runtime.triggers import next_request


def report(partition: int, checkpoint_id: str, next_timer_ms: int | None = None) -> TaskReport:
    return TaskReport(
        op=0,
        partition=partition,
        checkpoint_id=checkpoint_id,
        version=3,
        operator=OperatorMetrics(num_input_rows=2, next_timer_ms=next_timer_ms),
        store=StoreReport(num_keys=5, custom={"rocksdbSstFileSize": 10.0}),
    )


def test_intent_and_commit_files_keep_their_format(tmp_path: Path) -> None:
    log = CheckpointLog(str(tmp_path))
    log.write_intent(
        BatchIntent(4, watermark_ms=1_000, batch_timestamp_ms=2_000, late_watermark_ms=500)
    )
    written = json.loads((tmp_path / "batches" / "4.json").read_text())
    assert written == {
        "batch_id": 4,
        "watermark_ms": 1_000,
        "batch_timestamp_ms": 2_000,
        "input_digest": None,
        "late_watermark_ms": 500,
    }
    assert log.read_intent(4).watermark_for_late_rows_ms == 500  # type: ignore[union-attr]
    del written["input_digest"]  # as written before the digest was recorded
    del written["late_watermark_ms"]  # ... and the watermark for late rows
    (tmp_path / "batches" / "4.json").write_text(json.dumps(written))
    assert log.read_intent(4) == BatchIntent(4, 1_000, 2_000)
    assert log.read_intent(4).watermark_for_late_rows_ms == 1_000  # type: ignore[union-attr]
    assert log.read_intent(5) is None
    commit = BatchCommit(
        batch_id=4,
        watermark_ms=1_000,
        watermark={"watermark_ms": 1_500, "max_event_time_ms": {"input": 2_500}},
        committed_at="2026-01-01T00:00:00.000Z",
        operators={0: OperatorCommit({0: "a", 1: None}, num_rows_total=7)},
    )
    log.write_commit(commit)
    written = json.loads((tmp_path / "commits" / "4.json").read_text())
    assert written["operators"] == {"0": {"checkpoint_ids": {"0": "a", "1": None},
                                          "num_rows_total": 7}}  # fmt: skip
    assert log.read_commit(4) == commit == log.latest_commit()
    assert commit.lineage() == {0: {0: "a", 1: None}}


def test_reports_travel_through_files_and_are_gone_after_the_commit(tmp_path: Path) -> None:
    log = CheckpointLog(str(tmp_path))
    reports = log.new_report_dir(7)
    reports(report(0, "b"))
    reports(report(0, "a"))  # an earlier attempt of the same partition
    reports(report(1, "c"))
    assert sorted((r.partition, r.checkpoint_id) for r in reports.read()) == [
        (0, "a"), (0, "b"), (1, "c")]  # fmt: skip
    assert report(0, "b").wins_over(report(0, "a"))
    assert log.new_report_dir(7).read() == []  # another run of the batch starts empty
    log.write_commit(BatchCommit(7, 0, {}, "", {0: OperatorCommit.of(reports.read())}))
    assert not (tmp_path / "reports" / "7").exists()


def test_a_no_data_batch_is_requested_by_what_drives_the_operators() -> None:
    reports = [report(0, "a", next_timer_ms=9_000), report(1, "b", next_timer_ms=7_000)]
    assert next_request({}, {0: "processing"}, False, reports, now_ms=1) == {
        "requested_at_ms": None, "due_ms": 7_000}  # fmt: skip
    assert next_request({}, {0: "event"}, True, reports, now_ms=5) == {
        "requested_at_ms": 5, "due_ms": None}  # fmt: skip
    assert next_request({"requested_at_ms": 3}, {0: "event"}, False, [], now_ms=5) == {
        "requested_at_ms": 3, "due_ms": None}  # fmt: skip
    assert next_request({}, {0: None}, True, reports, now_ms=5) == {
        "requested_at_ms": None, "due_ms": None}  # fmt: skip


def test_progress_sums_the_partitions_reports() -> None:
    op = Deduplicate(pa.schema([("k", pa.string())]), ["k"])
    progress = build_progress(
        query_id="q",
        run_id="r",
        name=None,
        batch_id=3,
        started_s=0.0,
        durations_ms={"triggerExecution": 1_000},
        operators={0: op},
        per_op={0: [report(0, "a"), report(1, "b")]},
        num_partitions=2,
        watermark_ms=None,
        sink_description="NoopSink",
    )
    (entry,) = progress["stateOperators"]
    assert entry["operatorName"] == op.operator_name == "dedupe"
    assert entry["numRowsTotal"] == 10 and entry["numShufflePartitions"] == 2
    assert entry["customMetrics"]["rocksdbSstFileSize"] == 20
    assert progress["numInputRows"] == 4 and progress["batchId"] == 3


def test_a_checkpoint_keeps_the_operator_ids_it_was_written_with(tmp_path: Path) -> None:
    """Chains were numbered from the first step before they were numbered as Spark numbers
    them (from the sink): a checkpoint written then restarts with its state where it is."""
    from sparkstate.runtime.start import StartRequest, prepare_checkpoint

    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    dedup, dedup_k = Deduplicate(schema, ["k", "v"]), Deduplicate(schema, ["k"])

    def request(ids: tuple[int, int]) -> StartRequest:
        ops = [{"id": i, **op.describe()} for i, op in zip(ids, (dedup, dedup_k), strict=True)]
        return StartRequest(str(tmp_path), None, "memory", None, 2, "append", ops, False, False)

    prepare_checkpoint(request((0, 1)))  # as written before
    restarted = prepare_checkpoint(request((1, 0)))  # the same query, numbered from the sink
    assert [o["id"] for o in restarted.metadata["operators"]] == [0, 1]
    assert restarted.metadata["operators"][1]["columns"] == ["k"]
    fresh = prepare_checkpoint(dataclasses.replace(request((1, 0)), location=str(tmp_path / "b")))
    assert [o["id"] for o in fresh.metadata["operators"]] == [1, 0]


def test_a_state_schema_spark_refuses_is_left_for_the_first_batch(tmp_path: Path) -> None:
    """A restart whose state key schema changed is refused as Spark refuses it, when the first
    batch runs: the start returns the refusal, and leaves the checkpoint as it was (no
    rescale either)."""
    from sparkstate.runtime.start import StartRequest, prepare_checkpoint

    def request(key: pa.DataType, partitions: int = 2) -> StartRequest:
        op = Deduplicate(pa.schema([("k", key), ("v", pa.int64())]), ["k"])
        ops = [{"id": 0, **op.describe()}]
        location = str(tmp_path)
        return StartRequest(location, None, "memory", None, partitions, "append", ops, False, False)

    assert prepare_checkpoint(request(pa.string())).refusal is None
    metadata = (tmp_path / "sparkstate" / "metadata.json").read_bytes()
    restarted = prepare_checkpoint(request(pa.int64(), partitions=3))
    assert isinstance(restarted.refusal, SchemaMismatchError)
    assert restarted.refusal.condition == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
    assert str(restarted.refusal).startswith(
        "[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] operator 0 (dedup): the key schema changed from "
        "[k: string] to [k: int64]"
    )
    assert restarted.rescale_to is None
    assert (tmp_path / "sparkstate" / "metadata.json").read_bytes() == metadata
    assert prepare_checkpoint(request(pa.string(), partitions=3)).rescale_to == 3
