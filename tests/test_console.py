"""The command line's terminal output (Rich): plain text where stdout is no terminal, and the
progress bars of a long command on stderr."""

from __future__ import annotations

import threading

import pytest
from rich.table import Table

from sparkstate.console import ProgressTask, job_progress, plain, show


def test_output_in_a_pipe_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    """No escape codes, text printed as it is (no markup read into it), no padding at the
    ends of lines."""
    table = Table("name", "value")
    table.add_row("[bold]a[/bold]", ":smile:")
    table.add_row("b", "2")
    show(table)
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "[bold]a[/bold]" in out and ":smile:" in out
    assert all(line == line.rstrip() for line in out.splitlines())


def test_a_bar_reads_what_is_done_until_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    """Where stderr is no terminal the bars are printed once, as they ended."""
    done = [0]
    step = threading.Event()
    tasks = [ProgressTask("operator 0 (x) read", 3, lambda: done[0], lambda: f"{done[0]} rows")]
    with job_progress(tasks, interval_s=0.01):
        for _ in range(3):
            done[0] += 1
            step.wait(0.02)
    said = capsys.readouterr()
    assert said.out == ""
    (line,) = said.err.splitlines()
    assert line.startswith("operator 0 (x) read ")
    assert " 3/3 0:00:0" in line and line.endswith("3 rows")


def test_no_tasks_draw_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with job_progress([]):
        pass
    assert capsys.readouterr() == ("", "")


def test_a_long_value_in_a_pipe_is_not_wrapped() -> None:
    """A location far wider than a terminal stays on its line, whole, where a program reads it."""
    uri = "s3://bucket/" + "x" * 300 + "?endpoint_override=127.0.0.1:9000&scheme=http"
    grid = Table.grid(padding=(0, 0, 0, 2), pad_edge=True)
    grid.add_column(min_width=12, no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("location", uri)
    grid.add_row("rows", "3")
    lines = plain(grid).splitlines()
    assert lines[0].split() == ["location", uri]
    assert lines[1].split() == ["rows", "3"]
