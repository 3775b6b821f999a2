"""``sparkstate`` command line: ``demo``, ``bench``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

#: bench name -> module with ``run(args) -> int``.
BENCHES = {
    "store": "sparkstate.bench.store",
    "aggregate": "sparkstate.bench.aggregate",
    "arbitrary": "sparkstate.bench.arbitrary",
    "windows": "sparkstate.bench.windows",
    "join": "sparkstate.bench.join",
    "scale": "sparkstate.bench.scale",
}


REMOTE_HELP = (
    "run through this Spark Connect server (sc://HOST:PORT) instead of a local Spark; "
    "its Python workers must have sparkstate, and the files must be where the server sees them"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkstate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the demo streaming pipeline")
    demo.add_argument("--out", default=None, help="directory for output and checkpoints")
    demo.add_argument("--batches", type=int, default=None, help="number of input batches")
    demo.add_argument("--store-only", action="store_true", help="run the state store demo only")
    demo.add_argument("--remote", default=None, help=REMOTE_HELP)

    bench = sub.add_parser("bench", help="run a benchmark against Spark's built-ins")
    bench.add_argument("name", choices=sorted(BENCHES))
    bench.add_argument("--quick", action="store_true", help="smaller sizes for a fast run")
    bench.add_argument("--json", dest="json_out", default=None, help="write results to this file")
    bench.add_argument("--systems", default=None, help="comma-separated subset of systems")
    bench.add_argument(
        "--workloads", default=None, help="comma-separated subset of workloads (windows, join)"
    )
    bench.add_argument("--remote", default=None, help=REMOTE_HELP)
    scale = bench.add_argument_group("scale", "options of sparkstate bench scale")
    scale.add_argument("--plot", default=None, metavar="OUT.png", help="plot the systems' runs")
    scale.add_argument("--rows-per-batch", type=int, default=None, help="new keys per batch")
    scale.add_argument("--target-rows", type=int, default=None, help="state rows to reach")
    scale.add_argument(
        "--time-budget-min", type=float, default=None, help="minutes a system may grow for"
    )
    scale.add_argument(
        "--memory-budget-mb",
        type=int,
        default=None,
        help="the JVM's heap and the Python workers' memory for the in-memory stores (2048)",
    )
    scale.add_argument(
        "--store-memory-mb",
        type=int,
        default=None,
        help="sparkstate's RocksDB memory per executor, where the store has that option (1024)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "remote", None):
        from sparkstate.engine.session import REMOTE_ENV

        os.environ[REMOTE_ENV] = args.remote  # the benchmarks' child processes read it too
    if args.command == "demo":
        module = importlib.import_module("sparkstate.demo")
        return int(module.run(args))
    if args.command == "bench":
        module = importlib.import_module(BENCHES[args.name])
        return int(module.run(args))
    return 2


if __name__ == "__main__":
    sys.exit(main())
