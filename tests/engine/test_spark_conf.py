"""What the store's settings take from the Spark session (no Spark needed: the session's
settings are all these functions read)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkstate.engine.spark.conf import python_workers_per_executor, store_options_from_spark
from sparkstate.exceptions import ConfigurationError
from sparkstate.store.conf import StoreConf


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    @property
    def getAll(self) -> dict[str, str]:  # noqa: N802 - PySpark's name
        return dict(self.values)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = Conf(values)


def session(values: dict[str, str]) -> Session:
    return Session(values)


def test_sparks_state_store_settings_carry_over() -> None:
    spark = session(
        {
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": "5",
            "spark.sql.streaming.minBatchesToRetain": "20",
            "spark.sql.streaming.stateStore.maintenanceInterval": "2min",
            "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
            "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
            "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "1024",
            "spark.sql.streaming.stateStore.rocksdb.lockAcquireTimeoutMs": "30000",
        }
    )
    options = store_options_from_spark(spark)
    maintenance = options.pop("maintenanceIntervalSeconds")
    assert float(maintenance) == 120.0
    conf = StoreConf.from_options(options)
    assert (conf.min_deltas_for_snapshot, conf.min_versions_to_retain) == (5, 20)
    assert conf.track_total_rows is False
    assert conf.memory_budget_mb == 1024 and conf.lock_timeout_s == 30.0


def test_unset_or_unbounded_settings_leave_the_defaults() -> None:
    assert store_options_from_spark(session({})) == {}
    unbounded = {"spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "1024"}
    assert store_options_from_spark(session(unbounded)) == {}
    bad = {"spark.sql.streaming.stateStore.maintenanceInterval": "soon"}
    with pytest.raises(ConfigurationError, match="maintenanceInterval='soon'"):
        store_options_from_spark(session(bad))


@pytest.mark.parametrize(
    ("values", "workers"),
    [
        ({"spark.master": "local[2]"}, 2),
        ({"spark.master": "local"}, 1),
        ({"spark.master": "local[4, 3]"}, 4),
        ({"spark.master": "local[4]", "spark.task.cpus": "2"}, 2),
        ({"spark.master": "local-cluster[2, 3, 1024]"}, 3),
        ({"spark.master": "spark://h:7077", "spark.executor.cores": "6"}, 6),
    ],
)
def test_python_workers_per_executor_are_its_task_slots(
    values: dict[str, str], workers: int
) -> None:
    assert python_workers_per_executor(session(values)) == workers
