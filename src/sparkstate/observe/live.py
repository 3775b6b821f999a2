"""A running query's state, read live: from the state homes that hold it, else from its checkpoint.

``LiveState(checkpoint, operator=...)`` (``ss.state(query_or_checkpoint, ...)`` from a session)
answers ``get(key)``, ``get_many(keys)`` and ``scan(prefix)`` in the state reader's shapes (a
window's aggregate, a deduplication's presence, a ``transformWithState`` variable by its name).
Every answer is the state after the last batch the query committed, and says which batch that
is: a home answers from the version its provider pinned when it committed that batch's task
(:mod:`sparkstate.runtime.home_reads`), never from one a task is writing.

A key goes to the home that owns its partition: the partition is Spark's hash of the columns the
engine shuffles the operator's input by (:mod:`.spark_hash`), the home the one the last commit
names for it. Where no home holds the partition (the query stopped, its executor was lost, the
state moved), the same read loads the partition's version from the checkpoint's durable files,
once per batch, and answers from it. The partition's provider is kept from one batch to the
next, so a reader that follows a running query from its checkpoint restores a partition once
and reaches each later batch by its changelogs (``checkpoint_loads`` counts how each load was
made). Nothing here writes to the checkpoint or to a home.

A reader may be shared by many threads (a web service's handlers): its reads take turns on its
connections, and point reads asked for at once are answered together, as one ``get_many`` of
their keys (each home asked once for all of them), where one at a time each would be a round
trip of its own. In an asyncio program, ``await reader.aget(key)`` does the same for the reads
its tasks await at once, without a thread each: they are answered together on a thread of the
event loop's executor while the loop runs on, and the reads awaited meanwhile go together next.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.checkpoint import OperatorInfo, StateCheckpoint, open_checkpoint
from sparkstate.observe.key_lookup import key_columns, partition_columns, plain, store_views
from sparkstate.observe.spark_hash import spark_partition, spark_partitions
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Credentials
from sparkstate.runtime.home_client import connect_owner
from sparkstate.runtime.home_reads import MAX_SCAN_LIMIT, HomeReader
from sparkstate.runtime.home_wire import HomeLost
from sparkstate.store.base import StateStore, StateStoreProvider
from sparkstate.store.capabilities import ReadsChanges
from sparkstate.store.families import ColumnFamily, key_successor

__all__ = ["Found", "LiveState"]

#: How often a reader looks for a batch committed after the one it reads, at most.
REFRESH_S = 0.05
#: Keys one request to a home carries, at most.
_GET_CHUNK = 4096
#: Bytes of requests a connection to a home carries before their answers are read, at most.
_IN_FLIGHT = 32 << 10
#: Pairs one scan request to a home asks for.
_SCAN_PAGE = 4096

#: The types of a key given as one value that :meth:`LiveState._key_row` takes as it is.
_PLAIN = frozenset({int, str, float, bool, bytes})

#: Opens a reader's connection to a home at an address (``host:port/token``); None if it
#: cannot be reached.
Connector = Callable[[str], "HomeReader | None"]


@dataclasses.dataclass(frozen=True)
class Found:
    """One key's state: its rows in the state reader's shape (no rows: the key has no state),
    the batch after which they are the state, the partition, and where they were read:
    ``home`` (a running query's state home) or ``checkpoint`` (its durable files)."""

    key: dict[str, Any]
    rows: list[dict[str, Any]]
    batch_id: int
    partition: int
    source: str

    @property
    def found(self) -> bool:
        return bool(self.rows)

    @property
    def value(self) -> Any:
        """The key's value (None: no state): its row's one column (an aggregate's ``value``,
        a list variable's ``list_value``, a map variable's ``map_value``), or its row."""
        if not self.rows:
            return None
        (row,) = self.rows
        return next(iter(row.values())) if len(row) == 1 else row


def _flat(key: Mapping[str, Any], into: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    for name, value in key.items():
        if isinstance(value, Mapping):
            _flat(value, into, f"{prefix}{name}.")
        else:
            into[f"{prefix}{name}"] = value
    return into


class LiveState:
    """One operator's state of a running (or stopped) query, read live."""

    def __init__(
        self,
        location: str,
        operator: int | str | None = None,
        *,
        store: str | None = None,
        join_side: str | None = None,
        credentials: Credentials = NO_CREDENTIALS,
        connector: Connector | None = None,
    ) -> None:
        """``credentials``: what the query's homes ask of a connection (the application's
        secret where Spark's ``spark.authenticate`` is on, :mod:`sparkstate.runtime.
        home_channel`); ``connector``: how to reach a home (a test's, or one that reaches none:
        read the checkpoint alone)."""
        self._chk: StateCheckpoint = open_checkpoint(location)
        self.operator: OperatorInfo = _pick(self._chk, operator)
        op = self.operator
        if op.layout.unkeyed is not None:
            msg = f"operator {op.id} ({op.name}) {op.layout.unkeyed}"
            raise ConfigurationError(msg)
        schemas = self._chk.operator_families(op.id)
        if schemas is None:
            msg = f"operator {op.id} ({op.name}) of {self._chk.location} has no state yet"
            raise ConfigurationError(msg)
        views = store_views(op, schemas, store_name=store, join_side=join_side)
        if len(views) != 1:
            names = ", ".join(label for label, _ in views)
            msg = f"operator {op.id} ({op.name}) has several stores ({names}): name one (store=)"
            raise ConfigurationError(msg)
        self.store_name, self._view = views[0]
        #: Every column family of the store: a view may read one beside its own (a list
        #: variable's elements).
        self._all: dict[str, ColumnFamily] = self._families()
        self._family: ColumnFamily = self._all[self._view.family]
        key_schema = schemas[self._view.family][0]
        self._columns = key_columns(op.description, key_schema)
        #: A one-column key's store column (a key given as one plain value needs no more);
        #: whether every key column shows under its store name (a key's row is then shown).
        self._one = self._columns[0].store_column if len(self._columns) == 1 else None
        self._same_names = all(c.name == c.store_column for c in self._columns)
        self._key_schema = key_schema
        self._shuffle = partition_columns(op.description, key_schema)
        self._connector = connector or _connector(credentials)
        self._readers: dict[str, HomeReader | None] = {}
        #: The read stores of the batch read, aborted when it moves; the providers they load
        #: from, kept across batches (closed with this reader).
        self._opened = contextlib.ExitStack()
        self._stores: dict[tuple[int, int], StateStore | None] = {}
        self._kept = contextlib.ExitStack()
        self._providers: dict[int, StateStoreProvider] = {}
        #: How the partitions read from the checkpoint were loaded, by the provider's word for
        #: it (``restored``: from the durable files; ``caught_up``: from the version loaded
        #: before, by the changelogs since; ``open``: that version still).
        self.checkpoint_loads: Counter[str] = Counter()
        self._checked = 0.0
        #: Held by a read while it uses the connections, stores and batch read.
        self._lock = threading.RLock()
        #: Point reads waiting to be answered together, and whether a thread is answering.
        self._asked = threading.Lock()
        self._waiting: list[_PointRead] = []
        self._answering = False
        #: Point reads awaited in each event loop (:meth:`aget`), answered together.
        self._awaited: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Awaited] = (
            weakref.WeakKeyDictionary()
        )
        #: Whether the rows read hold a map, which :func:`plain` makes plain (None: not known).
        self._plain: bool | None = None
        self._at(self._chk.last_batch())

    # --- the batch read ----------------------------------------------------------------------

    def _at(self, batch_id: int) -> None:
        commit = self._chk.commit(batch_id)
        self.batch_id = batch_id
        self._owners = commit.owners().get(self.operator.id, {})
        self._attempts = commit.lineage().get(self.operator.id, {})
        self._partitions = self._chk.partitions_at(batch_id)
        self._close_stores()
        self._checked = time.monotonic()

    def refresh(self, *, force: bool = True) -> bool:
        """Move to the newest batch the query committed (at most every :data:`REFRESH_S`
        seconds unless ``force``); whether it moved."""
        with self._lock:
            return self._refresh(force)

    def _refresh(self, force: bool) -> bool:
        now = time.monotonic()
        if not force and now - self._checked < REFRESH_S:
            return False
        self._checked = now
        newest = self.batch_id
        while self._chk.log.read_commit(newest + 1) is not None:
            newest += 1
        if newest == self.batch_id and not self._rewritten():
            return False
        self._at(newest)
        return True

    def _rewritten(self) -> bool:
        """Whether the batch read was rescaled in place (a restart with another partition
        count rewrites the last commit): its state is then in other partitions."""
        commit = self._chk.log.read_commit(self.batch_id)
        return commit is not None and commit.lineage().get(self.operator.id, {}) != self._attempts

    def _families(self) -> dict[str, ColumnFamily]:
        for p in range(self._chk.num_partitions):
            with self._chk.provider_for(self.operator.id, p) as provider:
                if provider is not None:
                    return dict(ReadsChanges.require(provider, "read state live").families)
        msg = f"operator {self.operator.id} of {self._chk.location} has no state yet"
        raise ConfigurationError(msg)

    # --- keys ----------------------------------------------------------------------------------

    def _key_row(self, key: Any) -> dict[str, Any]:
        """A key given as a mapping of its shown columns (a window as ``{"window": {"start":
        ..., "end": ...}}`` or as ``window.start``), a sequence in key order, or one value."""
        if self._one is not None and type(key) in _PLAIN:
            return {self._one: key}
        columns = self._columns
        if isinstance(key, Mapping):
            given = _flat(key, {})
            missing = [c.name for c in columns if c.name not in given]
            unknown = sorted(set(given) - {c.name for c in columns})
            if missing or unknown:
                shown = ", ".join(c.name for c in columns)
                msg = f"the key has columns {shown}: missing {missing}, unknown {unknown}"
                raise ConfigurationError(msg)
            values = [given[c.name] for c in columns]
        else:
            values = list(key) if isinstance(key, (tuple, list)) else [key]
            if len(values) != len(columns):
                shown = ", ".join(c.name for c in columns)
                msg = f"the key has {len(columns)} columns ({shown}); got {len(values)} values"
                raise ConfigurationError(msg)
        return {c.store_column: v for c, v in zip(columns, values, strict=True)}

    def _encode(self, rows: list[dict[str, Any]]) -> tuple[list[bytes], list[int | None]]:
        """The keys encoded, and each one's partition (None: its type has no hash here, so
        it may be in any)."""
        schema = self._family.key_schema
        try:
            table = pa.Table.from_pylist(rows, schema=self._key_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            msg = f"a key does not fit the operator's key columns ({self._key_schema}): {exc}"
            raise ConfigurationError(msg) from exc
        encoded = self._family.key_codec.encode_many(table.select(schema.names))
        if len(rows) == 1:  # (a point read: the scalar hash, without numpy's fixed cost)
            scalars = [table.column(c)[0] for c in self._shuffle]
            return encoded, [spark_partition(scalars, self._partitions)]
        hashed = spark_partitions([table.column(c) for c in self._shuffle], self._partitions)
        return encoded, [None] * len(rows) if hashed is None else hashed.tolist()

    def _shown(self, row: dict[str, Any]) -> dict[str, Any]:
        if self._same_names:
            return row  # (a row of the reader's own, made by _key_row)
        return {c.name: row[c.store_column] for c in self._columns}

    # --- reads ----------------------------------------------------------------------------------

    def get(self, key: Any) -> Found:
        """The state of one key after the last batch the query committed. Keys asked for by
        several threads at once are read together (:meth:`get_many`)."""
        asked = _PointRead(self._key_row(key))  # (a key that does not fit: fails here)
        with self._asked:
            leads = not self._answering
            self._answering = True
            if not leads:
                self._waiting.append(asked)
        if not leads:
            asked.wait()  # (answered, or handed the lead)
        if leads or asked.leads:
            self._lead(asked)
        if asked.error is not None:
            raise asked.error
        assert asked.found is not None
        return asked.found

    def _lead(self, asked: _PointRead) -> None:
        """Answer ``asked`` and the reads waiting with it, then hand the lead to the first
        read that came while they were answered (one thread woken, not every one waiting)."""
        with self._asked:
            together, self._waiting = [asked, *self._waiting], []
        try:
            self._answer(together)
        finally:
            for one in together[1:]:
                if one.found is None and one.error is None:  # (an interrupt: said so)
                    one.error = ConfigurationError("the read answering this one stopped")
                one.wake()
            with self._asked:
                if self._waiting:
                    self._waiting.pop(0).wake(lead=True)
                else:
                    self._answering = False

    def _answer(self, asked: Sequence[_Asked]) -> None:
        """Answer point reads together; where that fails, each half on its own, so that one
        key's failure is its own."""
        try:
            with self._lock:
                founds = self._read([a.row for a in asked])
        except Exception as exc:
            if len(asked) == 1:
                asked[0].error = exc
                return
            half = len(asked) // 2
            self._answer(asked[:half])
            self._answer(asked[half:])
            return
        for one, found in zip(asked, founds, strict=True):
            one.found = found

    async def aget(self, key: Any) -> Found:
        """:meth:`get` for asyncio: the state of one key, awaited. The reads a loop's tasks
        await at once are answered together, on a thread of the loop's default executor (the
        loop is not blocked); the reads awaited while they are answered go together next."""
        loop = asyncio.get_running_loop()
        asked = _Asked(self._key_row(key))  # (a key of the wrong shape: fails here)
        awaited = self._awaited.get(loop)
        if awaited is None:
            awaited = self._awaited[loop] = _Awaited()
        future: asyncio.Future[None] = loop.create_future()
        awaited.waiting.append((asked, future))
        if not awaited.answering:
            awaited.answering = True
            loop.call_soon(self._answer_awaited, loop, awaited)
        await future
        if asked.error is not None:
            raise asked.error
        assert asked.found is not None
        return asked.found

    def _answer_awaited(self, loop: asyncio.AbstractEventLoop, awaited: _Awaited) -> None:
        """Answer the reads awaited in ``loop`` so far on an executor thread; when they are
        answered, wake their tasks and answer those awaited meanwhile."""
        together, awaited.waiting = awaited.waiting, []
        if not together:
            awaited.answering = False
            return
        done = loop.run_in_executor(None, self._answer, [asked for asked, _ in together])

        def answered(outcome: asyncio.Future[None]) -> None:
            failed = None if outcome.cancelled() else outcome.exception()
            for asked, future in together:
                if asked.found is None and asked.error is None:  # (the executor failed)
                    asked.error = ConfigurationError(f"the read was not answered: {failed!r}")
                if not future.done():  # (a task cancelled: its future is done)
                    future.set_result(None)
            self._answer_awaited(loop, awaited)

        done.add_done_callback(answered)

    def get_many(self, keys: Sequence[Any]) -> list[Found]:
        """The state of many keys, all after the same committed batch, in their order."""
        rows = [self._key_row(k) for k in keys]
        with self._lock:
            return self._read(rows)

    def _read(self, rows: list[dict[str, Any]]) -> list[Found]:
        """The state of keys given as rows of the store's key columns (:meth:`_key_row`)."""
        self._refresh(force=False)
        encoded, partitions = self._encode(rows) if rows else ([], [])
        prefix = self._family.prefix
        by_partition: dict[int | None, list[int]] = {}
        for i, partition in enumerate(partitions):
            by_partition.setdefault(partition, []).append(i)
        for _ in range(3):
            batch = self.batch_id
            #: The partitions asked, each with its keys, and the keys' places in ``rows``.
            asks: list[tuple[int, list[bytes]]] = []
            places: list[list[int]] = []
            for partition, indexes in by_partition.items():
                pkeys = [prefix + encoded[i] for i in indexes]
                for p in range(self._partitions) if partition is None else [partition]:
                    asks.append((p, pkeys))
                    places.append(indexes)
            answers = self._get(asks)
            if answers is None:
                continue  # (the query committed a newer batch: read that)
            #: Per key: its value, the partition it was read in and from where.
            got: list[tuple[bytes | None, int, str] | None] = [None] * len(rows)
            for (p, _), indexes, (values, source) in zip(asks, places, answers, strict=True):
                for i, value in zip(indexes, values, strict=True):
                    if got[i] is None or value is not None:
                        got[i] = (value, p, source)
            return self._founds(rows, encoded, got, batch)
        msg = "the query committed batches faster than a read could follow them three times"
        raise ConfigurationError(msg)

    def _founds(
        self,
        rows: list[dict[str, Any]],
        encoded: list[bytes],
        got: list[tuple[bytes | None, int, str] | None],
        batch: int,
    ) -> list[Found]:
        """The keys' states, the values found decoded together."""
        present = [i for i, g in enumerate(got) if g is not None and g[0] is not None]
        decoded = self._rows([encoded[i] for i in present], [got[i][0] for i in present])  # type: ignore[index]
        shown: dict[int, list[dict[str, Any]]] = {}
        if len(decoded) == len(present):  # one row a key (the views read here show them so)
            shown = {i: [row] for i, row in zip(present, decoded, strict=True)}
        else:
            for i in present:
                shown[i] = self._rows([encoded[i]], [got[i][0]])  # type: ignore[index]
        out = []
        for i, row in enumerate(rows):
            g = got[i]
            assert g is not None
            out.append(Found(self._shown(row), shown.get(i, []), batch, g[1], g[2]))
        return out

    def _rows(self, encoded: list[bytes], values: list[bytes | None]) -> list[dict[str, Any]]:
        table = self._view.rows(self._all, encoded, values).drop_columns(["key"])
        rows = table.to_pylist()
        if self._plain is None:
            self._plain = _holds_map(table.schema)
        return [plain(r) for r in rows] if self._plain else rows

    def scan(self, prefix: Any = None) -> Iterator[Found]:
        """Every key's state whose key starts with ``prefix`` (values of its first columns, as
        for :meth:`get`; None: every key), partition by partition, after one committed batch."""
        self.refresh(force=False)
        fam = self._family
        if prefix is None:
            lo = fam.prefix
        else:
            values = list(prefix) if isinstance(prefix, (tuple, list)) else [prefix]
            lo = fam.prefix + fam.key_codec.encode_prefix(tuple(values))
        hi = fam.end_of_family() if prefix is None else key_successor(lo)
        skip = len(fam.prefix)
        with self._lock:
            batch, partitions = self.batch_id, self._partitions
        for p in range(partitions):
            pages = self._scan(p, batch, lo, hi)
            while True:
                with self._lock:  # (a page at a time: other threads read between pages)
                    page = next(pages, None)
                if page is None:
                    break
                keys, values, source = page
                encoded = [k[skip:] for k in keys]
                rows = self._view.rows(self._all, encoded, values)
                key_rows = rows.column("key").to_pylist()
                for key_row, row in zip(
                    key_rows, rows.drop_columns(["key"]).to_pylist(), strict=True
                ):
                    yield Found(plain(key_row), [plain(row)], batch, p, source)

    def _get(
        self, asks: list[tuple[int, list[bytes]]]
    ) -> list[tuple[list[bytes | None], str]] | None:
        """Per ask ``(partition, physical keys)``, the keys' values at the batch read and their
        source; None if the query committed a newer batch instead (then nothing was read).

        The homes are asked at once: each ask that fits one request is sent before any answer
        is read, so that the partitions' homes answer together, not one round trip after
        another. A connection carries at most :data:`_IN_FLIGHT` bytes of requests not yet
        answered past its first: the kernel's buffers hold them while its home writes an
        answer, so that neither side waits for the other to read."""
        #: Per connection (by its id): the reader, the asks it carries, their bytes about.
        going: dict[int, tuple[HomeReader, list[int], int]] = {}
        for n, (p, pkeys) in enumerate(asks):
            reader = self._reader(p)
            if reader is None or len(pkeys) > _GET_CHUNK:
                continue
            size = sum(map(len, pkeys)) + 4 * len(pkeys) + 512  # (the request, about)
            _, carried, in_flight = going.get(id(reader), (reader, [], 0))
            if carried and in_flight + size > _IN_FLIGHT:
                continue
            going[id(reader)] = (reader, [*carried, n], in_flight + size)
        sent: dict[int, HomeReader] = {}
        for reader, carried, _ in going.values():  # (a connection's requests sent at once)
            try:
                reader.send_many([(self._request("get", asks[n][0]), asks[n][1]) for n in carried])
            except (HomeLost, OSError):
                self._lose(asks[carried[0]][0], reader)
                continue
            sent.update((n, reader) for n in carried)
        sent = dict(sorted(sent.items()))  # (a connection's answers come in its asks' order)
        #: The sent asks' values (None: the home did not answer).
        answers: dict[int, list[bytes | None] | None] = {}
        moved = False
        for n, reader in sent.items():  # (every answer read: the connections kept in step)
            answers[n], newer = self._values(asks[n][0], self._take(asks[n][0], reader))
            moved |= newer
        if moved:
            return None
        out: list[tuple[list[bytes | None], str]] = []
        for n, (p, pkeys) in enumerate(asks):
            if n not in sent:
                one = self._get_one(p, pkeys)
                if one is None:
                    return None
                out.append(one)
            elif (values := answers[n]) is not None:
                out.append((values, "home"))
            else:  # (the home did not answer: its partition from the checkpoint)
                out.append(self._from_checkpoint(p, pkeys))
        return out

    def _get_one(self, p: int, pkeys: list[bytes]) -> tuple[list[bytes | None], str] | None:
        """Partition ``p``'s keys from its home, a request after another, or where it does not
        answer, from the checkpoint; None if the query committed a newer batch."""
        reader = self._reader(p)
        if reader is not None:
            out: list[bytes | None] = []
            for i in range(0, len(pkeys), _GET_CHUNK):
                header = self._request("get", p)
                values, newer = self._values(
                    p, self._ask(reader, p, header, pkeys[i : i + _GET_CHUNK])
                )
                if newer:
                    return None
                if values is None:
                    break
                out += values
            else:
                return out, "home"
        return self._from_checkpoint(p, pkeys)

    def _values(
        self, p: int, answer: tuple[bool, dict[str, Any], list[bytes | None]]
    ) -> tuple[list[bytes | None] | None, bool]:
        """A home's answer for partition ``p``: its values (None: it did not answer), and
        whether the query committed a newer batch to read instead (the home holds a version
        past the next, or only newer ones than the one asked)."""
        answered, reply, values = answer
        if answered:
            newer = max(reply.get("held") or [0]) > self.batch_id + 1
            return values, newer and self._refresh(False)
        return None, self._stale(reply) and self._refresh(True)

    def _from_checkpoint(self, p: int, pkeys: list[bytes]) -> tuple[list[bytes | None], str]:
        store = self._store(p)
        values = [None] * len(pkeys) if store is None else store.raw_get_many(pkeys)
        return list(values), "checkpoint"

    def _scan(
        self, p: int, batch: int, lo: bytes, hi: bytes
    ) -> Iterator[tuple[list[bytes], list[bytes | None], str]]:
        reader = self._reader(p) if batch == self.batch_id else None
        start = lo
        while reader is not None:
            header = {**self._request("scan", p), "page": _SCAN_PAGE}
            answered, _, flat = self._ask(reader, p, header, [start, hi])
            if not answered:
                break  # (a page already yielded stays: every page is of the same version)
            keys = [k for k in flat[0::2] if k is not None]
            yield keys, flat[1::2], "home"
            if len(keys) < _SCAN_PAGE:
                return
            start = keys[-1] + b"\x00"
        store = self._store(p, batch)
        if store is None:
            return
        for keys, values in store.raw_scan_chunks(start, hi, 0, MAX_SCAN_LIMIT):
            yield keys, list(values), "checkpoint"

    def _request(self, op: str, p: int) -> dict[str, Any]:
        return {
            "op": op,
            "root": self._chk.state_root,
            "operator": self.operator.id,
            "partition": p,
            "version": self.batch_id + 1,
            "checkpoint_id": self._attempts.get(p),
        }

    def _stale(self, reply: dict[str, Any]) -> bool:
        held = reply.get("held") or []
        return bool(held) and min(held) > self.batch_id + 1

    def _ask(
        self, reader: HomeReader, p: int, header: dict[str, Any], blobs: list[bytes]
    ) -> tuple[bool, dict[str, Any], list[bytes | None]]:
        try:
            return reader.request(header, blobs)
        except (HomeLost, OSError):
            self._lose(p, reader)
            return False, {}, []

    def _take(self, p: int, reader: HomeReader) -> tuple[bool, dict[str, Any], list[bytes | None]]:
        """The answer to the oldest request sent to ``reader`` (a lost home: not answered)."""
        try:
            return reader.receive()
        except (HomeLost, OSError):
            self._lose(p, reader)
            return False, {}, []

    def _lose(self, p: int, reader: HomeReader) -> None:
        reader.close()
        self._readers[self._owners[p]] = None

    def _reader(self, p: int) -> HomeReader | None:
        owner = self._owners.get(p)
        if owner is None:
            return None
        if owner not in self._readers:
            self._readers[owner] = self._connector(owner)
        return self._readers[owner]

    def _store(self, p: int, batch: int | None = None) -> StateStore | None:
        """Partition ``p``'s state after ``batch`` (default: the batch read) from the
        checkpoint, loaded once per batch."""
        batch = self.batch_id if batch is None else batch
        if (p, batch) not in self._stores:
            if batch == self.batch_id:
                store = self._load(p)
            else:  # (a scan begun at a batch the reader has moved on from)
                store = self._opened.enter_context(self._chk.read_store(self.operator.id, p, batch))
            self._stores[(p, batch)] = store
        return self._stores[(p, batch)]

    def _load(self, p: int) -> StateStore | None:
        """Partition ``p``'s state after the batch read, by the partition's kept provider."""
        provider = self._providers.get(p)
        if provider is None:
            with contextlib.ExitStack() as opening:
                provider = opening.enter_context(
                    self._chk.provider_for(self.operator.id, p, keep_open=True)
                )
                if provider is None:
                    return None  # (no state yet: asked again at the next batch)
                self._kept.push(opening.pop_all())
            self._providers[p] = provider
        checkpoint_id = self._chk.checkpoint_id(self.operator.id, p, self.batch_id)
        store = provider.get_read_store(self.batch_id + 1, checkpoint_id)
        self._opened.callback(store.abort)
        if store.found is not None:
            self.checkpoint_loads[store.found] += 1
        return store

    def _close_stores(self) -> None:
        self._stores.clear()
        self._opened.close()
        self._opened = contextlib.ExitStack()

    def close(self) -> None:
        """Close the connections to homes and the partitions loaded from the checkpoint."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        for reader in self._readers.values():
            if reader is not None:
                reader.close()
        self._readers.clear()
        self._close_stores()
        self._providers.clear()
        self._kept.close()

    def __enter__(self) -> LiveState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _holds_map(schema: pa.Schema) -> bool:
    """Whether a column of ``schema`` is or holds a map (whose Python values :func:`plain`
    makes plain)."""

    def holds(typ: pa.DataType) -> bool:
        if pa.types.is_map(typ):
            return True
        if pa.types.is_struct(typ):
            return any(holds(typ.field(i).type) for i in range(typ.num_fields))
        if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
            return holds(typ.value_type)
        return False

    return any(holds(field.type) for field in schema)


class _Asked:
    """A point read to answer: its key's row, then the state found or the error raised."""

    __slots__ = ("error", "found", "row")

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row
        self.found: Found | None = None
        self.error: Exception | None = None


class _Awaited:
    """The point reads awaited in one event loop and not yet being answered, and whether
    some are being answered (the next go when they are)."""

    __slots__ = ("answering", "waiting")

    def __init__(self) -> None:
        self.waiting: list[tuple[_Asked, asyncio.Future[None]]] = []
        self.answering = False


class _PointRead(_Asked):
    """A point read waiting for its answer, or for the lead: to answer it and those waiting
    with it."""

    __slots__ = ("_asleep", "leads")

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(row)
        self.leads = False
        self._asleep = threading.Lock()
        self._asleep.acquire()

    def wait(self) -> None:
        self._asleep.acquire()

    def wake(self, *, lead: bool = False) -> None:
        self.leads = lead
        self._asleep.release()


def _connector(credentials: Credentials) -> Connector:
    """Connections to homes with ``credentials`` (those of a task of the query)."""

    def connect(address: str) -> HomeReader | None:
        channel = connect_owner(address, credentials)
        return None if channel is None else HomeReader(channel)

    return connect


def _pick(chk: StateCheckpoint, operator: int | str | None) -> OperatorInfo:
    ops = chk.operators()
    if operator is None:
        if len(ops) == 1:
            return ops[0]
        shown = [(o.id, o.name) for o in ops]
        msg = f"the query has several stateful operators {shown}: name one (operator=id or name)"
        raise ConfigurationError(msg)
    if isinstance(operator, int):
        return chk.operator(operator)
    named = [o for o in ops if operator in (o.name, o.kind)]
    if len(named) != 1:
        shown = [(o.id, o.name) for o in ops]
        msg = f"no single stateful operator named {operator!r}; the query's operators: {shown}"
        raise ConfigurationError(msg)
    return named[0]
