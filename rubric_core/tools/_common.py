"""Small policies every evidence tool shares: how bad tool arguments read, what a number is."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import ValidationError


def validation_handler(tool_name: str) -> Callable[[ValidationError], str]:
    """Build a tool's ``handle_validation_error``: bad arguments become a readable answer.

    Args:
        tool_name: The tool name the message starts with.

    Returns:
        A function turning pydantic's error into one line per argument, so the grader can read
        what went wrong and call the tool again instead of the run failing.

    """

    def handle(error: ValidationError) -> str:
        # One entry per argument; a union type reports each alternative, so join those.
        by_field: dict[str, list[str]] = {}
        for item in error.errors():
            field = str(item["loc"][0]) if item["loc"] else "arguments"
            by_field.setdefault(field, []).append(item["msg"])
        problems = "; ".join(f"{field}: {' or '.join(msgs)}" for field, msgs in by_field.items())
        return f"Invalid arguments for {tool_name}: {problems}"

    return handle


def is_number(value: object) -> bool:
    """True for an int or a float, and false for a bool (which Python counts as an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
