"""Token counts: adding up counts a provider may or may not have reported.

A model call's usage is optional (some providers and local servers report none), so a sum of
counts must tell "nothing reported" (None) from zero. Every total of tokens shown or stored
(a pass's input plus output, the repeats of a pass, a cell's run) is `token_sum`.
"""

from __future__ import annotations


def token_sum(*counts: int | None) -> int | None:
    """The sum of the counts that were reported; None when none was.

    Args:
        *counts: Token counts, None where a provider reported none.

    Returns:
        The sum of the known counts, or None when every count is None (or none is given).

    Examples:
        >>> token_sum(120, 30)
        150
        >>> token_sum(120, None)
        120
        >>> token_sum(None, None) is None
        True

    """
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


__all__ = ["token_sum"]
