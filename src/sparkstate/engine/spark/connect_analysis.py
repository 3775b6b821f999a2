"""Planning a stream-stream join from a Spark Connect client: Spark's own analysis, in a local JVM.

A join is planned from Spark's analyzed plan of ``left.join(right, on, how)``
(:mod:`sparkstate.engine.plan.join.plan`). A Connect client has no JVM to ask, and the server
answers no question that gives the plan back as objects. So the client starts a small JVM of its own
(the one PySpark's wheel ships, once per process, without a ``SparkContext`` in Python) and has
Spark analyze the same join there over stand-ins of both sides: streams of no rows with each
side's columns, types and metadata (the watermarks' delays among them) and the side's alias.
The user's condition comes along as SQL; a Column of the client is written out as SQL first.

What the planner takes from that plan is SQL over each side's columns, which the client then
applies to the real sides over Connect, so nothing of the stand-ins reaches the query.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame

from sparkstate.exceptions import ConfigurationError

__all__ = ["ConnectJoin", "connect_stateful_step", "stand_in_aggregate", "stand_in_join"]

#: The session settings that change how Spark analyses a join, copied from the user's session.
_ANALYSIS_CONF = (
    "spark.sql.caseSensitive",
    "spark.sql.ansi.enabled",
    "spark.sql.session.timeZone",
    "spark.sql.storeAssignmentPolicy",
)
#: The qualifier of a stand-in side whose user gave it no alias (kept out of the SQL handed back).
_SIDE_ALIAS = {"left": "__ss_join_left", "right": "__ss_join_right"}
#: Connect's names of binary operators, as SQL writes them.
_INFIX = {
    "==": "=",
    "<=>": "<=>",
    "!=": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
    "and": "AND",
    "or": "OR",
    "+": "+",
    "-": "-",
    "*": "*",
    "/": "/",
    "%": "%",
    "&": "&",
    "|": "|",
    "^": "^",
}
#: Spark's logical plan nodes of stateful operators as a Connect client's plan names them.
_CONNECT_STATEFUL = {
    "Aggregate": "Aggregate",
    "Deduplicate": "Deduplicate",
    "Join": "Join",
    "ApplyInPandasWithState": "FlatMapGroupsInPandasWithState",
    "TransformWithStateInPandas": "TransformWithStateInPySpark",
    "TransformWithStateInPySpark": "TransformWithStateInPySpark",
    "Limit": "GlobalLimit",
}

_lock = threading.Lock()


class ConnectJoin:
    """Spark's analysis of a join of two Connect DataFrames, made over stand-ins in a local JVM.

    ``plan`` is the analyzed plan (JVM objects), ``jvm`` the JVM's view; :meth:`sql` is an
    expression of that plan as SQL over the real sides' columns."""

    def __init__(self, plan: Any, jvm: Any, qualifiers: tuple[str, ...]) -> None:
        self.plan = plan
        self.jvm = jvm
        self._qualifiers = qualifiers

    def sql(self, expr: Any) -> str:
        """``expr.sql()`` without the stand-ins' own qualifiers (the user's aliases stay)."""
        text = str(expr.sql())
        for q in self._qualifiers:
            text = text.replace(f"{q}.", "")
        return text


def stand_in_join(left: DataFrame, right: DataFrame, on: Any, how: str) -> ConnectJoin:
    """Spark's analyzed plan of ``left.join(right, on, how)`` for two Connect DataFrames."""
    jvm, jspark = _planning_session(left.sparkSession)
    aliases = {s: _user_alias(df) for s, df in (("left", left), ("right", right))}
    sides = {"left": left, "right": right}
    stand_ins = {}
    for s, df in sides.items():
        stand_ins[s] = _stand_in(jvm, jspark, df).alias(aliases[s] or _SIDE_ALIAS[s])
    qualifiers = tuple(_SIDE_ALIAS[s] for s in sides if aliases[s] is None)
    how_sql = how or "inner"
    try:
        if on is None:
            joined = stand_ins["left"].join(stand_ins["right"])
        elif isinstance(on, str):
            joined = stand_ins["left"].join(stand_ins["right"], _seq(jvm, [on]), how_sql)
        elif isinstance(on, list | tuple) and all(isinstance(c, str) for c in on):
            joined = stand_ins["left"].join(stand_ins["right"], _seq(jvm, list(on)), how_sql)
        else:
            conditions = on if isinstance(on, list | tuple) else [on]
            text = " AND ".join(f"({condition_sql(c, sides, aliases)})" for c in conditions)
            condition = jvm.org.apache.spark.sql.functions.expr(text)
            joined = stand_ins["left"].join(stand_ins["right"], condition, how_sql)
        plan = joined.queryExecution().analyzed()
    except ConfigurationError:
        raise
    except Exception as exc:
        msg = f"join: {_java_message(exc)}"
        raise ConfigurationError(msg) from exc
    return ConnectJoin(plan, jvm, qualifiers)


