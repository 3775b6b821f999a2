"""``sparkstate bench live``: reads of a running query's state, and what they cost the stream.

One query, as a user writes it (``groupBy("key").count()`` over ``rate-micro-batch`` with
``key = value % keys``, update mode, ``noop`` output, the ``rocksdb`` provider, ``local[2]``
with 4 shuffle partitions), runs as fast as it can through four phases of ``--phase-s`` seconds
each:

- ``alone``: no reader;
- ``point``: one reader process (a Python process of its own, as a web service would be) reads
  one random key at a time with ``ss.state(...).get(key)``, as fast as it can;
- ``alone 2``: no reader;
- ``threads``: the reader's :data:`THREADS` threads (a web service's handlers) share one
  ``ss.state(...)`` and each reads one random key at a time with ``get``, as fast as it can:
  the point reads asked at once are answered together;
- ``alone 3``: no reader;
- ``many``: the same reader reads 1,000 random keys at a time with ``get_many``;
- ``alone 4``: no reader;
- ``async``: the reader's :data:`TASKS` asyncio tasks (an async web service's handlers) share
  one ``ss.state(...)`` and each awaits ``aget`` of one random key at a time, as fast as it
  can: the reads awaited at once are answered together;
- ``alone 5``: no reader.

A reader's phase is compared with the phases alone on either side of it (their mean), so that
a stream that still speeds up (its caches, RocksDB's compactions) does not count as the
readers' doing.

For each phase: the stream's throughput (input rows over the summed batch time of the batches
that ran in it, each batch's ``triggerExecution``), and for the readers the keys read a second,
the p50 and p99 of one call, and where the answers came from (a state home, the checkpoint).
Then the query stops and the same point reads run against its checkpoint alone (``--stopped``
line: what a reader without homes pays, each partition loaded once from the durable files).

The machine has 2 cores: the reader, the homes that answer it and the stream share them, so a
reader that reads as fast as it can takes CPU from the stream. The ratios printed are the
stream's throughput with each reader over its throughput alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from sparkstate.bench._spark import machine_info, rate_keys, spark_session, write_report
from sparkstate.runtime.progress import progress_as_dict

__all__ = ["read_for", "run"]

FULL = {"keys": 1_000_000, "rows_per_batch": 100_000, "phase_s": 60.0}
QUICK = {"keys": 100_000, "rows_per_batch": 20_000, "phase_s": 15.0}
#: Keys one ``get_many`` of the ``many`` reader asks for.
MANY = 1000
#: Threads of the ``threads`` reader, each reading one key at a time.
THREADS = 64
#: Tasks of the ``async`` reader, each awaiting one key at a time.
TASKS = 256
PHASES = ["alone", "point", "alone 2", "threads", "alone 3", "many", "alone 4", "async", "alone 5"]
#: Each reader's phase and the phases alone it is compared with.
COMPARED = {
    "point": ("alone", "alone 2"),
    "threads": ("alone 2", "alone 3"),
    "many": ("alone 3", "alone 4"),
    "async": ("alone 4", "alone 5"),
}
READERS = tuple(COMPARED)


def read_for(
    location: str, mode: str, seconds: float, keys: int, *, homes: bool = True
) -> dict[str, Any]:
    """Read random keys of the query at ``location`` for ``seconds``: one at a time (``point``),
    one at a time from each of :data:`THREADS` threads sharing the reader (``threads``),
    :data:`MANY` at a time (``many``), or one at a time from each of :data:`TASKS` asyncio tasks
    sharing the reader (``async``); the keys read a second and the latency of a call.
    ``homes`` False: from the checkpoint alone, as where no home holds the state."""
    from sparkstate.observe.live import LiveState

    connector = None if homes else (lambda address: None)
    with LiveState(location, connector=connector) as live:
        #: Per thread, per call: its time, where its first key was read, the batch, the keys.
        calls: list[list[tuple[float, str, int, int]]] = []
        started = time.perf_counter()

        def reads(seed: int) -> None:
            rng = random.Random(seed)
            mine: list[tuple[float, str, int, int]] = []
            calls.append(mine)
            while time.perf_counter() - started < seconds:
                t0 = time.perf_counter()
                if mode == "many":
                    found = live.get_many([rng.randrange(keys) for _ in range(MANY)])
                else:
                    found = [live.get(rng.randrange(keys))]
                took = time.perf_counter() - t0
                mine.append((took, found[0].source, found[0].batch_id, len(found)))

        async def awaits(seed: int) -> None:
            rng = random.Random(seed)
            mine: list[tuple[float, str, int, int]] = []
            calls.append(mine)
            while time.perf_counter() - started < seconds:
                t0 = time.perf_counter()
                found = await live.aget(rng.randrange(keys))
                mine.append((time.perf_counter() - t0, found.source, found.batch_id, 1))

        async def tasks() -> None:
            await asyncio.gather(*(awaits(seed) for seed in range(TASKS)))

        threads = [
            threading.Thread(target=reads, args=(seed,))
            for seed in range(THREADS if mode == "threads" else 1)
        ]
        if mode == "async":
            threads = [threading.Thread(target=asyncio.run, args=(tasks(),))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
    every = [call for mine in calls for call in mine]
    took = sorted(call[0] for call in every)
    sources: dict[str, int] = {}
    for call in every:
        sources[call[1]] = sources.get(call[1], 0) + 1
    read = sum(call[3] for call in every)
    return {
        "mode": mode,
        "threads": len(threads),
        "tasks": TASKS if mode == "async" else 0,
        "keys_read": read,
        "reads_per_s": read / elapsed,
        "calls": len(took),
        "p50_ms": took[len(took) // 2] * 1000,
        "p99_ms": took[min(len(took) - 1, int(len(took) * 0.99))] * 1000,
        "sources": sources,
        "batches_seen": len({call[2] for call in every}),
    }


def _reader(location: str, mode: str, seconds: float, keys: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "sparkstate.bench.live", "--reader", location, mode]
    command += [str(seconds), str(keys)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _throughput(query: Any, since: int) -> tuple[dict[str, Any], int]:
    """The stream's rows a second over the batches after ``since`` completed now."""
    rows = ms = 0
    last = since
    for raw in query.recentProgress or []:
        p = progress_as_dict(raw)
        batch = int(p.get("batchId", -1))
        if batch <= since or not p.get("sources"):
            continue
        rows += int(p.get("numInputRows", 0))
        ms += int(p.get("durationMs", {}).get("triggerExecution", 0))
        last = max(last, batch)
    return {"batches": last - since, "rows_per_s": rows / ms * 1000 if ms else 0.0}, last


