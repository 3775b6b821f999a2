"""``sparkstate report``: the page of a real query's checkpoint (a windowed aggregation with a
watermark, late rows and a restart), checked chart by chart against the query's progress log;
then the page of logs made up to be awkward (old lines, hostile text, 10k batches, an object
store), the errors, and the page as a browser renders it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from sparkstate import cli
from sparkstate.exceptions import MissingVersionError
from sparkstate.files.durable import DurableDir
from sparkstate.observe import units
from sparkstate.observe.charts import COLUMNS, PALETTE
from sparkstate.observe.progress_log import read_progress_log
from sparkstate.observe.report import CHARTS, render

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

SCHEMA = "k string, ts timestamp, v int"
LATE = {"k": "late", "ts": "2024-01-01T00:00:50Z", "v": 0}  # behind the watermark from batch 1


def at(seconds: int) -> str:
    return f"2024-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}Z"


def rows(batch: int) -> list[dict[str, Any]]:
    """Five keys at the batch's seconds, and a late row."""
    return [{"k": f"k{j}", "ts": at(100 + 10 * batch + j), "v": j} for j in range(5)] + [LATE]


# --- a real query's checkpoint ----------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The checkpoint of a windowed count, run over three files, stopped, then over two more:
    two runs, and late rows dropped by the watermark."""
    import sparkstate as ss
    from sparkstate import functions as SF
    from sparkstate.testing import FileFeed

    base = tmp_path_factory.mktemp("report")
    feed = FileFeed(base / "input")
    chk = str(base / "chk")

    def run() -> None:
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(feed.path))
        q = (
            ss.stream(df)
            .withWatermark("ts", "10 seconds")
            .groupBy(SF.window("ts", "10 seconds"), "k")
            .agg(SF.count("*").alias("n"))
            .writeStream.outputMode("append")
            .format("noop")
            .option("checkpointLocation", chk)
            .option("stateStore", "rocksdb")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    for b in range(3):
        feed.add(rows(b))
    run()
    for b in range(3, 5):
        feed.add(rows(b))
    run()
    return chk


@pytest.fixture(scope="module")
def logged(checkpoint: str) -> list[dict[str, Any]]:
    """The query's progress log, as the engine wrote it."""
    path = Path(checkpoint, "sparkstate", "progress.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def page(checkpoint: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("page") / "report.html"
    assert cli.main(["report", checkpoint, "-o", str(out)]) == 0
    return out.read_text()


class Charts(HTMLParser):
    """The charts of a page: title -> series label -> (batch ids, values) as drawn, and the
    restart marks of each chart."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.series: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
        self.marks: dict[str, int] = {}
        self.notes: dict[str, str] = {}
        self._title: str | None = None
        self._in: str | None = None
        self._label = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figcaption" or (tag == "p" and self._title is not None):
            self._in = tag
        if "data-label" in a:
            self._label = a["data-label"] or ""
        if "data-x" in a and self._title is not None:
            xs, ys = self.series[self._title].setdefault(self._label, ([], []))
            xs.extend(int(x) for x in (a["data-x"] or "").split())
            ys.extend(float(y) for y in (a["data-y"] or "").split())
        if tag == "g" and a.get("class") == "restart" and self._title is not None:
            self.marks[self._title] += 1

    def handle_data(self, data: str) -> None:
        if self._in == "figcaption":
            self._title = data
            self.series[data] = {}
            self.marks[data] = 0
        elif self._in == "p" and self._title is not None:
            self.notes[self._title] = data

    def handle_endtag(self, tag: str) -> None:
        self._in = None
        if tag == "figure":
            self._title = None


def present(values: list[Any]) -> tuple[list[int], list[float]]:
    """(batch ids, values) of the batches that have a value."""
    kept = [(b, float(v)) for b, v in values if v is not None]
    return [b for b, _ in kept], [v for _, v in kept]


def per_batch(logged: list[dict[str, Any]], pick: Any) -> tuple[list[int], list[float]]:
    return present([(p["batchId"], pick(p)) for p in logged])


def assert_drawn(drawn: tuple[list[int], list[float]], expected: tuple[list[int], list[float]]):
    assert drawn[0] == expected[0]
    assert drawn[1] == pytest.approx(expected[1], rel=1e-5)


def test_unless_told_the_page_goes_to_the_temporary_directory(
    checkpoint: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``--out`` the command writes nothing where it is run from: the page goes to
    the system's temporary directory, named after the checkpoint, and the command says so."""
    here, temporary = tmp_path / "here", tmp_path / "temporary"
    here.mkdir()
    temporary.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    assert cli.main(["report", checkpoint]) == 0
    out = temporary / f"sparkstate-report-{Path(checkpoint).name}.html"
    assert f"wrote {out}:" in capsys.readouterr().out
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert list(here.iterdir()) == []


def test_the_command_says_where_it_wrote_and_how_many_batches(
    checkpoint: str, logged: list[dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "sub" / "r.html"
    assert cli.main(["report", checkpoint, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}: {len(logged)} batches (0 to {len(logged) - 1})" in said
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_the_real_query_ran_twice_and_dropped_late_rows(logged: list[dict[str, Any]]) -> None:
    """What the charts below rest on."""
    assert len({p["runId"] for p in logged}) == 2
    assert sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in logged) > 0
    assert all("sstBytes" in p["stateOperators"][0]["customMetrics"] for p in logged)


def test_every_chart_is_drawn_with_a_mark_at_the_restart(
    page: str, logged: list[dict[str, Any]]
) -> None:
    charts = Charts(page)
    assert list(charts.series) == list(CHARTS.values())
    assert all(charts.series[t] for t in CHARTS.values()), charts.notes
    assert set(charts.marks.values()) == {1}  # the second run
    restart = next(p["batchId"] for p in logged if p["runId"] != logged[0]["runId"])
    assert f"from batch {restart} at" in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_each_series_draws_the_values_of_the_log(page: str, logged: list[dict[str, Any]]) -> None:
    charts = Charts(page).series
    op = "op 0 stateStoreSave"

    def state(field: str) -> Any:
        return lambda p: p["stateOperators"][0][field]

    def custom(field: str) -> Any:
        return lambda p: p["stateOperators"][0]["customMetrics"].get(field)

    rates = charts["Input and processing rate"]
    assert_drawn(
        rates["processed rows/s"], per_batch(logged, lambda p: p["processedRowsPerSecond"])
    )
    assert_drawn(charts["State rows"][op], per_batch(logged, state("numRowsTotal")))
    assert_drawn(charts["State memory"][op], per_batch(logged, state("memoryUsedBytes")))
    assert_drawn(charts["State on disk"][f"{op} SST files"], per_batch(logged, custom("sstBytes")))
    written = charts["Bytes written to the checkpoint"]
    assert_drawn(written[f"{op} changelog"], per_batch(logged, custom("changelogBytesWritten")))
    dropped = charts["Rows dropped by the watermark"][op]
    assert_drawn(dropped, per_batch(logged, state("numRowsDroppedByWatermark")))
    assert sum(dropped[1]) > 0

    phases = charts["Batch duration by phase"]
    # A batch through Spark's tasks reports ``statefulStage``, one whose state ran from the
    # driver ``directState``; each is drawn as 0 where a batch did not report it.
    for phase in ("statefulStage", "directState", "stateCommit"):
        assert any(phase in p["durationMs"] for p in logged), phase
        drawn = per_batch(logged, lambda p, n=phase: p["durationMs"].get(n, 0))
        assert_drawn(phases[phase], drawn)
    stacked = [sum(v) for v in zip(*(ys for _, ys in phases.values()), strict=True)]
    assert stacked == pytest.approx([p["durationMs"]["triggerExecution"] for p in logged])

    def watermark(p: dict[str, Any]) -> float | None:
        ms = units.parse_time_ms(p["eventTime"]["watermark"])
        return ms if ms else None  # the epoch: none yet

    assert_drawn(charts["Watermark"]["watermark"], per_batch(logged, watermark))


def test_the_header_and_the_last_batches(page: str, logged: list[dict[str, Any]]) -> None:
    assert logged[0]["id"] in page
    for run_id in {p["runId"] for p in logged}:
        assert f"<code>{run_id}</code>" in page  # the runs table
    assert f"0 to {len(logged) - 1} ({len(logged)} logged)" in page
    dropped = sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in logged)
    assert f"<dt>dropped by watermark</dt><dd>{dropped}</dd>" in page
    table = page[page.index("<h2>Last ") :]
    assert table.count("<tr>") == len(logged) + 1


# --- made-up logs -----------------------------------------------------------------------------


def progress(batch: int, **fields: Any) -> dict[str, Any]:
    """A progress line of batch ``batch`` as the engine writes it, with ``fields`` over it."""
    time = f"2024-01-01T{batch // 3600 % 24:02d}:{batch // 60 % 60:02d}:{batch % 60:02d}Z"
    line: dict[str, Any] = {
        "id": "q",
        "runId": "run-1",
        "name": None,
        "batchId": batch,
        "timestamp": time,
        "numInputRows": 100,
        "processedRowsPerSecond": 100.0 + batch % 7,
        "durationMs": {"statefulStage": 50 + batch % 11, "stateCommit": 3, "triggerExecution": 60},
        "eventTime": {"watermark": time},
        "stateOperators": [
            {
                "operatorName": "stateStoreSave",
                "numRowsTotal": batch,
                "numRowsDroppedByWatermark": batch % 3,
                "memoryUsedBytes": 1000 + batch,
                "customMetrics": {"sstBytes": 2000 + batch, "changelogBytesWritten": 10},
            }
        ],
        "sink": {"description": "noop", "numOutputRows": 1},
    }
    return {**line, **fields}


def write_log(root: Path, lines: list[dict[str, Any]], tail: str = "") -> str:
    path = root / "sparkstate" / "progress.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in lines) + tail)
    return str(root)


def report(checkpoint: str, out: Path) -> str:
    assert cli.main(["report", checkpoint, "-o", str(out)]) == 0
    return out.read_text()


def test_text_from_the_log_is_escaped(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script>&'
    op = {**progress(0)["stateOperators"][0], "operatorName": hostile}
    lines = [
        progress(0, name=hostile, runId=hostile, stateOperators=[op]),
        progress(1, name=hostile, runId="<b>2</b>", durationMs={hostile: 5, "triggerExecution": 9}),
    ]
    page = report(write_log(tmp_path, lines), tmp_path / "r.html")
    assert "<script" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in page
    assert hostile in Charts(page).series["Batch duration by phase"]  # the parser unescapes


def test_older_lines_without_some_fields_leave_gaps(tmp_path: Path) -> None:
    """Lines of older versions lack the custom metrics, the event time, the phases."""
    old = progress(0)
    del old["eventTime"], old["durationMs"], old["processedRowsPerSecond"]
    old["stateOperators"] = [{"operatorName": "stateStoreSave", "numRowsTotal": 7}]
    older = {"batchId": 1, "timestamp": "2024-01-01T00:00:01Z"}  # hardly anything
    lines = [old, older, *(progress(b) for b in range(2, 6))]
    charts = Charts(report(write_log(tmp_path, lines), tmp_path / "r.html")).series
    assert charts["State rows"]["op 0 stateStoreSave"][0] == [0, 2, 3, 4, 5]
    assert charts["State on disk"]["op 0 stateStoreSave SST files"][0] == [2, 3, 4, 5]
    assert charts["Input and processing rate"]["processed rows/s"][0] == [2, 3, 4, 5]
    assert charts["Batch duration by phase"]["statefulStage"][0] == [0, 1, 2, 3, 4, 5]


def test_a_log_without_operators_or_watermark_says_so(tmp_path: Path) -> None:
    lines = [progress(b, stateOperators=[], eventTime={}) for b in range(3)]
    charts = Charts(report(write_log(tmp_path, lines), tmp_path / "r.html"))
    assert "no stateful operator" in charts.notes["State rows"]
    assert "no watermark" in charts.notes["Watermark"]


def test_several_operators_are_a_series_each(tmp_path: Path) -> None:
    ops = [
        {"operatorName": name, "numRowsTotal": 10 * i, "memoryUsedBytes": i}
        for i, name in enumerate(["stateStoreSave", "dedupe"])
    ]
    lines = [progress(b, stateOperators=ops) for b in range(4)]
    page = report(write_log(tmp_path, lines), tmp_path / "r.html")
    drawn = Charts(page).series["State rows"]
    assert drawn == {"op 0 stateStoreSave": ([0, 1, 2, 3], [0.0] * 4),
                     "op 1 dedupe": ([0, 1, 2, 3], [10.0] * 4)}  # fmt: skip
    assert page.count('<span class="swatch"') >= 2 * 3  # legends of the per-operator charts


def test_a_line_being_written_is_left_out(tmp_path: Path) -> None:
    root = write_log(tmp_path, [progress(0), progress(1)], tail='{"batchId": 2, "times')
    assert [p["batchId"] for p in read_progress_log(root).batches] == [0, 1]


def test_a_batch_logged_twice_counts_once_as_its_last_run(tmp_path: Path) -> None:
    root = write_log(tmp_path, [progress(0), progress(1, numInputRows=1), progress(1)])
    batches = read_progress_log(root).batches
    assert [(p["batchId"], p["numInputRows"]) for p in batches] == [(0, 100), (1, 100)]


def test_ten_thousand_batches_make_a_small_page(tmp_path: Path) -> None:
    lines = [progress(b, runId=f"run-{b // 4000}") for b in range(10_000)]
    lines[5_000]["durationMs"] = {"statefulStage": 9_000, "triggerExecution": 9_100}
    lines[7_001]["processedRowsPerSecond"] = 1e6
    page = report(write_log(tmp_path, lines), tmp_path / "r.html")
    assert len(page.encode()) < 2_000_000
    charts = Charts(page)
    assert set(charts.marks.values()) == {2}
    for title in CHARTS.values():
        for label, (xs, ys) in charts.series[title].items():
            assert 0 < len(xs) == len(ys) <= 2 * COLUMNS, (title, label)
    # downsampled, the spikes stay
    assert 5_000 in charts.series["Batch duration by phase"]["statefulStage"][0]
    assert max(charts.series["Input and processing rate"]["processed rows/s"][1]) == 1e6


def test_a_checkpoint_on_an_object_store_is_read_through_durable_dir() -> None:
    """Where nothing can be appended, each batch's progress is a file of its own (``mock://``:
    Arrow's in-memory file system, taken for an object store)."""
    root = DurableDir("mock:///bucket/chk")
    per_batch = root.child("sparkstate", "progress")
    for b in (0, 1, 2, 10):
        per_batch.write_atomic(f"{b}.json", json.dumps(progress(b)).encode())
    per_batch.write_atomic("notes.txt", b"not a batch")
    log = read_progress_log(root)
    assert [p["batchId"] for p in log.batches] == [0, 1, 2, 10]
    assert log.where == "mock:///bucket/chk/sparkstate/progress"
    with pytest.raises(MissingVersionError, match=r"progress.jsonl nor mock:///elsewhere/spark"):
        read_progress_log(DurableDir("mock:///elsewhere"))
    assert Charts(render(log, root.uri)).series["State rows"]["op 0 stateStoreSave"][0] == [
        0, 1, 2, 10,
    ]  # fmt: skip


def test_a_missing_log_names_the_file_and_what_to_do(tmp_path: Path, capsys: Any) -> None:
    assert cli.main(["report", str(tmp_path / "nowhere"), "-o", str(tmp_path / "r.html")]) == 1
    said = capsys.readouterr().err
    assert str(tmp_path / "nowhere" / "sparkstate" / "progress.jsonl") in said
    assert "checkpointLocation of a sparkstate query" in said
    assert not (tmp_path / "r.html").exists()


def test_an_empty_log_says_to_wait_for_a_batch(tmp_path: Path) -> None:
    root = write_log(tmp_path, [], tail="\n")
    with pytest.raises(MissingVersionError, match=r"progress.jsonl holds no batch yet: let the"):
        read_progress_log(root)


def test_a_damaged_line_is_named(tmp_path: Path, capsys: Any) -> None:
    root = write_log(tmp_path, [progress(0)], tail="{oops\n" + json.dumps(progress(2)) + "\n")
    assert cli.main(["report", root, "-o", str(tmp_path / "r.html")]) == 1
    assert "progress.jsonl (line 2): is not valid JSON" in capsys.readouterr().err


# --- in a browser -----------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


@pytest.fixture(scope="module")
def browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip(f"no headless browser on PATH (looked for {', '.join(BROWSERS)})")
    return found


def headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def test_a_browser_renders_every_chart(page: str, browser: str, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    html.write_text(page)
    dom = headless(browser, tmp_path / "profile", "--dump-dom", html.as_uri()).stdout
    assert dom.count("<svg") == len(CHARTS)
    assert dom.count('class="series"') >= len(CHARTS)
    image = pytest.importorskip("PIL.Image")
    shot = tmp_path / "page.png"
    headless(browser, tmp_path / "profile", "--window-size=1100,2400", f"--screenshot={shot}",
             html.as_uri())  # fmt: skip
    with image.open(shot) as png:
        pixels = {c: n for n, c in png.convert("RGB").getcolors(1 << 20) or []}
    first = tuple(int(PALETTE[0][k : k + 2], 16) for k in (1, 3, 5))
    # far more than the legends' swatches (10 x 10 pixels each): the charts are drawn
    assert pixels.get(first, 0) > 5_000, sorted(pixels.items(), key=lambda kv: -kv[1])[:5]


# --- numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "value", "text"),
    [
        (units.count, 0, "0"),
        (units.count, 0.25, "0.25"),
        (units.count, 999, "999"),
        (units.count, 1234, "1.23k"),
        (units.count, 999_600, "1M"),
        (units.count, 12_300_000, "12.3M"),
        (units.rate, 1200.5, "1.2k/s"),
        (units.byte_size, 512, "512 bytes"),
        (units.byte_size, 3_400_000, "3.4 MB"),
        (units.byte_size, 25e9, "25.0 GB"),
        (units.duration_ms, 850, "850 ms"),
        (units.duration_ms, 1200, "1.2 s"),
        (units.duration_ms, 150_000, "2.5 min"),
        (units.duration_ms, 7_200_000, "2 h"),
        (units.epoch_ms, 1_704_067_300_000, "2024-01-01 00:01:40"),
        (units.epoch_ms, 1_704_067_300_120, "2024-01-01 00:01:40.120"),
    ],
)
def test_values_read_as_a_person_reads_them(fmt: Any, value: float, text: str) -> None:
    assert fmt(value) == text
