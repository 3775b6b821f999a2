"""Every system of a benchmark in a fresh subprocess of its own, so no JVM, Python worker, cache or
RocksDB instance carries over from one system to the next.

A child runs ``module.measure(system, params)`` and prints its result as one JSON line after
:data:`RESULT_PREFIX`; everything else it prints to stdout is echoed by the parent as progress.
A system whose implementation does not exist yet raises :class:`NotAvailable` and is reported
as ``{"available": false, "reason": ...}`` (and not counted as a failure).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkstate.bench._results import machine_info, print_summary, ratios, write_report

__all__ = [
    "RESULT_PREFIX",
    "BenchSpec",
    "NotAvailable",
    "Workloads",
    "rows_emitted_measured",
    "run_bench",
    "run_child",
    "run_systems",
    "run_workloads",
    "selected_systems",
    "worker_main",
]

RESULT_PREFIX = "@@sparkstate-bench-result "


class NotAvailable(Exception):  # noqa: N818 - a state, not a failure
    """The system cannot run here (its implementation has not landed yet)."""


# --- child side -----------------------------------------------------------------------------------


def worker_main(argv: Sequence[str]) -> int:
    """Child entry: ``<bench module> <system> <params json>``; prints the result line."""
    import importlib

    module_name, system, params_json = argv
    module = importlib.import_module(module_name)
    params = json.loads(params_json)
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        result: dict[str, Any] = module.measure(system, params)
        code = 0
    except NotAvailable as exc:
        result = {"available": False, "reason": str(exc)}
        code = 0
    except Exception as exc:  # reported to the parent, which decides the exit code
        traceback.print_exc()
        result = {"available": True, "error": f"{type(exc).__name__}: {exc}"}
        code = 1
    result["process_s"] = time.perf_counter() - started
    result["loadavg_before"] = list(load_before)
    result["loadavg_after"] = list(os.getloadavg())
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return code


# --- parent side-----------------------------------------------------------------------------------


class BenchSpec:
    """What a benchmark module tells :func:`run_bench`."""

    def __init__(
        self,
        name: str,
        module: str,
        systems: Sequence[str],
        ratio_pairs: Sequence[tuple[str, str]],
        params: dict[str, Any],
        timeout_s: float,
    ) -> None:
        self.name = name
        self.module = module
        self.systems = list(systems)
        self.ratio_pairs = list(ratio_pairs)
        self.params = params
        self.timeout_s = timeout_s


def run_child(spec: BenchSpec, system: str, workdir: str) -> dict[str, Any]:
    """Run ``system`` in a subprocess (``module.measure(system, params)``) with ``workdir`` as
    its work directory; its result, echoing what it prints as it goes."""
    params = {**spec.params, "workdir": workdir, "timeout_s": spec.timeout_s}
    code = (
        "import sys; from sparkstate.bench._processes import worker_main; "
        "sys.exit(worker_main(sys.argv[1:]))"
    )
    cmd = [sys.executable, "-c", code, spec.module, system, json.dumps(params)]
    stderr_path = os.path.join(workdir, "stderr.log")
    result: dict[str, Any] | None = None
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.startswith(RESULT_PREFIX):
                    result = json.loads(line[len(RESULT_PREFIX) :])
                    break  # the last line: a JVM left behind may hold the pipe open
                print(line, end="", flush=True)
            proc.wait(timeout=spec.timeout_s + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            _kill_group(proc.pid)
    if result is None or "error" in result:
        with open(stderr_path) as err:
            tail = err.read()[-4000:]
        print(f"[bench {spec.name}] {system}: stderr tail:\n{tail}", file=sys.stderr, flush=True)
        if result is None:
            result = {"available": True, "error": f"the subprocess exited with {proc.returncode}"}
    return result


def _kill_group(pgid: int) -> None:
    """Kill what is left of a system's process group (a JVM that outlived its driver would
    hold the machine's cores and memory through the next system's run)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def selected_systems(spec: BenchSpec, args: argparse.Namespace) -> list[str] | None:
    """The systems ``--systems`` names (all by default); None (and a message) if one is unknown."""
    systems = args.systems.split(",") if getattr(args, "systems", None) else spec.systems
    unknown = [s for s in systems if s not in spec.systems]
    if unknown:
        print(f"[bench {spec.name}] unknown systems {unknown}; known: {spec.systems}")
        return None
    return systems


