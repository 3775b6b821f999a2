"""What the command line draws, through Rich: a command's output on stdout, and the progress of a
long command on stderr.

On a terminal Rich has its width and styles; where a stream is not a terminal (a pipe, a file, a
test's capture) the output is plain text at a fixed width. A progress bar is drawn only on a
terminal: the caller asks for one where stderr is one."""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["PLAIN_WIDTH", "ProgressTask", "job_progress", "plain", "show"]

#: The least width of plain text, where the stream is not a terminal: a table is as wide as its
#: cells, and plain text as wide as its widest line (nothing is wrapped).
PLAIN_WIDTH = 160


def show(renderable: RenderableType) -> None:
    """Print ``renderable`` on stdout: with the terminal's width and styles on a terminal, else
    as :func:`plain` text."""
    if sys.stdout.isatty():
        _console().print(renderable)
        return
    sys.stdout.write(plain(renderable))


def plain(renderable: RenderableType) -> str:
    """``renderable`` as plain text, without the spaces that pad a table's cells at the ends of
    lines: what :func:`show` prints in a pipe. It is as wide as it needs, at least
    :data:`PLAIN_WIDTH`, so that no value is wrapped (a path, a URI) where a program reads it."""
    console = _console(PLAIN_WIDTH)
    widest = Measurement.get(console, console.options.update_width(2**20), renderable).maximum
    if widest > PLAIN_WIDTH:
        console = _console(widest)
    with console.capture() as captured:
        console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())


def _console(plain_width: int | None = None) -> Console:
    """A console that prints text as it is (no markup, emoji codes or highlighting read into
    it): the terminal's, or plain text ``plain_width`` wide."""
    as_text = plain_width is not None
    return Console(
        force_terminal=False if as_text else None,
        no_color=True if as_text else None,
        width=plain_width,
        markup=False,
        emoji=False,
        highlight=False,
    )


def _no_note() -> str:
    return ""


@dataclasses.dataclass(frozen=True)
class ProgressTask:
    """A bar of :func:`job_progress`: its description, its total and how to read how much is
    done (a Spark accumulator's value, read on the driver)."""

    description: str
    total: int
    done: Callable[[], int]
    #: The text after the bar, read as often as ``done``.
    note: Callable[[], str] = _no_note


@contextmanager
def job_progress(tasks: Sequence[ProgressTask], interval_s: float = 0.5) -> Iterator[None]:
    """While the block runs, a bar per task on stderr (done of total, the time elapsed), read
    every ``interval_s`` and once more at its end; the bars stay drawn as they ended. No
    tasks: nothing is drawn."""
    if not tasks:
        yield
        return
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", markup=False),
        console=Console(stderr=True, markup=False, emoji=False, highlight=False),
    )
    ids: list[tuple[TaskID, ProgressTask]] = [
        (progress.add_task(t.description, total=t.total, note=""), t) for t in tasks
    ]
    stop = threading.Event()

    def read() -> None:
        for task_id, task in ids:
            progress.update(task_id, completed=task.done(), note=task.note())

    def poll() -> None:
        while not stop.wait(interval_s):
            read()

    watcher = threading.Thread(target=poll, name="sparkstate-progress", daemon=True)
    with progress:
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
            read()
