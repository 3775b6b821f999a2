"""``sparkstate demo``: the streaming demo (:mod:`.streaming`), or with ``--store-only`` the state
store demo (:mod:`.store`), which needs no Spark."""

from __future__ import annotations

import argparse

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    if args.store_only:
        from sparkstate.demo.store import run_store_demo

        return run_store_demo(args.out, args.batches or 5)
    from sparkstate.demo.streaming import run as run_streaming

    return int(run_streaming(args))
