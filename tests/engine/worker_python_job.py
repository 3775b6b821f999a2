"""A driver of its own for ``test_worker_python.py``: for each interpreter setting on the command
line, a fresh local session, one stateful query, and one JSON line on stdout saying what happened.

    python worker_python_job.py SRC WORKDIR SETTING...

A SETTING is ``PYSPARK_PYTHON=<path>`` (the workers run that) or ``unset`` (nothing set; the
workers get SRC through ``spark.executorEnv.PYTHONPATH``). SRC is the sparkstate under test, put on
this driver's ``sys.path`` only: on ``PYTHONPATH`` the workers would inherit it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

src, workdir, settings = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
sys.path.insert(0, src)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import StringType  # noqa: E402

import sparkstate as ss  # noqa: E402
from sparkstate import functions as SF  # noqa: E402


def executable(_: int) -> str:
    return sys.executable


def run(setting: str, root: Path) -> dict[str, Any]:
    builder = (
        SparkSession.builder.master("local[1]")
        .appName("sparkstate-worker-python")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
    )
    if setting == "unset":
        os.environ.pop("PYSPARK_PYTHON", None)
        builder = builder.config("spark.executorEnv.PYTHONPATH", src)
    else:
        name, _, value = setting.partition("=")
        os.environ[name] = value
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    (root / "input").mkdir(parents=True)
    (root / "input" / "0.json").write_text(
        "\n".join(json.dumps({"k": k}) for k in ["a", "b", "a", "c", "a"])
    )
    events = spark.readStream.schema("k string").json(str(root / "input"))
    out: dict[str, Any] = {"setting": setting, "python_exec_before": spark.sparkContext.pythonExec}
    rows: list[tuple[str, int]] = []
    started = time.monotonic()
    try:
        q = (
            ss.stream(events)
            .groupBy("k")
            .agg(SF.count("*").alias("n"))
            .writeStream.outputMode("update")
            .foreachBatch(lambda df, _: rows.extend((r.k, r.n) for r in df.collect()))
            .option("checkpointLocation", str(root / "checkpoint"))
            .option("stateStore", "rocksdb")
            .trigger(availableNow=True)
            .start()
        )
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.update(error_type=type(exc).__name__, error=str(exc))
    else:
        out["start_s"] = time.monotonic() - started
        q.awaitTermination()
        out["rows"] = sorted(rows)
        used = spark.range(1).select(F.udf(executable, StringType(), useArrow=False)(F.lit(0)))
        out["worker_executable"] = used.first()[0]
    out["elapsed_s"] = time.monotonic() - started
    out["python_exec"] = spark.sparkContext.pythonExec
    from sparkstate.engine.spark.python_launch import launched

    out["python_exec_runs"] = launched(spark.sparkContext.pythonExec)
    out["active_queries"] = len(spark.streams.active)
    spark.stop()
    return out


for i, setting in enumerate(settings):
    print(json.dumps(run(setting, workdir / str(i))), flush=True)
