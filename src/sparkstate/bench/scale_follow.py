"""Following a running query of ``sparkstate bench scale`` batch by batch, until its state
reaches the target or the run's limits stop it."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkstate.bench._spark import summarize, time_breakdown
from sparkstate.bench.rss import RssSampler
from sparkstate.bench.scale_report import slow_batch_limit
from sparkstate.runtime.progress import progress_as_dict

__all__ = ["batch_record", "completed_batches", "first_line", "follow", "stop_reason"]

#: How often the query's progress is read.
POLL_S = 0.5


def first_line(exc: object) -> str:
    """An error's first line (a Java exception's message, without its stack), kept short."""
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def batch_record(p: Mapping[str, Any], t_s: float, peaks: tuple[float, float]) -> dict[str, Any]:
    """A batch's record for the report and the plot, from its progress, the seconds since the
    run started and the (JVM, workers) memory peaks in MB while it ran."""
    return {
        "batchId": int(p["batchId"]),
        "state_rows": sum(int(op.get("numRowsTotal", 0)) for op in p.get("stateOperators", [])),
        "input_rows": int(p.get("numInputRows", 0)),
        "batch_ms": float(p["durationMs"]["triggerExecution"]),
        "jvm_rss_mb": round(peaks[0], 1),
        "worker_rss_mb": round(peaks[1], 1),
        "t_s": round(t_s, 1),
        "time_ms": time_breakdown(summarize([p], warmup=0)),
    }


def completed_batches(query: Any, seen: set[int]) -> list[dict[str, Any]]:
    """Progress of the batches not seen yet that Spark has finished (with ``sources``: a
    sparkstate handle publishes its own part of a batch's progress first), in batch order."""
    out = []
    for raw in query.recentProgress or []:
        p = progress_as_dict(raw)
        batch = int(p.get("batchId", -1))
        if batch >= 0 and batch not in seen and p.get("sources"):
            seen.add(batch)
            out.append(p)
    return sorted(out, key=lambda p: int(p["batchId"]))


def stop_reason(
    batch_ms: Sequence[float], running_ms: float, workers_mb: float, budget_mb: float, factor: float
) -> str | None:
    """Why an in-memory system stops now, if it does: its Python workers over the memory
    budget, or its last batch, or the one running for ``running_ms``, past ``factor`` times the
    p50 of the early batches before it."""
    if workers_mb > budget_mb:
        return f"the Python workers held {workers_mb:,.0f} MB, over the {budget_mb:,.0f} MB budget"
    done = slow_batch_limit(batch_ms[:-1], factor)
    if done is not None and batch_ms[-1] > done:
        return (
            f"batch {len(batch_ms) - 1} took {batch_ms[-1]:,.0f} ms, over {factor:g}x the early "
            f"p50 ({done / factor:,.0f} ms)"
        )
    running = slow_batch_limit(batch_ms, factor)
    if running is not None and running_ms > running:
        return (
            f"batch {len(batch_ms)} ran for {running_ms:,.0f} ms without finishing, over "
            f"{factor:g}x the early p50 ({running / factor:,.0f} ms)"
        )
    return None


class _ProgressWatch:
    """Reads a query's finished batches and its failure in a daemon thread: a call into a JVM
    that thrashes blocks for as long as it does, and the run's limits are judged on time."""

    def __init__(self, query: Any) -> None:
        self.batches: queue.Queue[dict[str, Any]] = queue.Queue()
        #: Why the query cannot go on, once it cannot; the batches before are queued by then.
        self.failure: str | None = None
        self._query = query
        self._stop = threading.Event()
        threading.Thread(target=self._loop, name="progress-watch", daemon=True).start()

    def _loop(self) -> None:
        seen: set[int] = set()
        while not self._stop.is_set():
            try:
                for p in completed_batches(self._query, seen):
                    self.batches.put(p)
                failure = self._query.exception()
            except Exception as exc:  # noqa: BLE001 - the JVM is gone or not answering
                self.failure = f"Spark stopped answering: {first_line(exc)}"
                return
            if failure is not None:
                self.failure = f"the query failed: {first_line(failure)}"
                return
            self._stop.wait(POLL_S)

    def take(self, timeout_s: float) -> list[dict[str, Any]]:
        """The batches finished since the last call, waiting up to ``timeout_s`` for one."""
        out: list[dict[str, Any]] = []
        with contextlib.suppress(queue.Empty):
            out.append(self.batches.get(timeout=timeout_s))
            while True:
                out.append(self.batches.get_nowait())
        return out

    def stop(self) -> None:
        self._stop.set()


def follow(
    query: Any,
    system: str,
    params: Mapping[str, Any],
    sampler: RssSampler,
    *,
    in_memory: bool,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """Follow the query until its state reaches ``params["target_rows"]``: one record per
    batch, and why it ended early: ``failed`` (a Spark failure; for an ``in_memory`` system,
    :func:`stop_reason`) or ``stopped`` (``params["time_budget_s"]``, in seconds of ``clock``)."""
    records: list[dict[str, Any]] = []
    watch = _ProgressWatch(query)
    started = last = clock()
    try:
        while True:
            failure = watch.failure  # read first: the batches before it are queued by then
            for p in watch.take(0 if failure else POLL_S):
                records.append(batch_record(p, clock() - started, sampler.take_peaks()))
                last = clock()
                r = records[-1]
                print(
                    f"    {system}: batch {r['batchId']}: {r['input_rows']:,} rows in "
                    f"{r['batch_ms']:,.0f} ms, {r['state_rows']:,} state rows, workers "
                    f"{r['worker_rss_mb']:,.0f} MB, JVM {r['jvm_rss_mb']:,.0f} MB",
                    flush=True,
                )
                if r["state_rows"] >= params["target_rows"]:
                    return records, None, None
            if failure:
                return records, failure, None
            now = clock()
            if in_memory:
                reason = stop_reason(
                    [r["batch_ms"] for r in records],
                    (now - last) * 1000,
                    sampler.peak_workers_mb,
                    params["worker_budget_mb"],
                    params["slowdown"],
                )
                if reason:
                    return records, reason, None
            if now - started > params["time_budget_s"]:
                return records, None, f"time budget of {params['time_budget_s']:,.0f} s reached"
    finally:
        watch.stop()
