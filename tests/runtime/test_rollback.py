"""The logs' side of a rolled-back batch: Spark's offsets digest, and forgetting later batches."""

from __future__ import annotations

from pathlib import Path

from sparkstate.files.durable import DurableDir
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.runtime.records import BatchCommit, BatchIntent
from sparkstate.runtime.spark_checkpoint import input_digest


def write_offsets(checkpoint: Path, batch_id: int, timestamp: int, *sources: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    meta = f'{{"batchWatermarkMs":0,"batchTimestampMs":{timestamp},"conf":{{}}}}'
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(["v1", meta, *sources]))


def test_digest_follows_the_sources_not_the_batch_metadata(tmp_path: Path) -> None:
    checkpoint = DurableDir(str(tmp_path))
    write_offsets(tmp_path, 3, 1000, '{"logOffset":3}', '{"tick":5}')
    first = input_digest(checkpoint, 3)
    write_offsets(tmp_path, 3, 2000, '{"logOffset":3}', '{"tick":5}')
    assert input_digest(checkpoint, 3) == first  # Spark ran the same batch again
    write_offsets(tmp_path, 3, 2000, '{"logOffset":4}', '{"tick":5}')
    assert input_digest(checkpoint, 3) not in (first, None)  # planned again, other input
    assert input_digest(checkpoint, 4) is None  # not written


def test_same_input_when_either_side_cannot_tell() -> None:
    intent = BatchIntent(3, 0, 0, input_digest="a")
    assert intent.same_input("a")
    assert not intent.same_input("b")
    assert intent.same_input(None)
    assert BatchIntent(3, 0, 0).same_input("b")  # an intent written before digests
    assert BatchIntent.from_json(intent.to_json()) == intent


def test_roll_back_forgets_the_batch_and_later_ones(tmp_path: Path) -> None:
    log = CheckpointLog(str(tmp_path / "sparkstate"))
    for b in range(5):
        log.write_intent(BatchIntent(b, 0, 0, input_digest=str(b)))
        log.write_commit(BatchCommit(b, 0, {}, "", {}))
    assert log.roll_back(3) == [3, 4]
    assert log.latest_commit() is not None and log.latest_commit().batch_id == 2  # type: ignore[union-attr]
    assert log.read_intent(3) is not None  # replaced by the caller
    assert log.read_intent(4) is None
    assert log.roll_back(3) == []  # after a crash part way, the next run goes on
