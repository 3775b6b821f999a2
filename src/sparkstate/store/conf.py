"""Which store (:class:`StoreId`) and how it is kept (:class:`StoreConf`): the settings a provider
is opened with, validated when they are built."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from sparkstate.exceptions import ConfigurationError

__all__ = ["DEFAULT_CF", "StoreConf", "StoreId", "default_local_dir"]

#: The name of a store's default column family (and of an operator's default store).
DEFAULT_CF = "default"


@dataclasses.dataclass(frozen=True)
class StoreId:
    """Names one store: an operator's partition under a checkpoint root (a path or URI)."""

    checkpoint_root: str
    operator_id: int
    partition_id: int
    store_name: str = DEFAULT_CF

    def __str__(self) -> str:
        return (
            f"StateStore[op={self.operator_id}, part={self.partition_id}, "
            f"name={self.store_name}, root={self.checkpoint_root}]"
        )

    @property
    def relative_dir(self) -> str:
        """``state/<op>/<part>[/<store>]`` under the checkpoint root."""
        base = f"state/{self.operator_id}/{self.partition_id}"
        return base if self.store_name == DEFAULT_CF else f"{base}/{self.store_name}"


def default_local_dir() -> str:
    """The executor-level directory for local databases: ``$SPARKSTATE_LOCAL_DIR`` or a temp dir."""
    return os.environ.get("SPARKSTATE_LOCAL_DIR") or os.path.join(
        tempfile.gettempdir(), f"sparkstate-{os.getuid()}"
    )


#: Settings the engine takes from Spark's own, never from a query's options.
_FROM_SPARK = {
    "home_auth": "spark.authenticate",
    "home_encrypt": "spark.network.crypto.enabled or spark.ssl.enabled",
}