def run_systems(spec: BenchSpec, systems: Sequence[str]) -> tuple[dict[str, Any], bool]:
    """Each system in its own subprocess, one after the other: their results, and whether any
    failed (a system that is not available has not failed)."""
    print(f"[bench {spec.name}] {json.dumps(spec.params)}", flush=True)
    results: dict[str, Any] = {}
    failed = False
    for system in systems:
        print(f"[bench {spec.name}] {system} ... (load {os.getloadavg()[0]:.2f})", flush=True)
        workdir = tempfile.mkdtemp(prefix=f"sparkstate-bench-{spec.name}-{system}-")
        try:
            r = run_child(spec, system, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        results[system] = r
        if "error" in r:
            failed = True
            print(f"[bench {spec.name}] {system}: FAILED: {r['error']}", flush=True)
        elif not r.get("available", False):
            print(f"[bench {spec.name}] {system}: not available: {r.get('reason')}", flush=True)
        else:
            print(
                f"[bench {spec.name}] {system}: {r['rows_per_s']:,.0f} rows/s, "
                f"p50 {r['p50_batch_ms']:,.0f} ms, p99 {r['p99_batch_ms']:,.0f} ms",
                flush=True,
            )
    return results, failed


def run_bench(spec: BenchSpec, args: argparse.Namespace) -> int:
    """Run every selected system in its own subprocess; print a table; write the JSON."""
    systems = selected_systems(spec, args)
    if systems is None:
        return 2
    results, failed = run_systems(spec, systems)
    rat = ratios(results, spec.ratio_pairs)
    print_summary(spec.name, results, rat)
    report = {
        "benchmark": spec.name,
        "quick": bool(getattr(args, "quick", False)),
        "params": spec.params,
        "machine": machine_info(),
        "systems": results,
        "ratios": rat,
    }
    write_report(spec.name, args, report)
    return 1 if failed else 0


@dataclasses.dataclass(frozen=True)
class Workloads:
    """A benchmark of several workloads, each run on every system and checked against a model
    (``windows``, ``join``): what :func:`run_workloads` needs of it."""

    #: The benchmark's name (``windows``) and the module its systems run from.
    name: str
    module: str
    systems: Sequence[str]
    ratio_pairs: Sequence[tuple[str, str]]
    #: Seconds a system may take, ``--quick`` and full.
    timeouts: tuple[float, float]
    #: ``check(workload, params, results)``: per system ``ok``, ``problems`` and the count
    #: named by ``measured``; and the model's count under ``expected``.
    check: Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]
    #: Keys of the check's counts, and what they count in the printed verdict.
    measured: str
    expected: str
    counted: str


def rows_emitted_measured(result: Mapping[str, Any], params: Mapping[str, Any]) -> int:
    """The rows a system emitted in the measured batches (after the warm-up ones)."""
    return sum(
        int(rec.get("numOutputRows") or 0)
        for rec in result.get("per_batch", [])
        if params["warmup"] <= int(rec["batchId"]) < params["batches"]
    )


def run_workloads(bench: Workloads, params: dict[str, dict[str, Any]], args: Any) -> int:
    """Run every workload of ``params`` on the selected systems, print and check each, and
    write the report; the exit status (1 when a system failed or disagreed with the model)."""
    quick = bool(getattr(args, "quick", False))
    timeout = bench.timeouts[0] if quick else bench.timeouts[1]
    specs = {
        w: BenchSpec(
            f"{bench.name}-{w}", bench.module, bench.systems, bench.ratio_pairs, p, timeout
        )
        for w, p in params.items()
    }
    systems = selected_systems(next(iter(specs.values())), args)
    if systems is None:
        return 2
    all_results: dict[str, Any] = {}
    all_ratios: dict[str, float] = {}
    checks: dict[str, Any] = {}
    failed = False
    for workload, spec in specs.items():
        results, workload_failed = run_systems(spec, systems)
        failed |= workload_failed
        rat = {f"{workload}:{k}": v for k, v in ratios(results, bench.ratio_pairs).items()}
        print_summary(spec.name, results, rat)
        checks[workload] = bench.check(workload, spec.params, results)
        for system, outcome in checks[workload]["systems"].items():
            verdict = "ok" if outcome["ok"] else "FAILED: " + "; ".join(outcome["problems"][:5])
            print(
                f"[bench {spec.name}] check {system}: {outcome[bench.measured]:,} "
                f"{bench.counted} in the measured batches (model "
                f"{checks[workload][bench.expected]:,}): {verdict}",
                flush=True,
            )
            failed |= not outcome["ok"]
        all_results.update({f"{workload}:{s}": r for s, r in results.items()})
        all_ratios.update(rat)
    if all_ratios:
        print(f"[bench {bench.name}] ratios (throughput, >1: the first is faster):")
        for workload in params:
            for key, value in all_ratios.items():
                if key.startswith(f"{workload}:"):
                    print(f"    {key}: {value:.2f}x")
    report = {
        "benchmark": bench.name,
        "quick": quick,
        "workloads": list(params),
        "params": params,
        "machine": machine_info(),
        "systems": all_results,
        "ratios": all_ratios,
        "checks": checks,
    }
    write_report(bench.name, args, report)
    return 1 if failed else 0
