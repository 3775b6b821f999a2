"""``writeStream`` of a wrapped stream: PySpark's ``DataStreamWriter`` (its sink, partitioning,
options, trigger and name), and ``start()``, which plans the stateful steps, prepares the
checkpoint and starts Spark's query with the batch driver as its ``foreachBatch`` function."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery as SparkStreamingQuery
from pyspark.sql.types import StructType

from sparkstate.engine.api.triggers import check_trigger, checked_trigger
from sparkstate.engine.jobs.migrate import check_migration, migrate
from sparkstate.engine.jobs.rescale import rescale_at_start
from sparkstate.engine.jobs.take_over import take_over
from sparkstate.engine.plan.carried_time import EVENT_TIME_CARRIER
from sparkstate.engine.plan.chain import plan_stages
from sparkstate.engine.plan.input_times import input_time_column
from sparkstate.engine.plan.stage import Stage, StatelessStep, Step
from sparkstate.engine.run.driver import BatchDriver, BatchRelay, DriverConfig
from sparkstate.engine.run.query import StreamingQuery, notify_progress, release_if_finished
from sparkstate.engine.run.sinks import (
    FILE_FORMATS,
    FOREACH,
    FOREACH_BATCH,
    check_output_mode,
    check_partitioning,
    foreach_rows,
    make_sink,
)
from sparkstate.engine.run.table_sink import default_source, table_sink
from sparkstate.engine.spark.clock import with_clock
from sparkstate.engine.spark.conf import python_workers_per_executor, store_options_from_spark
from sparkstate.engine.spark.errors import SparkIllegalArgumentError
from sparkstate.engine.spark.security import prepare_homes, with_home_security
from sparkstate.engine.spark.session import is_connect, on_server
from sparkstate.engine.spark.versions import require
from sparkstate.engine.spark.workers import check_workers
from sparkstate.exceptions import ConfigurationError
from sparkstate.files.durable import canonical_location
from sparkstate.operators.aggregation.aggregate import StreamingAggregate
from sparkstate.operators.base import OUTPUT_MODES
from sparkstate.operators.dedup import Deduplicate
from sparkstate.runtime.logs import CheckpointLock, CheckpointLog
from sparkstate.runtime.metadata import check_checkpoint_location, check_num_partitions
from sparkstate.runtime.providers import StoreSettings
from sparkstate.runtime.start import (
    Checkpoint,
    StartRequest,
    engine_root_of,
    prepare_checkpoint,
)
from sparkstate.runtime.watermark import WatermarkSpec
from sparkstate.store.base import StoreConf
from sparkstate.store.registry import provider_class, provider_name

__all__ = ["DataStreamWriter", "needs_clock"]

DEFAULT_PROVIDER = "memory"
_ENGINE_OPTIONS = {"checkpointLocation", "stateLocation", "stateStore", "numPartitions"}
#: The option that migrates the state of a query whose state schemas changed: ``"auto"`` or a
#: function (:mod:`sparkstate.engine.jobs.migrate`).
MIGRATION_OPTION = "stateMigration"
_STORE_PREFIX = "stateStore."
_MAINTENANCE = "stateStore.maintenanceIntervalSeconds"
#: Whether Spark's analyzer tells names apart by case.
CASE_SENSITIVE = "spark.sql.caseSensitive"
#: Spark's switch for the no-data batches stateful operators ask for (read at start, as Spark).
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def _conf_flag(spark: Any, name: str, *, default: bool) -> bool:
    value = spark.conf.get(name, None)
    return default if value is None else str(value).strip().lower() == "true"


def needs_clock(stages: list[Stage], *, legacy: bool = False) -> bool:
    """Whether the query takes the clock source (engine/spark/clock.py): an operator needs batches
    without data. ``legacy``: the rule of checkpoints written before aggregation and
    deduplication asked for Spark's no-data batches after a watermark move; their Spark
    checkpoint has no clock source, and a source cannot be added to a Spark checkpoint, so they
    keep running without those batches."""
    return any(
        s.operator.time_trigger()
        and not (legacy and isinstance(s.operator, StreamingAggregate | Deduplicate))
        for s in stages
    )


class WrittenStream(Protocol):
    """What ``writeStream`` reads of the stream it writes
    (:class:`~sparkstate.engine.api.stream.StatefulStream`)."""

    @property
    def df(self) -> DataFrame: ...

    @property
    def steps(self) -> tuple[Step, ...]: ...

    @property
    def watermarks(self) -> tuple[WatermarkSpec, ...]: ...

    @property
    def timed(self) -> DataFrame | None: ...

    @property
    def own_times(self) -> bool: ...

    @property
    def input_times(self) -> DataFrame | None: ...

    @property
    def watermark(self) -> WatermarkSpec | None: ...

    @property
    def schema(self) -> StructType: ...

    @property
    def columns(self) -> list[str]: ...

    @property
    def _output(self) -> DataFrame: ...

    def _with_watermarks(self) -> DataFrame: ...


class DataStreamWriter:
    """``writeStream``: PySpark's ``DataStreamWriter`` (output mode, sink, partitioning,
    options, trigger, name), then ``start()`` or ``toTable()``. The sink is the last of
    ``format``, ``foreach`` and ``foreachBatch`` chosen, as in Spark; without any, the session's
    default source (``spark.sql.sources.default``, Parquet), as in Spark."""

    def __init__(self, stream: WrittenStream) -> None:
        self._stream = stream
        self._mode = "append"
        self._format: str | None = None
        self._options: dict[str, str] = {}
        #: ``stateMigration``: ``"auto"`` or a function (None: a changed state is refused).
        self._migration: Any = None
        self._trigger: dict[str, Any] = {}
        self._name: str | None = None
        #: What a ``foreach`` or ``foreachBatch`` sink calls with each batch.
        self._batch_function: Callable[[DataFrame, int], Any] | None = None
        self._partition_by: tuple[str, ...] = ()
        self._cluster_by: tuple[str, ...] = ()
        self._table: str | None = None
        #: ``foreach``'s own argument, for a query Spark runs itself (no stateful step).
        self._foreach: Any = None

    def outputMode(self, outputMode: str) -> DataStreamWriter:  # noqa: N802,N803
        mode = outputMode.lower()
        if mode not in OUTPUT_MODES:
            msg = (
                f"Invalid streaming output mode: {outputMode}. Accepted output modes are "
                "'Append', 'Complete', 'Update'."
            )
            parameters = {"outputMode": outputMode}
            raise SparkIllegalArgumentError(msg, "STREAMING_OUTPUT_MODE.INVALID", parameters)
        self._mode = mode
        return self

    def format(self, source: str) -> DataStreamWriter:
        self._format = source.lower()
        return self

    def option(self, key: str, value: Any) -> DataStreamWriter:
        if key == MIGRATION_OPTION:  # a function is kept as it is: it runs in the tasks
            check_migration(value)
            self._migration = value
            return self
        self._options[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def options(self, **options: Any) -> DataStreamWriter:
        for k, v in options.items():
            self.option(k, v)
        return self

    def partitionBy(self, *cols: Any) -> DataStreamWriter:  # noqa: N802 - PySpark's name
        """A file sink's files under ``<column>=<value>/`` directories, as Spark lays them out
        (names or one list of them)."""
        if len(cols) == 1 and isinstance(cols[0], list | tuple):
            cols = tuple(cols[0])
        self._partition_by = tuple(cols)
        return self

    def clusterBy(self, *cols: Any) -> DataStreamWriter:  # noqa: N802 - PySpark's name
        """The clustering columns of the table ``toTable`` creates; a sink's files are laid out
        as without them, as Spark's file sinks lay theirs out."""
        if len(cols) == 1 and isinstance(cols[0], list | tuple):
            cols = tuple(cols[0])
        self._cluster_by = tuple(cols)
        return self

    def trigger(
        self,
        *,
        processingTime: str | None = None,  # noqa: N803 - PySpark's names
        once: bool | None = None,
        continuous: str | None = None,
        availableNow: bool | None = None,  # noqa: N803
        realTime: str | None = None,  # noqa: N803
    ) -> DataStreamWriter:
        """As ``DataStreamWriter.trigger``, checked by it (exactly one, a valid interval);
        ``continuous`` and ``realTime`` are refused at ``start()`` (engine/api/triggers.py)."""
        self._trigger = checked_trigger(
            self._stream.df,
            processingTime=processingTime,
            once=once,
            continuous=continuous,
            availableNow=availableNow,
            realTime=realTime,
        )
        return self

    def queryName(self, queryName: str) -> DataStreamWriter:  # noqa: N802,N803
        self._stream.df.writeStream.queryName(queryName)  # PySpark's check: a non-empty string
        self._name = queryName
        return self

    def foreachBatch(self, func: Callable[[DataFrame, int], Any]) -> DataStreamWriter:  # noqa: N802
        self._format, self._batch_function = FOREACH_BATCH, func
        return self

    def foreach(self, f: Any) -> DataStreamWriter:
        """Each output row to ``f``: a function of a row, or an object with ``process(row)``
        and optionally ``open(partition_id, epoch_id)`` and ``close(error)``, checked and called
        as Spark's ``foreach`` calls them, the batch id the epoch (a classic session's only)."""
        if is_connect(self._stream.df):
            msg = (
                "foreach() from a Spark Connect client is not supported yet: use "
                "foreachBatch(fn) and handle the batch's rows in fn"
            )
            raise ConfigurationError(msg)
        self._format, self._batch_function = FOREACH, foreach_rows(f)
        self._foreach = f
        return self

    def _given(
        self,
        fmt: str | None,
        output_mode: str | None,
        partition_by: str | list[str] | None,
        query_name: str | None,
        options: dict[str, Any],
    ) -> None:
        """``start()``'s and ``toTable()``'s keyword arguments, given to the methods of their
        names in PySpark's order."""
        self.options(**options)
        if output_mode is not None:
            self.outputMode(output_mode)
        if partition_by is not None:
            self.partitionBy(partition_by)
        if fmt is not None:
            self.format(fmt)
        if query_name is not None:
            self.queryName(query_name)

    def toTable(  # noqa: N802 - PySpark's name
        self,
        tableName: str,  # noqa: N803
        format: str | None = None,  # noqa: A002 - PySpark's name
        outputMode: str | None = None,  # noqa: N803
        partitionBy: str | list[str] | None = None,  # noqa: N803
        queryName: str | None = None,  # noqa: N803
        **options: Any,
    ) -> StreamingQuery | SparkStreamingQuery:
        """Start the query into table ``tableName``, created as Spark's ``toTable`` creates it
        if it is missing (engine/run/table_sink.py): a table of a file format, its files written
        by the exactly-once file sink at its location."""
        self._given(format, outputMode, partitionBy, queryName, options)
        self._table = tableName
        return self.start()

    # --- start -----------------------------------------------------------------------------------

    def start(
        self,
        path: str | None = None,
        format: str | None = None,  # noqa: A002 - PySpark's name
        outputMode: str | None = None,  # noqa: N803
        partitionBy: str | list[str] | None = None,  # noqa: N803
        queryName: str | None = None,  # noqa: N803
        **options: Any,
    ) -> StreamingQuery | SparkStreamingQuery:
        """Start the query, as ``DataStreamWriter.start``: the keyword arguments do what the
        methods of their names do (a query without a stateful step is Spark's own, and so is
        its ``StreamingQuery``). Spark's refusals of the sink, its partitioning, the output
        mode and the trigger come first, before the checkpoint is touched."""
        self._given(format, outputMode, partitionBy, queryName, options)
        if path is not None:
            self._options["path"] = path
        if not self._stream.steps:
            return self._start_stateless()
        df, event_time = self._input()
        spark = df.sparkSession
        if self._stream.own_times and self._stream.input_times is None:
            msg = (
                "a union of streams with a watermark (or watermarks on two columns), then a "
                "step that cannot carry each watermark's event time beside the rows (each "
                "watermark reads its own, as in Spark); write that step after the stateful ones"
            )
            raise ConfigurationError(msg)
        self._format = self._format or default_source(spark)
        if self._table is not None:
            self._options["path"] = table_sink(
                spark,
                self._table,
                self._format,
                self._stream.schema,
                self._options.get("path"),
                partition_by=self._partition_by,
                cluster_by=self._cluster_by,
            )
        if self._partition_by:
            self._partition_by = check_partitioning(
                self._format,
                self._partition_by,
                self._stream.columns,
                case_sensitive=_conf_flag(spark, CASE_SENSITIVE, default=False),
            )
        if self._format in FILE_FORMATS and not self._options.get("path"):
            msg = "'path' is not specified. (A file sink writes to .start(path) or option('path'))"
            raise SparkIllegalArgumentError(msg, "_LEGACY_ERROR_TEMP_2047", {})
        check_output_mode(self._format, self._mode)  # Spark asks the sink before the query
        check_trigger(self._trigger, self._format, lambda: self._stream._output, self._mode)  # noqa: SLF001
        wm = self._stream.watermark
        stages = plan_stages(
            df,
            self._stream.steps,
            self._mode,
            event_time,
            wm.delay_ms if wm else None,
        )
        opts = dict(self._options)
        check_num_partitions(opts.get("numPartitions"))
        provider_spec = opts.get("stateStore", DEFAULT_PROVIDER)
        provider = provider_name(provider_class(provider_spec))
        self._store_conf(spark)  # bad options fail before the checkpoint is touched
        clock = needs_clock(stages)
        if clock and self._trigger.get("availableNow"):  # engine/spark/clock.py: Python sources
            require(  # take availableNow from 4.2
                (4, 2),
                "trigger(availableNow=True) on a query that runs batches without data "
                "(a watermark, timeouts, timers)",
                instead="On it, use a processingTime trigger and stop the query once it has "
                "caught up (processAllAvailable)",
            )
        request = StartRequest(
            location=self._checkpoint_location(spark),
            state_location=opts.get("stateLocation"),
            provider=provider,
            requested_partitions=opts.get("numPartitions"),
            default_partitions=int(spark.conf.get("spark.sql.shuffle.partitions") or 200),
            output_mode=self._mode,
            operators=[{"id": s.op_id, **s.operator.describe()} for s in stages],
            clock=clock,
            legacy_clock=needs_clock(stages, legacy=True),
            migrate=self._migration is not None,
        )
        if is_connect(spark):  # the client may not see the checkpoint: the server's side does
            check_workers(spark, provider_spec)
            prepared = on_server(spark, request)
            if prepared.take_over is not None:  # a checkpoint of Spark's own operators
                take_over(spark, prepared.take_over, stages)
                prepared = on_server(spark, request)
            if prepared.migration is not None:  # the state schemas changed: a migration
                migrate(spark, prepared.migration, stages, self._migration)
                prepared = on_server(spark, request)
            if prepared.rescale_to is not None:
                rescale_at_start(spark, prepared.location, prepared.rescale_to)
                prepared = on_server(spark, request)
            return self._start_spark(df, stages, provider_spec, prepared, None)
        checkpoint = canonical_location(request.location)
        check_checkpoint_location(checkpoint)
        engine_root = engine_root_of(checkpoint)
        release_if_finished(engine_root)
        lock = CheckpointLock(engine_root)
        lock.acquire()
        try:
            check_workers(spark, provider_spec)
            prepared = prepare_checkpoint(request)
            if prepared.take_over is not None:  # a checkpoint of Spark's own operators
                take_over(spark, prepared.take_over, stages)
                prepared = prepare_checkpoint(request)
            if prepared.migration is not None:  # the state schemas changed: a migration
                migrate(spark, prepared.migration, stages, self._migration)
                prepared = prepare_checkpoint(request)
            if prepared.rescale_to is not None:  # the query asks for another partition count
                rescale_at_start(spark, prepared.location, prepared.rescale_to)
                prepared = prepare_checkpoint(request)
            return self._start_spark(df, stages, provider_spec, prepared, lock)
        except BaseException:
            lock.release(undo=True)
            raise

    def _start_stateless(self) -> SparkStreamingQuery:
        """A query without a stateful step (a stream-static join, a projection) keeps nothing
        in state: Spark runs it as written, with this writer's settings, and its query is
        Spark's own."""
        df = self._stream._with_watermarks()  # noqa: SLF001 - the stream's input, as Spark's
        writer = df.writeStream.outputMode(self._mode)
        writer = writer.options(
            **{
                k: v
                for k, v in self._options.items()
                if k == "checkpointLocation"
                or (k not in _ENGINE_OPTIONS and not k.startswith(_STORE_PREFIX))
            }
        )
        if self._format == FOREACH_BATCH and self._batch_function is not None:
            writer = writer.foreachBatch(self._batch_function)
        elif self._format == FOREACH:
            writer = writer.foreach(self._foreach)
        elif self._format is not None:
            writer = writer.format(self._format)
        if self._partition_by:
            writer = writer.partitionBy(*self._partition_by)
        if self._cluster_by:
            writer = writer.clusterBy(*self._cluster_by)
        if self._name is not None:
            writer = writer.queryName(self._name)
        if self._trigger:
            writer = writer.trigger(**self._trigger)
        return writer.toTable(self._table) if self._table is not None else writer.start()

    def _input(self) -> tuple[DataFrame, str | None]:
        """The DataFrame the query runs, and its event-time column: an aggregation whose input
        dropped the watermark's column reads the event time from :data:`EVENT_TIME_CARRIER`."""
        stream = self._stream
        wm = stream.watermark
        first = next((s for s in stream.steps if not isinstance(s, StatelessStep)), None)
        if stream.timed is not None and first is not None and first.is_aggregation:
            return stream.timed, EVENT_TIME_CARRIER
        return stream.df, wm.column if wm else None

    def _store_conf(self, spark: Any) -> tuple[StoreConf, float]:
        """The store's options (``stateStore.*``, over Spark's own state store settings of the
        session) with the session's security settings, checked; the maintenance interval."""
        from_spark = store_options_from_spark(spark)
        opts = {
            **{_STORE_PREFIX + k: v for k, v in from_spark.items()},
            **self._options,
        }
        store_opts = {
            k[len(_STORE_PREFIX) :]: v
            for k, v in opts.items()
            if k.startswith(_STORE_PREFIX) and k != _MAINTENANCE
        }
        conf = with_home_security(spark, StoreConf.from_options(store_opts))
        return conf, float(opts.get(_MAINTENANCE, "30"))

    def _checkpoint_location(self, spark: Any) -> str:
        chk = self._options.get("checkpointLocation")
        if not chk:
            base = spark.conf.get("spark.sql.streaming.checkpointLocation", None)
            if base and self._name:
                chk = f"{base.rstrip('/')}/{self._name}"
        if not chk:
            msg = (
                "a stateful query needs a checkpoint: .option('checkpointLocation', dir) "
                "(or set spark.sql.streaming.checkpointLocation and a queryName)"
            )
            raise ConfigurationError(msg)
        return chk

    def _start_spark(
        self,
        df: DataFrame,
        stages: list[Stage],
        provider_spec: str,
        checkpoint: Checkpoint,
        lock: CheckpointLock | None,
    ) -> StreamingQuery:
        """Start Spark's query with the driver as its ``foreachBatch`` function; ``lock`` None:
        the driver locks the checkpoint from the process it runs in (Spark Connect)."""
        spark = df.sparkSession
        opts = dict(self._options)
        metadata = checkpoint.metadata
        for stage, recorded in zip(stages, metadata["operators"], strict=True):
            stage.op_id = int(recorded["id"])  # a checkpoint's own numbering (legacy ones)
        conf, maintenance_s = self._store_conf(spark)
        num_partitions = int(metadata["num_partitions"])
        conf = dataclasses.replace(
            conf,
            num_partitions=num_partitions,
            python_workers=conf.python_workers or python_workers_per_executor(spark),
        )
        if conf.state_home and conf.home_auth:
            if is_connect(spark):
                msg = (
                    "spark.authenticate is on: a Spark Connect client cannot hand the "
                    "application's secret to the state homes; set the query's option "
                    "stateStore.state_home to false, or run it from a classic session"
                )
                raise ConfigurationError(msg)
            prepare_homes(spark, conf)
        store = StoreSettings(checkpoint.state_root, provider_spec, conf, maintenance_s)
        sink_opts = {
            k: v
            for k, v in opts.items()
            if k not in _ENGINE_OPTIONS and not k.startswith(_STORE_PREFIX)
        }
        assert self._format is not None  # chosen at start
        sink = make_sink(
            self._format, sink_opts, spark, self._name, self._batch_function, self._partition_by
        )
        config = DriverConfig(
            query_id=checkpoint.query_id,
            name=self._name,
            output_mode=self._mode,
            num_partitions=num_partitions,
            store=store,
            watermark_delays_ms=tuple(w.delay_ms for w in self._stream.watermarks),
            input_time_columns=tuple(
                input_time_column(i) for i in range(len(self._stream.watermarks))
            )
            if self._stream.own_times
            else (),
            clock=bool(metadata.get("clock")),  # absent: an older checkpoint, its restart refused
            no_data_batches=_conf_flag(spark, NO_DATA_BATCHES, default=True),
            watermark_policy=str(
                spark.conf.get("spark.sql.streaming.multipleWatermarkPolicy", "min")
            ).lower(),
            checkpoint=checkpoint.location,
            refusal=checkpoint.refusal or next((s.refusal for s in stages if s.refusal), None),
        )
        log_ = CheckpointLog(checkpoint.engine_root)
        if self._stream.own_times:  # each input's event time beside the rows, for the driver
            assert self._stream.input_times is not None  # checked at start()
            df = self._stream.input_times
        driver = BatchDriver(config, stages, sink, log_, notify_progress, remote=lock is None)
        if config.clock:
            df = with_clock(df, checkpoint.engine_root, checkpoint.location)  # no-data batches
        relay = BatchRelay(driver)
        writer = df.writeStream.foreachBatch(relay)
        writer = writer.option("checkpointLocation", checkpoint.location)
        if self._name:
            writer = writer.queryName(self._name)
        if self._trigger:
            writer = writer.trigger(**self._trigger)
        spark_query = writer.start()
        handle = StreamingQuery(spark_query, driver, lock, sink, stages, log_, relay)
        handle.sparkSession = spark
        # The first batch goes on from here.
        driver.started(str(spark_query.runId), getattr(spark_query, "_jsq", None))
        return handle
