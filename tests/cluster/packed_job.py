"""The job ``test_packed_env.py`` gives to spark-submit, as README's "Running on a cluster" says:
a stateful aggregation with the rocksdb store over the JSON files in ``WORKDIR/input`` (one file
per batch), then a look from inside tasks at where their Python and sparkstate come from. Prints
one JSON line.

    spark-submit ... --archives pyspark_venv.tar.gz#environment packed_job.py WORKDIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

import sparkstate as ss
from sparkstate import functions as SF

started = time.monotonic()
workdir = Path(sys.argv[1])
spark = SparkSession.builder.appName("sparkstate-packed-env").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
times = {"session": time.monotonic() - started}

events = (
    spark.readStream.schema("k string, v long")
    .option("maxFilesPerTrigger", 1)
    .json(str(workdir / "input"))
)
rows: list[list[Any]] = []
q = (
    ss.stream(events)
    .groupBy("k")
    .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
    .writeStream.outputMode("update")
    .foreachBatch(lambda df, b: rows.extend([b, r.k, r.n, r.total] for r in df.collect()))
    .option("checkpointLocation", str(workdir / "checkpoint"))  # every node reaches it
    .option("stateStore", "rocksdb")
    .option("stateStore.local_dir", "sparkstate-local")  # in each executor's working directory
    .trigger(availableNow=True)
    .start()
)
times["started"] = time.monotonic() - started
q.awaitTermination()
times["query"] = time.monotonic() - started


def where(_: int) -> str:
    """Where this task's interpreter and modules come from."""
    import os
    import time

    import pyarrow
    import pyspark
    import rocksdict

    import sparkstate

    time.sleep(0.5)  # so that the tasks spread over the executors
    modules = {m.__name__: m.__file__ for m in (sparkstate, rocksdict, pyarrow, pyspark)}
    return json.dumps({"cwd": os.getcwd(), "executable": sys.executable, "modules": modules})


tasks = spark.range(0, 4, 1, 4).select(F.udf(where, StringType(), useArrow=False)(F.col("id")))
found = [json.loads(r[0]) for r in tasks.collect()]
times["tasks"] = time.monotonic() - started
print(json.dumps({"rows": rows, "tasks": found, "times": times}), flush=True)
spark.stop()
