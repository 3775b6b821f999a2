"""``scripts/compat``: sparkstate installed as a user installs it, on each supported PySpark.

1. The wheel and the sdist are built from this checkout (``python -m build``) into
   ``.compat/dist`` (``SPARKSTATE_COMPAT_DIR`` moves ``.compat``).
2. For each PySpark version, an environment ``.compat/pyspark-<version>`` holds that PySpark,
   installed first, as on a machine that has it already; then the wheel is installed into it, and
   it must leave that PySpark in place. The environment is kept between runs (rebuilt when
   ``constraints.txt`` changes; the wheel, with what it needs, is installed again each run).
3. In it, ``sparkstate --version`` and the demo run, then the compatibility suite: the tests of
   ``tests/`` marked ``versions``, importing the installed wheel. A test the version refuses at
   ``start()`` ("... needs PySpark X") is reported skipped, with the refusal.

A table at the end: each version, its tests passed, failed and skipped, and the refusals.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUPPORTED = ("4.0", "4.1", "4.2", "4.3")
#: Pinned for the main environment; each compatibility environment takes its own.
OWN_PINS = ("pyspark", "py4j")
TEST_TOOLS = ("pytest", "pytest-xdist", "hypothesis")
#: The demo's size in the compatibility run (it checks that the installed wheel runs).
DEMO_BATCHES = "3"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/compat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("versions", nargs="*", metavar="VERSION", help="default: all")
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the environments only (each PySpark with the test tools; no wheel)",
    )
    parser.add_argument(
        "--install-only",
        action="append",
        default=[],
        metavar="VERSION",
        help="on VERSION, install the wheel and run the demo, not the suite (CI: the newest "
        "version, whose suite ran in the main test run)",
    )
    words = sys.argv[1:] if argv is None else argv
    cut = words.index("--") if "--" in words else len(words)
    args = parser.parse_args(words[:cut])  # what follows "--" goes to pytest
    if not args.versions and not args.install_only:
        args.versions = list(SUPPORTED)
    unknown = [v for v in [*args.versions, *args.install_only] if v not in SUPPORTED]
    if unknown:
        parser.error(f"unsupported PySpark version(s) {unknown}; supported: {list(SUPPORTED)}")
    root = Path(os.environ.get("SPARKSTATE_COMPAT_DIR", REPO / ".compat"))
    if args.build_only:  # each version's PySpark and test tools; no wheel yet
        for version in [*args.versions, *args.install_only]:
            build(root, version)
        return 0
    wheel = build_dist(root / "dist")
    rows = []
    for version in [*args.versions, *args.install_only]:
        env = build(root, version)
        installed = install(env, wheel)
        demo(env, installed, root / f"demo-{version}")
        if version in args.install_only:
            continue
        pytest_args = words[cut + 1 :]
        rows.append(run_suite(env, installed, root / f"results-{version}.xml", pytest_args))
    if rows:
        print_table(rows)
    return 0 if all(r.failed == 0 and r.passed > 0 for r in rows) else 1


def build_dist(out: Path) -> Path:
    """The wheel and the sdist of this checkout, built into ``out``; the wheel's path."""
    shutil.rmtree(out, ignore_errors=True)
    print("building the wheel and the sdist ...", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        print(done.stdout[-5000:], done.stderr[-5000:], sep="\n")
        msg = f"python -m build failed (exit {done.returncode})"
        raise SystemExit(msg)
    built = sorted(p.name for p in out.iterdir())
    wheels = [out / n for n in built if n.endswith(".whl")]
    if len(wheels) != 1 or not any(n.endswith(".tar.gz") for n in built):
        msg = f"python -m build made {built}, not one wheel and one sdist"
        raise SystemExit(msg)
    print(f"built {', '.join(built)}", flush=True)
    return wheels[0]


def build(root: Path, version: str) -> Path:
    """The environment of PySpark ``version`` (PySpark, then the pinned dependencies and the
    test tools), built unless it is there and current."""
    env = root / f"pyspark-{version}"
    stamp = env / "sparkstate-compat.stamp"
    want = _digest(version)
    if stamp.exists() and stamp.read_text() == want:
        return env
    print(f"building the environment of PySpark {version} in {env} ...", flush=True)
    started = time.monotonic()
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(env)], check=True)
    pins = env / "constraints.txt"
    pins.write_text(
        "".join(
            line + "\n"
            for line in (REPO / "constraints.txt").read_text().splitlines()
            if line.split("==")[0].strip().lower() not in OWN_PINS
        )
    )
    pip = [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "-c", str(pins), f"pyspark=={version}.*"], check=True)
    subprocess.run([*pip, "install", "-c", str(pins), *TEST_TOOLS], check=True)
    stamp.write_text(want)
    print(f"built in {time.monotonic() - started:.0f} s", flush=True)
    return env