def stand_in_aggregate(df: DataFrame, keys: list[Any], aggs: list[Any]) -> ConnectJoin:
    """Spark's analyzed plan of ``df.groupBy(*keys).agg(*aggs)`` for a Connect DataFrame (keys
    and aggregates names or Columns of the client), made as a join's over a stand-in."""
    jvm, jspark = _planning_session(df.sparkSession)
    sides = {"left": df}
    aliases: dict[str, str | None] = {"left": None}
    stand_in = _stand_in(jvm, jspark, df).alias(_SIDE_ALIAS["left"])
    functions = jvm.org.apache.spark.sql.functions

    def column(c: Any) -> Any:
        if isinstance(c, str):
            return functions.col(_quoted(c))
        return functions.expr(condition_sql(c, sides, aliases))

    try:
        grouped = stand_in.groupBy(_seq(jvm, [column(k) for k in keys]))
        first, *rest = [column(a) for a in aggs]
        plan = grouped.agg(first, _seq(jvm, rest)).queryExecution().analyzed()
    except ConfigurationError:
        raise
    except Exception as exc:
        msg = f"agg: {_java_message(exc)}"
        raise ConfigurationError(msg) from exc
    return ConnectJoin(plan, jvm, (_SIDE_ALIAS["left"],))


def connect_stateful_step(df: DataFrame) -> str | None:
    """Spark's name of a stateful operator in a Connect DataFrame's plan (Spark would run it
    before the join), if it has one."""
    for node in _plan_nodes(df._plan):  # noqa: SLF001
        found = _CONNECT_STATEFUL.get(type(node).__name__)
        if found is not None:
            return found
    return None


# --- the stand-ins ---------------------------------------------------------------------------


def _stand_in(jvm: Any, jspark: Any, df: DataFrame) -> Any:
    """A stream of no rows with ``df``'s columns: types, names and metadata (the watermark's
    delay on the event-time column, as ``withWatermark`` leaves it)."""
    functions = jvm.org.apache.spark.sql.functions
    metadata = jvm.org.apache.spark.sql.types.Metadata
    data_type = jvm.org.apache.spark.sql.types.DataType
    columns = []
    for f in df.schema.fields:
        typed = functions.lit(None).cast(data_type.fromJson(json.dumps(f.dataType.jsonValue())))
        named = getattr(typed, "as")  # Scala's Column.as(name, metadata)
        columns.append(named(f.name, metadata.fromJson(json.dumps(f.metadata or {}))))
    rate = jspark.readStream().format("rate").load()
    return rate.select(_seq(jvm, columns))


def _user_alias(df: DataFrame) -> str | None:
    """The alias the user gave the side (``df.alias("a")``), found through the steps after it
    that keep the columns' qualifier (a filter, a watermark, a hint)."""
    node = df._plan  # noqa: SLF001
    while node is not None:
        name = type(node).__name__
        if name == "SubqueryAlias":
            return str(node._alias)  # noqa: SLF001
        if name not in ("Filter", "WithWatermark", "Hint", "Repartition"):
            return None
        node = node._child  # noqa: SLF001
    return None


