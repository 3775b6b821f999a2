"""``sparkstate bench store``: the providers against a raw ``rocksdict`` loop on the same machine.

Each system runs in a subprocess of its own so that its peak RSS is its own. Operations:
``put`` (batched put_many + commit), ``get`` (get_many of random keys), ``scan`` (full iteration)
and ``restore`` (a new provider with an empty local directory loads the last version from the
durable files and reads 200 keys, a small batch's: whole, the snapshot downloaded first, and
lazily, :mod:`sparkstate.store.rocksdb.lazy`). The raw loop is the ceiling: pre-encoded keys,
one WriteBatch, multi-get, iterate.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

__all__ = ["run"]

SYSTEMS = ["sparkstate-rocksdb", "sparkstate-memory", "raw-rocksdict"]
BATCH = 250_000
GET_BATCH = 100_000
#: The keys the first read after a restore asks for (a small batch's).
FIRST_BATCH_KEYS = 200


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _keys(n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.permutation(n).astype(np.int64)


def _bench_provider(kind: str, n: int, workdir: str) -> dict[str, Any]:
    import pyarrow as pa

    from sparkstate.store import StoreConf, StoreId, provider_class

    key_schema = pa.schema([("id", pa.int64())])
    value_schema = pa.schema([("count", pa.int64()), ("total", pa.float64())])
    store_id = StoreId(os.path.join(workdir, "chk"), 0, 0)
    conf = StoreConf(local_dir=os.path.join(workdir, "local"))
    provider = provider_class(kind)()
    provider.init(store_id, key_schema, value_schema, conf)
    ids = _keys(n)
    version = 0
    start = time.perf_counter()
    for lo in range(0, n, BATCH):
        chunk = ids[lo : lo + BATCH]
        keys = pa.table({"id": chunk})
        values = pa.table({"count": np.ones(len(chunk), np.int64), "total": chunk * 0.5})
        store = provider.get_store(version)
        store.put_many(keys, values)
        version = store.commit()
    put_s = time.perf_counter() - start

    provider.do_maintenance()  # snapshot of the last version, as the engine does off-path
    store = provider.get_read_store(version)
    probe = np.random.default_rng(11).choice(ids, size=min(n, 1_000_000), replace=False)
    start = time.perf_counter()
    found = 0
    for lo in range(0, len(probe), GET_BATCH):
        got = store.get_many(pa.table({"id": probe[lo : lo + GET_BATCH]}))
        found += sum(1 for g in got if g is not None)
    get_s = time.perf_counter() - start
    if found != len(probe):
        msg = f"{kind}: get_many found {found} of {len(probe)} keys"
        raise AssertionError(msg)

    start = time.perf_counter()
    scanned = sum(1 for _ in store.raw_scan(b"", b"\xff"))
    scan_s = time.perf_counter() - start
    if scanned < n:
        msg = f"{kind}: scan saw {scanned} of {n} keys"
        raise AssertionError(msg)
    store.abort()
    rss_after_load = _rss_mb()
    provider.close()

    first = pa.table({"id": probe[:FIRST_BATCH_KEYS]})
    restores: dict[str, float] = {}
    for how, options in (
        ("whole", {"lazy_restore": False}),
        ("lazy", {"lazy_restore": True, "lazy_restore_min_mb": 0}),
    ):
        if kind != "rocksdb" and how == "lazy":
            continue
        local = os.path.join(workdir, f"local-restore-{how}")
        restored = provider_class(kind)()
        restored.init(store_id, key_schema, value_schema, StoreConf(local_dir=local, **options))
        start = time.perf_counter()
        store = restored.get_read_store(version)
        got = store.get_many(first)
        restores[how] = time.perf_counter() - start
        if sum(g is not None for g in got) != len(first):
            msg = f"{kind}: the {how} restore did not find every one of {len(first)} keys"
            raise AssertionError(msg)
        store.abort()
        restored.close()
    return {
        "rows_per_s": {"put": n / put_s, "get": len(probe) / get_s, "scan": scanned / scan_s},
        "seconds": {"put": put_s, "get": get_s, "scan": scan_s},
        "restore_s": restores["whole"],
        "lazy_restore_s": restores.get("lazy"),
        "rss_after_load_mb": rss_after_load,
        "peak_rss_mb": _rss_mb(),
    }


def _bench_raw(n: int, workdir: str) -> dict[str, Any]:
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    ids = _keys(n)
    keys = (ids.astype(">i8") ^ np.int64(-(2**63))).view(np.dtype((np.void, 8))).tolist()
    value = b"\x01" + b"\x00" * 16
    opts = Options(raw_mode=True)
    db = Rdict(os.path.join(workdir, "raw"), opts)
    wo = WriteOptions()
    wo.disable_wal = True  # type: ignore[method-assign,assignment]
    start = time.perf_counter()
    for lo in range(0, n, BATCH):
        wb = WriteBatch(raw_mode=True)
        for k in keys[lo : lo + BATCH]:
            wb.put(k, value)
        db.write(wb, wo)
    put_s = time.perf_counter() - start
    db.flush()
    rng = np.random.default_rng(11)
    probe_idx = rng.choice(n, size=min(n, 1_000_000), replace=False)
    probe = [keys[i] for i in probe_idx]
    start = time.perf_counter()
    for lo in range(0, len(probe), GET_BATCH):
        db[probe[lo : lo + GET_BATCH]]
    get_s = time.perf_counter() - start
    start = time.perf_counter()
    it = db.iter()
    it.seek_to_first()
    scanned = 0
    while it.valid():
        it.key()
        it.value()
        scanned += 1
        it.next()
    scan_s = time.perf_counter() - start
    del it
    db.close()
    return {
        "rows_per_s": {"put": n / put_s, "get": len(probe) / get_s, "scan": scanned / scan_s},
        "seconds": {"put": put_s, "get": get_s, "scan": scan_s},
        "restore_s": None,
        "peak_rss_mb": _rss_mb(),
    }


def _worker(system: str, n: int) -> None:
    workdir = tempfile.mkdtemp(prefix=f"sparkstate-bench-{system}-")
    try:
        if system == "raw-rocksdict":
            result = _bench_raw(n, workdir)
        else:
            result = _bench_provider(system.removeprefix("sparkstate-"), n, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))


def run(args: argparse.Namespace) -> int:
    n = 1_000_000 if args.quick else 10_000_000
    systems = args.systems.split(",") if args.systems else SYSTEMS
    results: dict[str, Any] = {}
    for system in systems:
        print(f"[bench store] {system}: {n:,} keys ...", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "sparkstate.bench.store", system, str(n)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        results[system] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[system]
        ops = ", ".join(f"{op} {v:,.0f}/s" for op, v in r["rows_per_s"].items())
        restore = f", restore {r['restore_s']:.2f} s" if r["restore_s"] is not None else ""
        if r.get("lazy_restore_s") is not None:
            restore += f" (lazily {r['lazy_restore_s']:.2f} s)"
        print(f"    {ops}{restore}, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    ratios: dict[str, float] = {}
    pairs = [
        ("sparkstate-rocksdb", "raw-rocksdict"),
        ("sparkstate-memory", "raw-rocksdict"),
        ("sparkstate-rocksdb", "sparkstate-memory"),
    ]
    for a, b in pairs:
        if a in results and b in results:
            for op in ("put", "get", "scan"):
                ratios[f"{a}/{b}:{op}"] = (
                    results[a]["rows_per_s"][op] / results[b]["rows_per_s"][op]
                )
    rocks = results.get("sparkstate-rocksdb") or {}
    if rocks.get("lazy_restore_s"):
        ratios["sparkstate-rocksdb:restore whole/lazy"] = (
            rocks["restore_s"] / rocks["lazy_restore_s"]
        )
    report = {"benchmark": "store", "keys": n, "systems": results, "ratios": ratios}
    print("[bench store] ratios:")
    for key, value in ratios.items():
        print(f"    {key}: {value:.2f}x")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"[bench store] wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))
