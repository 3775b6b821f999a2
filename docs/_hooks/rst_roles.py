"""MkDocs hook: the docstrings' reStructuredText habits, rendered as Markdown readers expect.

The docstrings (rendered on the API page by mkdocstrings) write ``:func:`name``` and end a
paragraph with ``::`` before a literal block, as Sphinx takes them. Markdown has neither, so the
role prefix is dropped (the name stays code) and ``::`` reads as one colon.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj|const):(?=<code>)")
_LITERAL = re.compile(r"::</p>")


def on_page_content(html: str, **_: Any) -> str:
    return _LITERAL.sub(":</p>", _ROLE.sub("", html))
