"""Markdown fenced code blocks, read one way for every tool (``` or ~~~ fences, any info).

The block readers (`blocks`, `whole_block`, `unclosed_tail`) and `extract_python_code`, which
picks the candidate's code out of a markdown answer with them.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_BLOCK = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_WHOLE = re.compile(
    r"\A(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)\n?[ \t]*(?P=fence)[ \t]*\Z",
    re.DOTALL,
)
_OPEN = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n", re.MULTILINE)
_PYTHON_INFO = frozenset({"python", "py", "python3", "py3", "pycon", "ipython"})


class Block(NamedTuple):
    """One fenced block: its language word (lower-cased, ``{}.`` stripped) and its body."""

    lang: str
    body: str


def _lang(info: str) -> str:
    return info.strip().split(" ")[0].lower().strip("{}.")


def blocks(text: str) -> list[Block]:
    """Every closed fenced block in ``text``, in order."""
    return [Block(_lang(m.group("info")), m.group("body")) for m in _BLOCK.finditer(text)]


def whole_block(text: str) -> Block | None:
    """The block when one fence wraps the whole (stripped) text, else None."""
    match = _WHOLE.match(text.strip())
    return Block(_lang(match.group("info")), match.group("body")) if match else None


def unclosed_tail(text: str) -> str | None:
    """The body after the first opening fence that is never closed, else None."""
    opening = _OPEN.search(text)
    return text[opening.end():] if opening else None


def extract_python_code(text: str) -> str:
    """Pull Python source out of a markdown answer.

    Args:
        text: An answer that may hold fenced code blocks.

    Returns:
        The largest ```` ```python ```` block (the last of equally large ones), else the largest
        fenced block of any language, else the body of an unclosed final fence, else ``text``.

    """
    if not isinstance(text, str) or ("```" not in text and "~~~" not in text):
        return text
    found = blocks(text)
    python = [block.body for block in found if block.lang in _PYTHON_INFO]
    pool = python or [block.body for block in found]
    if pool:
        return max(reversed(pool), key=len)  # the last of equally large blocks
    tail = unclosed_tail(text)
    return text if tail is None else tail
