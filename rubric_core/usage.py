"""Token counts: reading a call's usage, and adding up counts a provider may not have reported.

A model call's usage is optional (some providers and local servers report none), so a sum of
counts must tell "nothing reported" (None) from zero. Every total of tokens shown or stored
(a pass's input plus output, the repeats of a pass, a cell's run) is `token_sum`; every count
read from a reply is `usage_counts`'s.

Cached tokens: LangChain reports them in ``usage_metadata["input_token_details"]`` as
``cache_read`` (OpenAI's ``prompt_tokens_details.cached_tokens``, Anthropic's
``cache_read_input_tokens``) and ``cache_creation`` (Anthropic's
``cache_creation_input_tokens``; OpenAI-compatible servers' ``cache_write_tokens``), for plain
and streamed replies alike (a stream's usage arrives on its last chunk, with
``stream_usage=True`` for OpenAI-compatible servers). Both are part of ``input_tokens``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping


class UsageCounts(NamedTuple):
    """The token counts of one model call, as its provider reported them (None: not reported)."""

    input_tokens: int | None
    """All input tokens, cached ones included."""
    cached_input_tokens: int | None
    """Input tokens read from the provider's prompt cache (0 when usage came without it)."""
    cache_creation_tokens: int | None
    """Input tokens written to the provider's prompt cache (0 when usage came without it)."""
    output_tokens: int | None
    """Output tokens."""


NO_USAGE = UsageCounts(None, None, None, None)
"""The counts of a call whose provider reported no usage."""


def usage_counts(usage: Mapping[str, Any] | None) -> UsageCounts:
    """The counts in a reply's ``usage_metadata`` (LangChain's `UsageMetadata`).

    Examples:
        >>> usage_counts({"input_tokens": 1200, "output_tokens": 30,
        ...               "input_token_details": {"cache_read": 1024}})
        UsageCounts(input_tokens=1200, cached_input_tokens=1024, cache_creation_tokens=0, \
output_tokens=30)
        >>> usage_counts(None) == NO_USAGE
        True

    """
    if not usage:
        return NO_USAGE
    details = usage.get("input_token_details") or {}
    return UsageCounts(
        int(usage.get("input_tokens") or 0), int(details.get("cache_read") or 0),
        int(details.get("cache_creation") or 0), int(usage.get("output_tokens") or 0))


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


__all__ = ["NO_USAGE", "UsageCounts", "token_sum", "usage_counts"]
