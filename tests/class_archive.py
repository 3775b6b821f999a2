"""A class-data-sharing archive for the suite's Spark JVMs.

A JVM that starts Spark loads and verifies some ten thousand classes from the jars of the
``pyspark`` package, and goes on loading more as its first queries plan, generate code and run
(a session and its first streaming query: about 12 s of CPU). Java 17 can keep the classes one
run loaded in an archive that later JVMs map instead (``-XX:SharedArchiveFile``): the same
session and query then take about 7 s. The suite starts a JVM per process, per Spark Connect
server and client, and per driver that a test runs in a process of its own.

The archive is written once per machine, Java and PySpark by running :func:`warm_up` (a short
workload of the kinds of query the suite runs) in a JVM started with
``-XX:ArchiveClassesAtExit``, and kept under ``SPARKSTATE_TEST_CACHE`` (default
``~/.cache/sparkstate-tests``). A JVM whose class path does not match the archive's runs without
it; behaviour never depends on it. ``python -m tests.class_archive`` writes it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: How long a JVM may take to write its archive after its Python process has gone.
DUMP_TIMEOUT_S = 120.0
#: How long the tests wait for the archive written in the background (its warm-up may take
#: 600 s, its JVM's dump ``DUMP_TIMEOUT_S``).
BUILD_TIMEOUT_S = 900.0


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "sparkstate-tests"
    return Path(os.environ.get("SPARKSTATE_TEST_CACHE", default))


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def archive_path() -> Path:
    """Where the archive of this Java and these jars is (whether it is there yet or not)."""
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False, timeout=60
    ).stderr
    jars = sorted(p.name for p in (_spark_home() / "jars").glob("*.jar"))
    key = hashlib.sha256("\n".join([java, str(_spark_home()), *jars]).encode()).hexdigest()
    return cache_dir() / f"spark-classes-{key[:16]}.jsa"


#: The process writing the archive in the background (:func:`java_options`), for the tests'
#: processes to wait on (:func:`wait_for_archive`).
BUILDER = "SPARKSTATE_TEST_ARCHIVE_BUILDER"


def _target() -> Path | None:
    """:func:`archive_path`, or ``None`` (and why, on stderr) when it cannot be known."""
    try:
        return archive_path()
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"no class archive for the tests' JVMs: {exc}", file=sys.stderr)
        return None


def java_options(base: str, *, background: bool = False) -> str:
    """``base`` and the archive's options when it exists (or can be written now), else ``base``.

    ``background``: a missing archive is written by a process of its own while the caller goes
    on, its pid in ``BUILDER``; a JVM started before it is there runs without it (the option
    names a file that is not there yet, which the JVM takes as no archive).

    The JVM's own messages about the archive (for instance a class path that does not match)
    are turned off: they would go to the standard output of the process that started Spark."""
    archive = _start_archive(base) if background else ensure_archive(base)
    if archive is None:
        return base
    return f"{base} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


#: This process's background writers of the archive (reaped by :func:`wait_for_archive`).
_BUILDERS: list[subprocess.Popen[bytes]] = []


def _start_archive(base: str) -> Path | None:
    target = _target()
    if target is not None and not target.exists():
        env = {**os.environ, "SPARK_SUBMIT_OPTS": base}
        builder = subprocess.Popen(  # noqa: S603 - this interpreter, this module
            [sys.executable, "-m", "tests.class_archive"],
            cwd=Path(__file__).resolve().parents[1],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        os.environ[BUILDER] = str(builder.pid)
        _BUILDERS.append(builder)
    return target


def wait_for_archive() -> None:
    """Wait for the background writer of the archive, if there is one, to end."""
    for builder in _BUILDERS:
        builder.wait()
    pid = os.environ.get(BUILDER)
    if pid is None:
        return
    _wait_gone(int(pid), BUILD_TIMEOUT_S)  # the archive is there now, or will not be
    del os.environ[BUILDER]


def ensure_archive(base: str) -> Path | None:
    """The archive's path, written first when it is missing; ``None`` when it cannot be written
    (the suite then runs without one, and says why)."""
    target = _target()
    if target is None or target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / "archive.jsa"
        env = dict(os.environ)
        env["SPARK_SUBMIT_OPTS"] = f"{base} -XX:ArchiveClassesAtExit={partial}"
        log = Path(tmp) / "warm-up.log"
        with log.open("w") as out:
            done = subprocess.run(
                [sys.executable, "-m", "tests.class_archive", "--warm-up"],
                cwd=Path(__file__).resolve().parents[1],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=600,
                check=False,
            )
        pid = _jvm_pid(log)
        if done.returncode != 0 or pid is None or not _wait_gone(pid) or not partial.exists():
            tail = log.read_text(errors="replace")[-2000:]
            why = "the warm-up failed"
            print(f"no class archive for the tests' JVMs ({why}):\n{tail}", file=sys.stderr)
            return None
        partial.replace(target)  # atomic: a concurrent run sees the whole archive or none
    return target


def _jvm_pid(log: Path) -> int | None:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("jvm pid "):
            return int(line.split()[-1])
    return None


def _wait_gone(pid: int, timeout_s: float = DUMP_TIMEOUT_S) -> bool:
    """Whether process ``pid`` ended within ``timeout_s`` (a JVM writes the archive as it
    exits)."""
    deadline = time.monotonic() + timeout_s
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (an ended child its parent has not reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def warm_up() -> None:
    """The kinds of query the suite runs, each once, from a file source into ``foreachBatch``:
    Spark's own windowed aggregation and stream-stream join, sparkstate's (one on each
    provider), and ``applyInPandasWithState``."""
    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    import sparkstate as ss
    from sparkstate import functions as SF
    from sparkstate.testing import FileFeed

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName("sparkstate-class-archive")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    print(f"jvm pid {pid}", flush=True)
    schema = "k string, v long, ts timestamp"
    with tempfile.TemporaryDirectory() as tmp:
        feed = FileFeed(Path(tmp) / "in")
        for i in range(2):
            feed.add(
                [
                    {"k": f"k{j % 3}", "v": j, "ts": f"2026-01-01 00:00:{10 * i + j:02d}"}
                    for j in range(6)
                ]
            )

        def run(name: str, query: object, mode: str, provider: str | None = None) -> None:
            writer = query.writeStream.outputMode(mode).foreachBatch(lambda df, _: df.collect())  # type: ignore[attr-defined]
            writer = writer.option("checkpointLocation", f"{tmp}/{name}")
            if provider:
                writer = writer.option("stateStore", provider)
            query = writer.start()  # the default trigger: every supported PySpark takes it
            query.processAllAvailable()
            query.stop()

        def watermarked() -> object:
            return feed.stream(spark, schema).withWatermark("ts", "5 seconds")

        spark_windows = watermarked().groupBy(F.window("ts", "5 seconds"), "k")
        run("agg", spark_windows.agg(F.sum("v")), "append")
        right = feed.stream(spark, schema).select(F.col("k").alias("k2"), F.col("ts").alias("ts2"))
        right = right.withWatermark("ts2", "5 seconds")
        on = F.expr("k = k2 AND ts2 >= ts AND ts2 <= ts + INTERVAL 5 SECONDS")
        run("join", watermarked().join(right, on), "append")
        windows = ss.stream(watermarked()).groupBy(SF.window("ts", "5 seconds"), "k")
        run("ours-agg", windows.agg(SF.sum("v")), "append", "rocksdb")
        run("ours-join", ss.stream(watermarked()).join(right, on), "append", "memory")

        def count(key: tuple[str], frames: object, state: object) -> object:
            total = sum(len(f) for f in frames)  # type: ignore[attr-defined]
            yield pd.DataFrame({"k": [key[0]], "n": [total]})

        grouped = watermarked().groupBy("k")
        counted = grouped.applyInPandasWithState(
            count, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout
        )
        run("pandas-state", counted, "update")
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm-up"]:
        warm_up()
    else:
        print(ensure_archive(os.environ.get("SPARK_SUBMIT_OPTS", "")))