def _pyspark_version(env: Path) -> str:
    return subprocess.run(
        [str(env / "bin" / "python"), "-c", "import pyspark; print(pyspark.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def install(env: Path, wheel: Path) -> str:
    """The wheel (with its ``connect`` extra) into ``env``, as a user installs it beside the
    PySpark they have: that PySpark must stay. Its version."""
    before = _pyspark_version(env)
    pip = [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "uninstall", "-y", "sparkstate"], check=True, capture_output=True)
    subprocess.run(
        [*pip, "install", "-c", str(env / "constraints.txt"), f"{wheel}[connect]"], check=True
    )
    after = _pyspark_version(env)
    if after != before:
        msg = f"installing {wheel.name} replaced PySpark {before} with {after}"
        raise SystemExit(msg)
    shown = subprocess.run(
        [str(env / "bin" / "sparkstate"), "--version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    print(f"{wheel.name} installed beside PySpark {before}: {shown}", flush=True)
    return before


def demo(env: Path, installed: str, out: Path) -> None:
    """The demo, from the installed wheel (a short run)."""
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run(
        [str(env / "bin" / "sparkstate"), "demo", "--batches", DEMO_BATCHES, "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=out.parent,
    )
    if done.returncode:
        print(done.stdout[-5000:], done.stderr[-5000:], sep="\n")
        msg = f"the demo failed beside PySpark {installed} (exit {done.returncode})"
        raise SystemExit(msg)
    last = done.stdout.strip().splitlines()[-1:] or [""]
    print(f"the demo ran in {time.monotonic() - started:.0f} s: {last[0]}", flush=True)


def _digest(version: str) -> str:
    h = hashlib.sha256(version.encode())
    h.update((REPO / "constraints.txt").read_bytes())
    return h.hexdigest()


@dataclasses.dataclass
class Result:
    """One version's run of the suite: ``skipped`` counts the tests skipped by reason."""

    version: str
    seconds: float
    passed: int = 0
    failed: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)


def run_suite(env: Path, installed: str, xml: Path, extra: list[str]) -> Result:
    python = env / "bin" / "python"
    xml.unlink(missing_ok=True)  # a run that writes none must not read an earlier one's
    print(f"\n=== PySpark {installed}: the compatibility suite ===", flush=True)
    started = time.monotonic()
    cmd = [
        str(python),
        "-m",
        "pytest",
        "-m",
        "versions",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        "-q",
        *extra,
    ]
    workers = int(os.environ.get("SPARKSTATE_TEST_WORKERS", "2"))  # as scripts/test
    if workers > 0:
        cmd[3:3] = ["-n", str(workers), "--dist", "loadfile"]
    # The JIT's first tier as in the main run, without its class archive: written once per
    # PySpark, it would cost this one run more than it saves.
    run_env = {
        **os.environ,
        "SPARKSTATE_COMPAT_RUN": "1",
        "SPARK_SUBMIT_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1"),
    }
    subprocess.run(cmd, cwd=REPO, check=False, env=run_env)
    result = Result(installed, time.monotonic() - started)
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            skip = case.find("skipped")
            if skip is not None:
                reason = (skip.get("message") or "").removeprefix("Skipped: ")
                result.skipped[reason] = result.skipped.get(reason, 0) + 1
            elif case.find("failure") is not None or case.find("error") is not None:
                result.failed += 1
            else:
                result.passed += 1
    return result


def print_table(rows: list[Result]) -> None:
    print("\n| PySpark | passed | failed | skipped | time |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        skipped = sum(r.skipped.values())
        print(f"| {r.version} | {r.passed} | {r.failed} | {skipped} | {r.seconds:.0f} s |")
    for r in rows:
        for reason, n in sorted(r.skipped.items()):
            print(f"PySpark {r.version}: {n} skipped: {reason}")


if __name__ == "__main__":
    sys.exit(main())
