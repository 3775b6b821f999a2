"""What the per-batch driver is told about its query at ``start()``."""

from __future__ import annotations

import dataclasses
import uuid

from sparkstate.runtime.providers import StoreSettings

__all__ = ["INPUT", "DriverConfig"]

#: The watermark tracker's name of the query's first watermark input.
INPUT = "input"


@dataclasses.dataclass
class DriverConfig:
    query_id: str
    name: str | None
    output_mode: str
    num_partitions: int
    store: StoreSettings
    #: Spark's run id of the query, known once Spark started it (:meth:`BatchDriver.started`).
    run_id: str = ""
    #: The delay of every ``withWatermark`` of the input, in declaration order.
    watermark_delays_ms: tuple[int, ...] = ()
    #: Of a union of watermarked streams: per watermark, the input's column of the event time
    #: it reads (engine/plan/input_times.py), dropped before the stateful steps; empty otherwise.
    input_time_columns: tuple[str, ...] = ()
    #: Whether the query takes the clock source, through which the driver asks for batches.
    clock: bool = False
    #: ``spark.sql.streaming.noDataMicroBatches.enabled``: off, the driver asks for no batch
    #: (timers, timeouts and eviction wait for the next data, as in Spark).
    no_data_batches: bool = True
    watermark_policy: str = "min"
    #: Spark's checkpoint location (its ``offsets/`` say what each batch read); "" for none.
    checkpoint: str = ""
    #: Names this start of the query in files the driver leaves for the client (its failure).
    start_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    #: What the first batch fails with: a state schema change that Spark refuses when it plans
    #: the first batch after a restart (``start()`` found it in the checkpoint's metadata), or
    #: an input Spark's operator refuses when it runs (:attr:`Stage.refusal`).
    refusal: Exception | None = None

    def watermark_inputs(self) -> dict[str, int]:
        """The tracker's inputs: ``input`` for the first watermark (the name checkpoints have
        always used), ``input.<i>`` for more on the same column."""
        return {
            INPUT if i == 0 else f"{INPUT}.{i}": delay
            for i, delay in enumerate(self.watermark_delays_ms)
        }
