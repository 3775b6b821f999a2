"""What the command line draws, through Rich: a command's output on stdout.

On a terminal Rich has its width and styles; where a stream is not a terminal (a pipe, a file, a
test's capture) the output is plain text at a fixed width."""

from __future__ import annotations

import sys

from rich.console import Console, RenderableType

__all__ = ["PLAIN_WIDTH", "output", "show"]

#: The width of plain text, where the stream is not a terminal: a table is as wide as its
#: cells up to this, and a line longer than this is wrapped.
PLAIN_WIDTH = 160


def output() -> Console:
    """A console on stdout: the terminal's width and styles on a terminal, else plain text at
    :data:`PLAIN_WIDTH`. Text is printed as it is: no markup, emoji codes or highlighting read
    into it."""
    terminal = sys.stdout.isatty()
    return Console(
        force_terminal=None if terminal else False,
        no_color=None if terminal else True,
        width=None if terminal else PLAIN_WIDTH,
        markup=False,
        emoji=False,
        highlight=False,
    )


def show(renderable: RenderableType) -> None:
    """Print ``renderable`` on stdout (:func:`output`); as plain text, without the spaces that
    pad a table's cells at the ends of lines."""
    console = output()
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