def _plan_nodes(node: Any) -> Iterator[Any]:
    if node is None:
        return
    yield node
    for attr in ("_child", "left", "right", "other"):
        child = getattr(node, attr, None)
        if child is not None and child is not node and hasattr(child, "_plan_id"):
            yield from _plan_nodes(child)


def _plan_ids(df: DataFrame) -> set[int]:
    return {n._plan_id for n in _plan_nodes(df._plan)}  # noqa: SLF001


# --- a client's Column as SQL ----------------------------------------------------------------


def condition_sql(column: Any, sides: dict[str, DataFrame], aliases: dict[str, str | None]) -> str:
    """A Connect Column as Spark SQL, its columns of one side qualified by that side's alias."""
    ids = {s: _plan_ids(df) for s, df in sides.items()}
    return _sql(column._expr, ids, aliases)  # noqa: SLF001


def _sql(e: Any, ids: dict[str, set[int]], aliases: dict[str, str | None]) -> str:  # noqa: C901, PLR0911, PLR0912
    kind = type(e).__name__

    def sub(x: Any) -> str:
        return _sql(x, ids, aliases)

    if kind == "SQLExpression":
        return f"({e._expr})"  # noqa: SLF001
    if kind == "ColumnReference":
        name = str(e._unparsed_identifier)  # noqa: SLF001
        plan_id = e._plan_id  # noqa: SLF001
        side = next((s for s, found in ids.items() if plan_id in found), None)
        if plan_id is None or side is None:
            return name
        return f"{_quoted(aliases[side] or _SIDE_ALIAS[side])}.{name}"
    if kind == "UnresolvedFunction":
        name, args = str(e._name), [sub(a) for a in e._args]  # noqa: SLF001
        if name in _INFIX and len(args) == 2:  # noqa: PLR2004
            return f"({args[0]} {_INFIX[name]} {args[1]})"
        if name in ("not", "!") and len(args) == 1:
            return f"(NOT {args[0]})"
        if name == "negative" and len(args) == 1:
            return f"(- {args[0]})"
        if name == "isNull" and len(args) == 1:
            return f"({args[0]} IS NULL)"
        if name == "isNotNull" and len(args) == 1:
            return f"({args[0]} IS NOT NULL)"
        distinct = "DISTINCT " if e._is_distinct else ""  # noqa: SLF001
        return f"{name}({distinct}{', '.join(args)})"
    if kind == "LiteralExpression":
        return _literal(e._value, e._dataType)  # noqa: SLF001
    if kind == "CastExpression":
        target = e._data_type  # noqa: SLF001
        typ = target if isinstance(target, str) else target.simpleString()
        cast = "TRY_CAST" if e._eval_mode == "try" else "CAST"  # noqa: SLF001
        return f"{cast}({sub(e._expr)} AS {typ})"  # noqa: SLF001
    if kind == "ColumnAlias":
        return sub(e._child)  # noqa: SLF001
    if kind == "CaseWhen":
        branches = "".join(f" WHEN {sub(c)} THEN {sub(v)}" for c, v in e._branches)  # noqa: SLF001
        other = f" ELSE {sub(e._else_value)}" if e._else_value is not None else ""  # noqa: SLF001
        return f"(CASE{branches}{other} END)"
    if kind == "UnresolvedStar" and e._unparsed_target is None:  # noqa: SLF001
        return "*"
    if kind == "UnresolvedExtractValue":
        return f"{sub(e._child)}[{sub(e._extraction)}]"  # noqa: SLF001
    msg = (
        f"join: sparkstate cannot yet hand the condition's part {e!r} ({kind}) from a Spark "
        "Connect client to Spark's analysis; write that part as SQL, e.g. "
        'F.expr("l.ts <= r.ts + INTERVAL 1 HOUR")'
    )
    raise ConfigurationError(msg)