@dataclasses.dataclass(frozen=True)
class StoreConf:
    """Settings of a provider. Defaults work out of the box; every field is validated."""

    min_deltas_for_snapshot: int = 10
    min_versions_to_retain: int = 100
    compression: str = "zstd"
    #: Executor-level directory for local databases; empty: resolved where the store opens
    #: (``$SPARKSTATE_LOCAL_DIR`` of the executor, else a temp dir), not where the conf is built.
    local_dir: str = ""
    #: RocksDB provider, one Python worker's RocksDB memory (block cache with the memtables
    #: charged to it) ...
    block_cache_mb: int = 128
    #: ... of which the memtables take at most this much before they are flushed.
    write_buffer_mb: int = 64
    #: RocksDB memory of all Python workers of an executor together (0: ``block_cache_mb`` per
    #: worker); each worker gets ``memory_budget_mb / python_workers``, half of it for memtables.
    memory_budget_mb: int = 0
    #: RocksDB provider: memory of one state home (or Python worker) for copies of whole
    #: partitions' state, read instead of RocksDB while a partition's state fits in what is left
    #: (:mod:`sparkstate.store.rocksdb.value_copy`); 0: none.
    value_copy_mb: int = 64
    #: RocksDB provider: a partition restored from a snapshot whose SST files hold at least
    #: ``lazy_restore_min_mb`` starts at once, reading the keys its batches ask for from the
    #: snapshot's files on durable storage a block at a time, while the whole snapshot downloads
    #: in the background (:mod:`sparkstate.store.rocksdb.lazy`); off, it downloads first.
    lazy_restore: bool = True
    lazy_restore_min_mb: int = 64
    #: Python workers an executor runs at once (its task slots); 0: the engine sets it.
    python_workers: int = 0
    lock_timeout_s: float = 120.0
    #: RocksDB provider: keep a partition's local database open in the worker process after its
    #: task, until another process asks for the partition.
    keep_local_open: bool = True
    #: RocksDB provider: count the rows in state (Spark's ``trackTotalNumberOfRows``); off, a
    #: write needs no read of its key, the store's count is -1 and progress shows 0, as Spark's.
    track_total_rows: bool = True
    #: Run stateful tasks in the executor's state homes (long-lived processes that keep each
    #: partition's state open from batch to batch, :mod:`sparkstate.runtime.home`); off, the
    #: task runs in the Python worker Spark gives it.
    state_home: bool = True
    #: How long a task waits for a word from its state home (output, or the heartbeat a home
    #: sends every quarter of this) before it gives the home up as hung: the task fails, the
    #: home (if on this machine) is killed, and Spark's retry gets a new home.
    home_timeout_s: float = 120.0
    #: A batch of a query whose last batch with data read at most this many rows (Spark's
    #: ``numInputRows``) runs its stateful step from the driver, which sends each partition's
    #: rows to the state home holding it, instead of a Spark stage
    #: (:mod:`sparkstate.engine.run.direct_batch`); 0: never.
    direct_batch_rows: int = 10_000
    #: Spread the state partitions over the executors in proportion to their cores, moving a
    #: partition from an executor that holds more than its share to one that holds less before
    #: a batch (:mod:`sparkstate.engine.run.placement`); off, a partition stays in the home
    #: that holds it for as long as that home can be reached.
    balance_homes: bool = True
    #: State homes take a TCP connection only from a process that proves it knows the
    #: application's secret (Spark's ``spark.authenticate``; :mod:`sparkstate.runtime.
    #: home_channel`). Set by the engine from the session, not by an option.
    home_auth: bool = False
    #: ... and encrypt what goes over it (Spark's ``spark.network.crypto.enabled`` or
    #: ``spark.ssl.enabled``, with ``home_auth``). Set by the engine from the session.
    home_encrypt: bool = False
    num_partitions: int | None = None
    #: Memory provider: how many recent versions to keep in memory.
    max_versions_in_memory: int = 2
    #: A value schema may also widen a field's type across restarts (``int`` to ``long``, ...),
    #: old values read widened: Spark's Avro state encoding (:mod:`sparkstate.store.evolution`).
    value_widening: bool = False

    def __post_init__(self) -> None:
        if self.min_deltas_for_snapshot < 1:
            msg = f"min_deltas_for_snapshot must be >= 1, got {self.min_deltas_for_snapshot}"
            raise ConfigurationError(msg)
        if self.min_versions_to_retain < 1:
            msg = f"min_versions_to_retain must be >= 1, got {self.min_versions_to_retain}"
            raise ConfigurationError(msg)
        if self.compression not in ("zstd", "lz4", "none"):
            msg = f"compression must be 'zstd', 'lz4' or 'none', got {self.compression!r}"
            raise ConfigurationError(msg)
        for name in ("block_cache_mb", "write_buffer_mb"):
            if getattr(self, name) < 1:
                msg = f"{name} must be >= 1 MB, got {getattr(self, name)}"
                raise ConfigurationError(msg)
        if self.home_timeout_s <= 0:
            msg = f"home_timeout_s must be > 0, got {self.home_timeout_s}"
            raise ConfigurationError(msg)
        for name in (
            "memory_budget_mb",
            "python_workers",
            "value_copy_mb",
            "direct_batch_rows",
            "lazy_restore_min_mb",
        ):
            if getattr(self, name) < 0:
                msg = f"{name} must be >= 0, got {getattr(self, name)}"
                raise ConfigurationError(msg)
        if self.home_encrypt and not self.home_auth:
            msg = "home_encrypt needs home_auth (the key comes from the application's secret)"
            raise ConfigurationError(msg)
        if self.num_partitions is not None and self.num_partitions < 1:
            msg = f"num_partitions must be >= 1, got {self.num_partitions}"
            raise ConfigurationError(msg)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> StoreConf:
        """Build from string options (as given to ``.option(...)``); unknown keys are an error."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in options.items():
            if key not in fields:
                msg = f"unknown state store option {key!r}; known: {sorted(fields)}"
                raise ConfigurationError(msg)
            if key in _FROM_SPARK:
                msg = f"state store option {key!r} is not an option: Spark's {_FROM_SPARK[key]}"
                raise ConfigurationError(msg)
            default = fields[key].default
            try:
                if isinstance(default, bool):
                    kwargs[key] = str(raw).lower() in ("1", "true", "yes")
                elif isinstance(default, int) or key == "num_partitions":
                    kwargs[key] = int(raw)
                elif isinstance(default, float):
                    kwargs[key] = float(raw)
                else:
                    kwargs[key] = str(raw)
            except ValueError as exc:
                msg = f"state store option {key}={raw!r} is not a valid value"
                raise ConfigurationError(msg) from exc
        return cls(**kwargs)
