"""Damaged engine logs: each file the engine reads fails, truncated, garbled or of the wrong shape,
with a sparkstate error naming the file, what is wrong and what to do; a lost ``metadata.json``
is not made anew over batches that ran; a damaged ``clock.json`` is a warning only."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkstate.exceptions import CorruptStateFileError, QueryError
from sparkstate.operators.base import OperatorMetrics
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.runtime.records import (
    BatchCommit,
    BatchIntent,
    OperatorCommit,
    StoreReport,
    TaskReport,
)
from sparkstate.runtime.triggers import read_clock

RESTORE = "Restore it from a backup of the checkpoint, or start the query from a new checkpoint"

#: How a file is damaged, and what the error then says is wrong with it.
DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "truncated": (lambda data: data[: len(data) // 2], "is not valid JSON (it ends too early"),
    "garbled": (lambda data: data[:6] + b"\xff\xfe" + data[8:], "is not UTF-8 (byte 0xff"),
    "empty": (lambda data: b"", "is empty"),
}


def damage(path: Path, how: str) -> str:
    """Damage the file at ``path``; returns what the error should say is wrong with it."""
    change, problem = DAMAGE[how]
    path.write_bytes(change(path.read_bytes()))
    return problem


def corrupt(call: Callable[[], object], path: Path, *says: str) -> str:
    """The message of the ``CorruptStateFileError`` that ``call`` raises: it names the file at
    ``path`` and says each of ``says``."""
    with pytest.raises(CorruptStateFileError) as info:
        call()
    message = str(info.value)
    assert f"corrupt state file {path}" in message
    for part in says:
        assert part in message
    return message


@pytest.fixture
def log(tmp_path: Path) -> CheckpointLog:
    """The logs of a checkpoint whose batches 0 and 1 ran."""
    log = CheckpointLog(str(tmp_path))
    log.write_metadata(
        {
            "query_id": "q",
            "num_partitions": 2,
            "provider": "memory",
            "state_location": str(tmp_path),
            "operators": [{"id": 0, "kind": "aggregate"}],
        }
    )
    for b in (0, 1):
        log.write_intent(BatchIntent(b, watermark_ms=0, batch_timestamp_ms=1_000 * b))
        operators = {0: OperatorCommit({0: f"a{b}", 1: f"b{b}"}, num_rows_total=3)}
        log.write_commit(BatchCommit(b, 0, {}, "2026-01-01T00:00:00.000Z", operators))
        log.append_progress({"batchId": b})
    return log


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_metadata_file_is_named(log: CheckpointLog, tmp_path: Path, how: str) -> None:
    path = tmp_path / "metadata.json"
    corrupt(log.read_metadata, path, damage(path, how), RESTORE)


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("kind", ["batches", "commits"])
def test_a_damaged_intent_or_commit_is_named(
    log: CheckpointLog, tmp_path: Path, kind: str, how: str
) -> None:
    path = tmp_path / kind / "1.json"
    problem = damage(path, how)
    read = log.read_intent if kind == "batches" else log.read_commit
    corrupt(lambda: read(1), path, problem, RESTORE)
    if kind == "commits":
        corrupt(log.latest_commit, path, problem)  # what a restart reads first


def test_a_truncated_file_says_where_its_json_ends(log: CheckpointLog, tmp_path: Path) -> None:
    path = tmp_path / "commits" / "1.json"
    path.write_text('{\n  "batch_id": 1,\n')
    corrupt(lambda: log.read_commit(1), path, "truncated?): Expecting property name")
    path.write_text('{\n  "batch_id": 1,\n  "watermark_ms": ')
    corrupt(lambda: log.read_commit(1), path, "truncated?): Expecting value at line 3 column 19")
    path.write_text('{\n  "batch_id": 1,\n  "watermark_ms": ,\n}')
    corrupt(lambda: log.read_commit(1), path, "JSON: Expecting value at line 3 column 19")


@pytest.mark.parametrize(
    ("file", "edit", "says"),
    [
        ("metadata.json", lambda d: d.pop("num_partitions"), "lacks field 'num_partitions'"),
        (
            "metadata.json",
            lambda d: d.update(num_partitions="2"),
            """'num_partitions' is "2", not a JSON int""",
        ),
        ("metadata.json", lambda d: d.update(operators=[1]), "'operators' holds something"),
        ("commits/1.json", lambda d: d.pop("watermark_ms"), "lacks field 'watermark_ms'"),
        ("commits/1.json", lambda d: d["operators"]["0"].clear(), "lacks field 'checkpoint_ids'"),
        ("batches/1.json", lambda d: d.update(batch_id="one"), "wrong type or value (invalid"),
    ],
)
def test_a_file_of_the_wrong_shape_is_named(
    log: CheckpointLog,
    tmp_path: Path,
    file: str,
    edit: Callable[[dict[str, object]], object],
    says: str,
) -> None:
    path = tmp_path / file
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    read = {
        "metadata.json": log.read_metadata,
        "commits/1.json": lambda: log.read_commit(1),
        "batches/1.json": lambda: log.read_intent(1),
    }[file]
    corrupt(read, path, says, RESTORE)
    path.write_text("[1, 2]")
    corrupt(read, path, "holds an array where a JSON object belongs")


@pytest.mark.parametrize("logs", ["commits", "batches"])
def test_a_lost_metadata_file_is_not_made_anew_over_batches_that_ran(
    log: CheckpointLog, tmp_path: Path, logs: str
) -> None:
    """A new ``metadata.json`` might have another partition count than the state was written
    with: a checkpoint with batch logs and no metadata is refused, naming the file."""
    (tmp_path / "metadata.json").unlink()
    if logs == "batches":  # batch 0 ran (its state may be committed), not its commit
        for name in ("commits/0.json", "commits/1.json", "batches/1.json"):
            (tmp_path / name).unlink()
    with pytest.raises(QueryError) as info:
        log.read_metadata()
    message = str(info.value)
    assert f"{tmp_path / 'metadata.json'} is missing" in message
    assert str(tmp_path / logs) in message and RESTORE in message
    assert CheckpointLog(str(tmp_path / "new")).read_metadata() is None  # a new checkpoint


def test_a_damaged_task_report_is_named_and_its_batch_runs_again(
    log: CheckpointLog, tmp_path: Path
) -> None:
    reports = log.new_report_dir(2)
    reports(TaskReport(0, 0, "c2", 3, OperatorMetrics(), StoreReport()))
    (path,) = (tmp_path / "reports" / "2").glob("*/*.json")
    corrupt(reports.read, path, damage(path, "truncated"), "restarting the query runs the batch")
    path.write_text(json.dumps({"op": 0, "partition": 0}))
    corrupt(reports.read, path, "lacks field 'operator'")


def test_a_damaged_progress_line_is_named_and_safe_to_delete(
    log: CheckpointLog, tmp_path: Path
) -> None:
    path = tmp_path / "progress.jsonl"
    assert [p["batchId"] for p in log.read_progress()] == [0, 1]
    with path.open("ab") as f:
        f.write(b'{"batchId": 2, "dur')  # a crash in the middle of an append
    log.append_progress({"batchId": 3})
    corrupt(log.read_progress, path, "(line 3): is not valid JSON:", "delete it to go on")
    path.write_bytes(b'{"batchId": 0}\n\xff\n')
    corrupt(log.read_progress, path, "(line 2): is not UTF-8")


def test_a_damaged_progress_file_on_an_object_store_is_named() -> None:
    """Where nothing can be appended each batch's progress is a file (``mock://``: Arrow's
    in-memory file system, taken for an object store)."""
    log = CheckpointLog("mock:///chk")
    log.append_progress({"batchId": 0})
    log.dir.child("progress").write_atomic("1.json", b'{"batchId": 1, ')
    with pytest.raises(CorruptStateFileError, match=r"mock:///chk/progress/1.json: is not valid"):
        log.read_progress()


@pytest.mark.parametrize("content", [b'{"requested_at_ms": 1', b"\xff", b'{"due_ms": "soon"}'])
def test_a_damaged_clock_is_a_warning_naming_it(
    log: CheckpointLog, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    """``clock.json`` only asks for batches without data: damaged, it is read as no request,
    with one warning however often the clock source reads it."""
    log.write_clock({"requested_at_ms": 5, "due_ms": None})
    assert log.read_clock() == {"requested_at_ms": 5, "due_ms": None}
    (tmp_path / "clock.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="sparkstate.runtime"):
        assert log.read_clock() == {} == read_clock(log.dir)
    (record,) = caplog.records
    assert f"corrupt state file {tmp_path / 'clock.json'}: " in record.getMessage()
    assert "deleting it is safe" in record.getMessage()
    log.write_clock({"requested_at_ms": 7, "due_ms": None})  # after the next batch
    assert log.read_clock() == {"requested_at_ms": 7, "due_ms": None}
