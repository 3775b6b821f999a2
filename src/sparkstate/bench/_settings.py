"""The benchmarks' Spark settings: every system's session is made the same way."""

from __future__ import annotations

__all__ = [
    "DRIVER_MEMORY",
    "HDFS_PROVIDER",
    "MASTER",
    "PROFILE_ENV",
    "PROVIDER_CONF",
    "RECORDED_CONF",
    "REMOTE_POLL_S",
    "ROCKSDB_PROVIDER",
    "SHUFFLE_PARTITIONS",
    "UDF_PROFILER_CONF",
]

#: Spark's state store providers (class names checked in the pyspark 4.3.0 jars and in
#: apache/spark sql/core/.../execution/streaming/state/).
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"

#: A directory: profile the Python side of every system's tasks and dump the stats there.
PROFILE_ENV = "SPARKSTATE_BENCH_PROFILE"
UDF_PROFILER_CONF = "spark.sql.pyspark.udf.profiler"
MASTER = "local[2]"
REMOTE_POLL_S = 3.0
SHUFFLE_PARTITIONS = 4
DRIVER_MEMORY = "2g"
#: Spark settings recorded in the JSON next to the numbers they produced.
RECORDED_CONF = (
    PROVIDER_CONF,
    "spark.sql.shuffle.partitions",
    "spark.driver.memory",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot",
    "spark.sql.streaming.stateStore.stateSchemaCheck",
    "spark.sql.execution.arrow.maxRecordsPerBatch",
)
