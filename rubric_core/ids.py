"""Ids as people give them: whole, or a prefix that names one (as the app and CLI show them).

One rule for every place that takes an id typed or pasted by a person (``analytics --run``, a
``?run=`` link): the whole id, or a prefix that exactly one id starts with; anything else is
refused with a reason that says what to give instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def unique_id(kind: str, key: str, ids: Iterable[str]) -> str:
    """The one id of ``ids`` equal to ``key`` or starting with it.

    Args:
        kind: What the ids are (``run``, ``experiment``), for the message.
        key: The id or prefix given.
        ids: The ids there are.

    Raises:
        ValueError: No id, or several, start with ``key``.

    """
    known = list(ids)
    if key in known:
        return key
    matches = [i for i in known if key and i.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    msg = (f"no {kind} {key!r} in this database" if not matches else
           f"{kind} id {key!r} is ambiguous ({len(matches)} match): give more characters")
    raise ValueError(msg)


__all__ = ["unique_id"]
