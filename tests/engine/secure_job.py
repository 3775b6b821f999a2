"""A driver of its own for ``test_secure_query.py``: the same streaming count in local mode,
first with Spark's security settings off, then (a new ``SparkContext`` in the same JVM) with
``spark.authenticate`` (a secret of its own) and ``spark.network.crypto.enabled`` on; between
batches the state homes' TCP ports are fuzzed with malformed frames.

    python secure_job.py WORKDIR FUZZ_FRAMES

Prints one JSON line: per run, the rows the sink got, which batches ran from the driver (over
the homes' TCP), the fuzz's count, and the modes of the secret's file.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from tests.runtime.home_processes import RunningHome, fuzz

import sparkstate as ss
from sparkstate.observe.live import LiveState
from sparkstate.runtime import home_client
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Credentials
from sparkstate.testing import FileFeed

SECRET = "secure-job-secret-5b0e"
SECURE = {
    "spark.authenticate": "true",
    "spark.authenticate.secret": SECRET,
    "spark.network.crypto.enabled": "true",
}


KEYS = [f"k{i}" for i in range(4)]


def rows(i: int) -> list[dict[str, Any]]:
    return [{"k": f"k{(i + j) % 4}", "v": j} for j in range(5 + i)]


def homes_of(spark: SparkSession) -> list[RunningHome]:
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    directory = home_client.home_dir()
    found = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(f"{pid}-") and name.endswith(".addr"):
            address = Path(directory, name).read_text().strip()
            found.append(RunningHome(None, directory, address, ""))  # type: ignore[arg-type]
    return found


def run(work: Path, tag: str, conf: dict[str, str], frames: int) -> dict[str, Any]:
    builder = SparkSession.builder.master("local[2]").appName(f"sparkstate-secure-{tag}")
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        **conf,
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    feed = FileFeed(work / f"input-{tag}")
    out: list[list[Any]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        out.extend(sorted([batch_id, r.k, r.n] for r in df.collect()))

    feed.add(rows(0))
    counts = ss.stream(feed.stream(spark, "k string, v long")).groupBy("k").count()
    query = (
        counts.withColumnRenamed("count", "n")
        .writeStream.outputMode("update")
        .foreachBatch(collect)
        .option("checkpointLocation", str(work / f"chk-{tag}"))
        .option("stateStore", "rocksdb")
        .start()
    )
    credentials = Credentials(SECRET.encode(), encrypt=True) if conf else NO_CREDENTIALS
    fuzzed = 0
    secret_mode = None
    for i in range(1, 5):
        query.processAllAvailable()
        for home in homes_of(spark):
            fuzzed += sum(fuzz(home, credentials, frames, seed=i).values())
        feed.add(rows(i))
    query.processAllAvailable()
    # What the homes take: the token alone (from the checkpoint), or the secret too.
    homes = homes_of(spark)
    token_only = [home_client.connect_owner(h.address, NO_CREDENTIALS) for h in homes]
    with_secret = [home_client.connect_owner(h.address, credentials) for h in homes]
    for channel in token_only + with_secret:
        if channel is not None:
            channel.close()
    # A live reader with the session's credentials reads from the homes; one with the token
    # alone is refused by secure homes and reads the same from the checkpoint.
    with ss.state(query) as live, LiveState(str(work / f"chk-{tag}")) as bare:
        with_session = live.get_many(KEYS)
        token_alone = bare.get_many(KEYS)
    live_reads = {
        "values": {f.key["k"]: f.value for f in with_session if f.found},
        "sources": sorted({f.source for f in with_session}),
        "token_alone_values": {f.key["k"]: f.value for f in token_alone if f.found},
        "token_alone_sources": sorted({f.source for f in token_alone}),
    }
    progress = [json.loads(p.json) for p in query.recentProgress]
    query.stop()
    if conf:
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
        directory = home_client.home_dir()
        (name,) = [
            n for n in os.listdir(directory) if n.startswith(f"{pid}-") and n.endswith(".secret")
        ]
        secret_mode = oct(stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode))
    spark.stop()
    checkpoint = b"".join(p.read_bytes() for p in (work / f"chk-{tag}").rglob("*") if p.is_file())
    return {
        "rows": out,
        "direct": ["directState" in p["durationMs"] for p in progress if p["numInputRows"]],
        "fuzzed": fuzzed,
        "homes": len(homes),
        "token_only_gets_in": [c is not None for c in token_only],
        "secret_gets_in": [c is not None for c in with_secret],
        "secret_mode": secret_mode,
        "secret_in_checkpoint": SECRET.encode() in checkpoint,
        "live": live_reads,
        "counts": {k: n for _, k, n in out},  # the last count of each key
    }


def main(work: Path, frames: int) -> None:
    report = {
        "plain": run(work, "plain", {}, frames),
        "secure": run(work, "secure", SECURE, frames),
    }
    print("REPORT", json.dumps(report), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
