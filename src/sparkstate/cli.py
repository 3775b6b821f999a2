"""``sparkstate`` command line: ``demo``, ``bench``, ``inspect``, ``report``, ``repartition``,
``export``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

#: What ``sparkstate --help`` says first, as plain text.
DESCRIPTION = (
    "sparkstate's command line: run the demo and the benchmarks, inspect a checkpoint, write a "
    "report of a query's batches, repartition a stopped query's state, export it back to "
    "Spark's own operators."
)

#: bench name -> module with ``run(args) -> int``.
BENCHES = {
    "store": "sparkstate.bench.store",
    "aggregate": "sparkstate.bench.aggregate",
    "arbitrary": "sparkstate.bench.arbitrary",
    "windows": "sparkstate.bench.windows",
    "join": "sparkstate.bench.join",
    "scale": "sparkstate.bench.scale",
    "latency": "sparkstate.bench.latency",
    "live": "sparkstate.bench.live",
    "repartition": "sparkstate.bench.repartition",
    "take-over": "sparkstate.bench.take_over",
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be at least 1, got {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


_WORKLOADS = ("--workloads", {"default": None, "help": "comma-separated subset of workloads"})
_SIZE = "(default: the full size, or the --quick one)"
#: The options of one benchmark only: bench name -> (flag, ``add_argument`` keywords).
BENCH_OPTIONS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "aggregate": [
        ("--rows", {"type": _positive_int, "help": f"input rows per batch {_SIZE}"}),
        ("--keys", {"type": _positive_int, "help": f"distinct keys, key = value %% keys {_SIZE}"}),
        (
            "--batches",
            {"type": _positive_int, "help": f"batches to run, the first a warm-up {_SIZE}"},
        ),
    ],
    "repartition": [
        ("--state-rows", {"type": _positive_int, "help": f"state rows to move {_SIZE}"}),
        (
            "--rows-per-batch",
            {"type": _positive_int, "help": f"new keys per batch while building {_SIZE}"},
        ),
    ],
    "take-over": [
        ("--state-rows", {"type": _positive_int, "help": f"state rows to take over {_SIZE}"}),
        (
            "--rows-per-batch",
            {"type": _positive_int, "help": f"new keys per batch while building {_SIZE}"},
        ),
        (
            "--spark-provider",
            {"choices": ["hdfs", "rocksdb"], "help": "Spark's provider that builds the state"},
        ),
    ],
    "windows": [_WORKLOADS],
    "latency": [
        _WORKLOADS,
        ("--batches", {"type": _positive_int, "help": f"batches per system {_SIZE}"}),
    ],
    "join": [_WORKLOADS],
    "live": [
        ("--keys", {"type": _positive_int, "help": f"distinct keys in the state {_SIZE}"}),
        ("--rows-per-batch", {"type": _positive_int, "help": f"input rows per batch {_SIZE}"}),
        ("--phase-s", {"type": float, "help": f"seconds each phase runs {_SIZE}"}),
    ],
    "scale": [
        ("--plot", {"default": None, "metavar": "OUT.png", "help": "plot the systems' runs"}),
        ("--rows-per-batch", {"type": _positive_int, "help": f"new keys per batch {_SIZE}"}),
        ("--target-rows", {"type": _positive_int, "help": f"state rows to reach {_SIZE}"}),
        ("--time-budget-min", {"type": float, "help": "minutes a system may grow for"}),
        (
            "--memory-budget-mb",
            {
                "type": _positive_int,
                "help": "the JVM's heap and the Python workers' memory for the in-memory "
                "stores (default 2048)",
            },
        ),
        (
            "--store-memory-mb",
            {
                "type": _positive_int,
                "help": "sparkstate's RocksDB memory per executor (default 1024)",
            },
        ),
        (
            "--store-option",
            {
                "action": "append",
                "metavar": "NAME=VALUE",
                "help": "a stateStore option of sparkstate's RocksDB system (repeatable), "
                "e.g. lazy_restore=false",
            },
        ),
    ],
}

REMOTE_HELP = (
    "run through this Spark Connect server (sc://HOST:PORT) instead of a local Spark; "
    "its Python workers must have sparkstate, and the files must be where the server sees them"
)


def _version() -> str:
    """``sparkstate X`` and the PySpark it runs with (found without importing it: slow)."""
    from importlib import metadata

    from sparkstate import __version__

    try:
        pyspark = f"PySpark {metadata.version('pyspark')}"
    except metadata.PackageNotFoundError:
        pyspark = "PySpark not installed"
    return f"sparkstate {__version__} ({pyspark})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkstate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the demo streaming pipeline")
    demo.add_argument("--out", default=None, help="directory for output and checkpoints")
    demo.add_argument("--batches", type=int, default=None, help="number of input batches")
    demo.add_argument("--store-only", action="store_true", help="run the state store demo only")
    demo.add_argument("--remote", default=None, help=REMOTE_HELP)

    bench = sub.add_parser("bench", help="run a benchmark against Spark's built-ins")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quick", action="store_true", help="smaller sizes for a fast run")
    common.add_argument("--json", dest="json_out", default=None, help="write results to this file")
    common.add_argument("--systems", default=None, help="comma-separated subset of systems")
    common.add_argument("--remote", default=None, help=REMOTE_HELP)
    names = bench.add_subparsers(
        dest="name", required=True, metavar="{" + ",".join(sorted(BENCHES)) + "}"
    )
    for name in sorted(BENCHES):
        one = names.add_parser(name, parents=[common])
        for flag, options in BENCH_OPTIONS.get(name, []):
            one.add_argument(flag, **options)

    report = sub.add_parser("report", help="a query's batches on one HTML page")
    report.add_argument("checkpoint", help="the query's checkpointLocation (a path or a URI)")
    report.add_argument(
        "-o",
        "--out",
        default=None,
        help="the page to write (default: sparkstate-report-<checkpoint's name>.html in the "
        "system's temporary directory)",
    )

    inspect = sub.add_parser("inspect", help="a checkpoint's operators, state and last batches")
    inspect.add_argument("checkpoint", help="the query's checkpointLocation (a path or a URI)")
    inspect.add_argument(
        "--key",
        action="append",
        metavar="[COLUMN=]VALUE",
        help="look one key up: a value per key column, by name or in key order (repeat --key)",
    )
    inspect.add_argument("--operator", type=int, default=None, help="operator id (default: first)")
    inspect.add_argument("--store", default=None, help="a state variable (or a column family)")
    inspect.add_argument("--join-side", choices=("left", "right"), default=None)
    inspect.add_argument("--batch", type=int, default=None, help="after this batch (default: last)")
    inspect.add_argument("--json", action="store_true", help="one JSON document, for scripts")

    rescale = sub.add_parser(
        "repartition", help="rescale a stopped query's state to another partition count"
    )
    rescale.add_argument("checkpoint", help="the query's checkpointLocation (a path or a URI)")
    rescale.add_argument(
        "--partitions", type=_positive_int, required=True, help="the new partition count"
    )
    rescale.add_argument(
        "--skip-uncommitted",
        action="store_true",
        help="skip a last batch that did not commit (its input is read again by the next run; "
        "Spark's enforce_exactly_once_sink=False)",
    )
    rescale.add_argument("--master", default=None, help="Spark master URL (default: local[*])")
    rescale.add_argument("--remote", default=None, help=REMOTE_HELP)
    rescale.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    back = sub.add_parser(
        "export",
        help="hand a stopped query's state back to Spark's own operators (run it without "
        "ss.stream from then on)",
    )
    back.add_argument("checkpoint", help="the query's checkpointLocation (a path or a URI)")
    back.add_argument("--master", default=None, help="Spark master URL (default: local[*])")
    back.add_argument("--remote", default=None, help=REMOTE_HELP)
    back.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "repartition":
        from sparkstate.engine.jobs.rescale import run_repartition

        return run_repartition(
            args.checkpoint,
            args.partitions,
            skip_uncommitted=args.skip_uncommitted,
            master=args.master,
            remote=args.remote,
            conf=args.conf,
        )
    if args.command == "export":
        from sparkstate.engine.jobs.export import run_export

        return run_export(args.checkpoint, master=args.master, remote=args.remote, conf=args.conf)
    if getattr(args, "remote", None):
        from sparkstate.engine.spark.session import REMOTE_ENV

        os.environ[REMOTE_ENV] = args.remote  # the benchmarks' child processes read it too
    if args.command == "demo":
        module = importlib.import_module("sparkstate.demo")
        return int(module.run(args))
    if args.command == "bench":
        module = importlib.import_module(BENCHES[args.name])
        return int(module.run(args))
    if args.command == "report":
        from sparkstate.observe.report import run_report

        return run_report(args.checkpoint, args.out)
    if args.command == "inspect":
        from sparkstate.observe.inspect import run_inspect

        return run_inspect(
            args.checkpoint,
            key=args.key,
            operator=args.operator,
            store=args.store,
            join_side=args.join_side,
            batch=args.batch,
            as_json=args.json,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
