"""Which kind of Spark session a DataFrame belongs to: a classic one (a JVM in this process,
``SparkContext`` and all) or a Spark Connect client's (requests to a server; no ``SparkContext``).

The test is the class's module, not :func:`pyspark.sql.utils.is_remote`, which tells about the
whole process; and it imports nothing of Spark Connect's, whose client needs grpc.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import pickle
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.start import Checkpoint, StartRequest, prepare_checkpoint

__all__ = ["REMOTE_ENV", "command_session", "is_connect", "on_server", "run_on_server"]

#: Where ``sparkstate demo --remote`` and ``bench --remote`` pass on the Spark Connect server.
REMOTE_ENV = "SPARKSTATE_REMOTE"

A = TypeVar("A")
R = TypeVar("R")
RESULT = "result"


def command_session(
    app: str, *, master: str | None = None, remote: str | None = None, conf: Sequence[str] = ()
) -> Any:
    """The Spark session of a ``sparkstate`` command: ``--master`` a cluster's (default: local),
    ``--remote`` a Spark Connect server's, ``--conf KEY=VALUE`` its settings. Spark's own
    progress bar is off: the command draws its own (:func:`sparkstate.console.job_progress`)."""
    from pyspark.sql import SparkSession

    settings = dict(_setting(c) for c in conf)
    if remote:
        builder = SparkSession.builder.remote(remote)
    else:
        builder = SparkSession.builder.master(master or "local[*]")
        builder = builder.appName(app).config("spark.ui.enabled", "false")
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    for k, v in settings.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


@contextlib.contextmanager
def said_once() -> Iterator[None]:
    """While a command runs, what sparkstate's logs say at warning level (a command's result:
    what moved, in how long) printed once, on stdout, as the command's output; not also by
    Python's last-resort handler on stderr."""
    logger = logging.getLogger("sparkstate")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(logging.WARNING)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        msg = f"--conf takes KEY=VALUE, got {text!r}"
        raise ConfigurationError(msg)
    return key, value


def is_connect(df_or_session: Any) -> bool:
    """Whether ``df_or_session`` (a DataFrame or a SparkSession) is Spark Connect's."""
    return type(df_or_session).__module__.startswith("pyspark.sql.connect.")


def run_on_server(spark: Any, func: Callable[[A], R], arg: A) -> R:
    """``func(arg)`` in a Spark task (one task of a one-row job), for work that needs the file
    systems of the server's side; its result, or the error it raised, comes back pickled."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        try:
            outcome: tuple[bool, Any] = (True, func(arg))
        except Exception as exc:  # noqa: BLE001 - raised again on the client's side
            outcome = (False, exc)
        encoded = base64.b64encode(pickle.dumps(outcome)).decode("ascii")
        yield pa.record_batch([pa.array([encoded])], names=[RESULT])

    rows = spark.range(0, 1, 1, 1).mapInArrow(task, f"{RESULT} string").collect()
    ok, value = pickle.loads(base64.b64decode(rows[0][0]))  # noqa: S301 - our own task's result
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def on_server(spark: Any, request: StartRequest) -> Checkpoint:
    """:func:`~sparkstate.runtime.start.prepare_checkpoint` on the server's side."""
    return run_on_server(spark, prepare_checkpoint, request)