def _literal(value: Any, data_type: Any) -> str:  # noqa: PLR0911
    typ = data_type.simpleString()
    if value is None:
        return f"CAST(NULL AS {typ})"
    name = type(data_type).__name__
    if name == "StringType":
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    if name == "BooleanType":
        return "TRUE" if value else "FALSE"
    if name == "TimestampType":
        return f"timestamp_micros({int(value)})"
    if name == "TimestampNTZType":
        return f"CAST(timestamp_micros({int(value)}) AS timestamp_ntz)"
    if name == "DateType":
        return f"date_from_unix_date({int(value)})"
    if name == "DayTimeIntervalType":
        seconds = decimal.Decimal(int(value)) / 1_000_000
        return f"make_dt_interval(0, 0, 0, {seconds})"
    if name == "BinaryType":
        return f"X'{bytes(value).hex()}'"
    if isinstance(value, bool | int | float | decimal.Decimal):
        return f"CAST('{value}' AS {typ})"
    if isinstance(value, datetime.date | datetime.datetime):
        return f"CAST('{value.isoformat()}' AS {typ})"
    msg = f"join: a literal of type {typ} in the condition; write it as SQL (F.expr)"
    raise ConfigurationError(msg)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# --- the local JVM ---------------------------------------------------------------------------


def _planning_session(spark: Any) -> tuple[Any, Any]:
    """The local JVM and its session, started once per process; the user's session's analysis
    settings applied each time."""
    with _lock:
        jvm, jspark = _started()
        for key in _ANALYSIS_CONF:
            value = spark.conf.get(key, None)
            if value is not None:
                jspark.conf().set(key, value)
        return jvm, jspark


@functools.cache
def _started() -> tuple[Any, Any]:
    try:
        gateway = _launch_gateway()
    except Exception as exc:
        msg = (
            "a stream-stream join from a Spark Connect client is planned by Spark's own analysis "
            "in a local JVM, which did not start (it needs Java, as PySpark itself does): "
            f"{exc}"
        )
        raise ConfigurationError(msg) from exc
    jvm = gateway.jvm
    builder = jvm.org.apache.spark.sql.classic.SparkSession.builder()
    settings = {
        "spark.master": "local[1]",
        "spark.app.name": "sparkstate join planning",
        "spark.ui.enabled": "false",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    return jvm, builder.getOrCreate()


def _launch_gateway(timeout_s: float = 120.0) -> Any:
    """PySpark's JVM gateway, started as ``pyspark.java_gateway.launch_gateway`` starts it but
    without Python code between fork and exec: a Connect client's gRPC threads make a forked
    child that runs Python unsafe, so the JVM is spawned plainly, in a session of its own (a
    Ctrl-C to the client does not reach it); it ends when this process does (its stdin closes).
    """
    from py4j.java_gateway import GatewayParameters, JavaGateway
    from pyspark.find_spark_home import _find_spark_home

    submit = os.path.join(_find_spark_home(), "bin", "spark-submit")
    info_dir = tempfile.mkdtemp(prefix="sparkstate-gateway-")
    try:
        info_file = os.path.join(info_dir, "conn_info")
        env = {**os.environ, "SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": info_file}
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT"):
            env.pop(name, None)
        proc = subprocess.Popen(  # noqa: S603 - PySpark's own launcher script
            [submit, "pyspark-shell"], stdin=subprocess.PIPE, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and not os.path.isfile(info_file):
            if time.monotonic() > deadline:
                proc.kill()
                msg = f"the JVM did not start in {timeout_s:.0f} s"
                raise TimeoutError(msg)
            time.sleep(0.1)
        if not os.path.isfile(info_file):
            msg = f"the JVM exited with status {proc.returncode} before it listened"
            raise RuntimeError(msg)
        with open(info_file, "rb") as info:  # the port, then the secret's length and bytes
            port, length = struct.unpack(">ii", info.read(8))
            secret = info.read(length).decode("utf-8")
    finally:
        shutil.rmtree(info_dir, ignore_errors=True)
    gateway = JavaGateway(
        gateway_parameters=GatewayParameters(port=port, auth_token=secret, auto_convert=True)
    )
    gateway.proc = proc  # kept with the gateway: its stdin is the JVM's lifeline
    return gateway


def _seq(jvm: Any, items: list[Any]) -> Any:
    return jvm.org.apache.spark.api.python.PythonUtils.toSeq(items)


def _java_message(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    if java is not None:
        return str(java.getMessage())
    return str(exc)
