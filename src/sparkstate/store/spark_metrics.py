"""Spark's names for what a store did in a batch, and how progress combines them over partitions.

Spark's providers report custom metrics as SQL metrics that the progress sums over a stage's
tasks (counts, sizes and timings alike, timings in whole milliseconds); an *instance* metric
(``SnapshotLastUploaded.partition_<p>_<store>``) is one partition's own, and the progress shows
the few partitions with the lowest values. Our providers report the names of Spark's RocksDB
and HDFS-backed providers where our number means the same thing, in their units; the RocksDB
ones come from the database's statistics (:func:`rocksdb_statistics_metrics`) and from what the
store timed and counted (:class:`VersionPhases`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

__all__ = [
    "HDFS_METRICS",
    "INSTANCE_METRICS",
    "ROCKSDB_METRICS",
    "SNAPSHOT_LAST_UPLOADED",
    "VersionPhases",
    "combine",
    "instance_metric",
    "rocksdb_file_metrics",
    "rocksdb_statistics_metrics",
]

#: The newest snapshot version on durable storage (-1: none), per partition (Spark's instance
#: metric of both providers).
SNAPSHOT_LAST_UPLOADED = "SnapshotLastUploaded"
#: Instance metric prefixes, whose lowest values the progress shows (Spark's ordering).
INSTANCE_METRICS = (SNAPSHOT_LAST_UPLOADED,)
#: How many partitions' instance metrics the progress shows (Spark's default of
#: ``spark.sql.streaming.stateStore.numStateStoreInstanceMetricsToReport``).
INSTANCE_METRICS_TO_REPORT = 5

#: RocksDB tickers (and histogram counts) summed into Spark's count and byte metrics. A get of
#: Spark's is one key of our multi-gets; bytes read are those point lookups returned.
_TICKERS = {
    "rocksdbGetCount": ("rocksdb.db.get.micros.count", "rocksdb.number.multiget.keys.read"),
    "rocksdbReadBlockCacheHitCount": ("rocksdb.block.cache.hit",),
    "rocksdbReadBlockCacheMissCount": ("rocksdb.block.cache.miss",),
    "rocksdbTotalBytesRead": ("rocksdb.bytes.read", "rocksdb.number.multiget.bytes.read"),
    "rocksdbTotalBytesWritten": ("rocksdb.bytes.written",),
    "rocksdbTotalBytesReadThroughIterator": ("rocksdb.db.iter.bytes.read",),
    "rocksdbTotalBytesReadByCompaction": ("rocksdb.compact.read.bytes",),
    "rocksdbTotalBytesWrittenByCompaction": ("rocksdb.compact.write.bytes",),
    "rocksdbTotalBytesWrittenByFlush": ("rocksdb.flush.write.bytes",),
}
#: RocksDB microsecond tickers and histogram sums, as Spark's milliseconds: the total time of
#: the lookups and of the commit's write (Spark: of its gets and puts), of writers stalled, of
#: compactions (background ones included).
_MICROS = {
    "rocksdbGetLatency": ("rocksdb.db.get.micros.sum", "rocksdb.db.multiget.micros.sum"),
    "rocksdbPutLatency": ("rocksdb.db.write.micros.sum",),
    "rocksdbWriterStallLatencyMs": ("rocksdb.stall.micros",),
    "rocksdbTotalCompactionLatencyMs": ("rocksdb.compaction.times.micros.sum",),
}
_FILES = ("rocksdbFilesCopied", "rocksdbBytesCopied", "rocksdbFilesReused")


@dataclasses.dataclass
class VersionPhases:
    """Where one version's load and commit went (milliseconds, and counts), for Spark's names."""

    load_from_snapshot_ms: float = 0.0
    replay_changelog_ms: float = 0.0
    changelogs_replayed: int = 0
    #: Corrupt snapshots the load skipped (Spark reports whether the load repaired one).
    snapshots_skipped: int = 0
    #: The commit's durable write: the changelog (Spark's changelog commit and file sync).
    changelog_ms: float = 0.0
    #: A commit that takes a local checkpoint for a snapshot flushes the memtables first.
    flush_ms: float = 0.0
    checkpoint_ms: float = 0.0
    #: Keys (puts and deletes) the commit wrote to the database.
    puts: int = 0

    def spark_metrics(self, load_ms: float) -> dict[str, float]:
        return {
            "rocksdbLoadLatencyMs": load_ms,
            "rocksdbLoadFromSnapshotLatencyMs": self.load_from_snapshot_ms,
            "rocksdbReplayChangeLogLatencyMs": self.replay_changelog_ms,
            "rocksdbNumReplayChangelogFiles": float(self.changelogs_replayed),
            "rocksdbNumSnapshotsAutoRepaired": float(self.snapshots_skipped > 0),
            "rocksdbPutCount": float(self.puts),
            "rocksdbChangeLogWriterCommitLatencyMs": self.changelog_ms,
            "rocksdbCommitFileSyncLatencyMs": self.changelog_ms,
            "rocksdbCommitFlushLatency": self.flush_ms,
            "rocksdbCommitCheckpointLatency": self.checkpoint_ms,
            "rocksdbCommitCompactLatency": 0.0,  # no compaction at commit (Spark's default)
        }


def rocksdb_statistics_metrics(
    before: Mapping[str, int], after: Mapping[str, int]
) -> dict[str, float]:
    """Spark's names for what RocksDB's statistics counted between two reads of them (none
    when the database keeps no statistics)."""
    if not after:
        return {}

    def counted(names: Iterable[str]) -> int:
        return sum(after.get(n, 0) - before.get(n, 0) for n in names)

    out = {name: float(counted(names)) for name, names in _TICKERS.items()}
    out.update({name: counted(names) / 1000 for name, names in _MICROS.items()})
    return out


def rocksdb_file_metrics(counters: Mapping[str, float]) -> dict[str, float]:
    """Spark's file manager metrics from the provider's counters of a batch: files and bytes
    uploaded or downloaded (copied), SST files a snapshot named without uploading (reused)."""
    return dict(
        zip(
            _FILES,
            (
                counters.get("filesUploaded", 0.0) + counters.get("filesDownloaded", 0.0),
                counters.get("bytesUploaded", 0.0) + counters.get("bytesDownloaded", 0.0),
                counters.get("filesReused", 0.0),
            ),
            strict=True,
        )
    )


#: The Spark names the rocksdb provider reports.
ROCKSDB_METRICS = (
    *_TICKERS,
    *_MICROS,
    *_FILES,
    *VersionPhases().spark_metrics(0.0),
    "rocksdbSstFileSize",
    "rocksdbPinnedBlocksMemoryUsage",
)
#: The Spark names the memory provider reports (those of Spark's HDFS-backed provider).
HDFS_METRICS = (
    "loadedMapCacheHitCount",
    "loadedMapCacheMissCount",
    "stateOnCurrentVersionSizeBytes",
    "numSnapshotsAutoRepaired",
)
#: Milliseconds, shown whole as Spark's.
_TIMINGS = frozenset(n for n in ROCKSDB_METRICS if n.endswith(("Latency", "LatencyMs")))


def instance_metric(prefix: str, partition: int, store_name: str) -> str:
    """The name of one partition's instance metric, as Spark names it."""
    return f"{prefix}.partition_{partition}_{store_name}"


def combine(per_partition: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The custom metrics of an operator's partitions as Spark's progress shows them: summed,
    timings in whole milliseconds, and of each instance metric the partitions with the lowest
    values (:data:`INSTANCE_METRICS_TO_REPORT` of them)."""
    total: dict[str, float] = {}
    for custom in per_partition:
        for name, value in custom.items():
            total[name] = total.get(name, 0) + value
    for prefix in INSTANCE_METRICS:
        named = sorted((v, n) for n, v in total.items() if n.startswith(prefix + "."))
        for _, name in named[INSTANCE_METRICS_TO_REPORT:]:
            del total[name]
    for name in _TIMINGS.intersection(total):
        total[name] = round(total[name])
    return total