def _last_batch(query: Any) -> int:
    ids = [int(progress_as_dict(p).get("batchId", -1)) for p in query.recentProgress or []]
    return max(ids, default=-1)


def run(args: argparse.Namespace) -> int:
    sizes = dict(QUICK if getattr(args, "quick", False) else FULL)
    for name in sizes:
        if getattr(args, name, None):
            sizes[name] = type(sizes[name])(getattr(args, name))
    keys, rows, phase_s = int(sizes["keys"]), int(sizes["rows_per_batch"]), sizes["phase_s"]
    print(f"[bench live] {keys:,} keys, {rows:,} rows a batch, {phase_s:.0f} s a phase")
    import sparkstate as ss

    spark = spark_session("bench-live")
    workdir = tempfile.mkdtemp(prefix="sparkstate-bench-live-")
    location = os.path.join(workdir, "checkpoint")
    query = (
        ss.stream(rate_keys(spark, rows, keys))
        .groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", location)
        .option("stateStore", "rocksdb")
        .start()
    )
    results: dict[str, Any] = {}
    try:
        # The warm-up: every key in the state, then a phase's time for the batches to settle.
        while _last_batch(query) < max(3, keys // rows + 2):
            time.sleep(0.5)
        time.sleep(phase_s)
        for phase in PHASES:
            since = _last_batch(query)
            reader = None
            if phase in READERS:
                reader = _reader(location, phase, phase_s, keys)
                out, _ = reader.communicate(timeout=phase_s + 300)
                read = json.loads(out.strip().splitlines()[-1])
            else:
                time.sleep(phase_s)
                read = {}
            stream, _ = _throughput(query, since)
            results[phase] = {**stream, **read}
            print(f"[bench live] {phase}: {json.dumps(results[phase])}", flush=True)
    finally:
        query.stop()
    stopped = read_for(location, "point", min(phase_s, 15.0), keys, homes=False)
    results["stopped"] = stopped
    print(f"[bench live] stopped (checkpoint only): {json.dumps(stopped)}", flush=True)
    spark.stop()
    ratios = {}
    for m, (before, after) in COMPARED.items():
        alone = (results[before]["rows_per_s"] + results[after]["rows_per_s"]) / 2
        ratios[f"stream with {m} reads / alone"] = results[m]["rows_per_s"] / alone
    print("[bench live] the stream's throughput with a reader over its throughput alone:")
    for key, value in ratios.items():
        print(f"    {key}: {value:.3f}")
    for m in READERS:
        r = results[m]
        print(
            f"[bench live] {m}: {r['reads_per_s']:,.0f} keys read a second, p50 {r['p50_ms']:.2f}"
            f" ms, p99 {r['p99_ms']:.2f} ms a call, answered by {r['sources']}"
        )
    report = {
        "benchmark": "live",
        "quick": bool(getattr(args, "quick", False)),
        "params": sizes,
        "machine": machine_info(),
        "phases": results,
        "ratios": ratios,
    }
    write_report("live", args, report)
    return 0


def _reader_main(argv: list[str]) -> None:
    location, mode, seconds, keys = argv
    print(json.dumps(read_for(location, mode, float(seconds), int(keys))), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reader"]:
        _reader_main(sys.argv[2:])
