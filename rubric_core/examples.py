"""The bundled examples: a prompt, a rubric and the grader tools that check it.

Each example runs end to end offline, with the demo worker (``"demo"``) answering and the rules
grader (``"rules"``) grading: the first draft fails at least one criterion and a revision makes
every criterion pass. With real models, the same prompts and rubrics work unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rubric_core.rubric import parse_criteria

if TYPE_CHECKING:
    from collections.abc import Callable

    from langchain_core.tools import BaseTool

FIND_DUPLICATES_TESTS_TOOL = "run_find_duplicates_tests"
"""Name of the grader tool that runs the find_duplicates test cases."""

FIND_DUPLICATES_TESTS: tuple[dict[str, Any], ...] = (
    {"name": "basic", "args": [[1, 2, 2, 3, 1]], "expected": [2, 1]},
    {"name": "empty", "args": [[]], "expected": []},
    {"name": "no_duplicates", "args": [[1, 2, 3]], "expected": []},
    {"name": "unhashable", "args": [[[1], [1], 2]], "expected": [[1]]},
)
"""Test cases for ``find_duplicates(lst)``: each calls the function with ``args``."""

PRODUCT_SCHEMA_TOOL = "check_product_schema"
"""Name of the grader tool that validates a product record against `PRODUCT_SCHEMA`."""

PRODUCT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "sku", "price", "currency", "in_stock", "tags"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "sku": {"type": "string", "pattern": "^[A-Z0-9-]+$"},
        "price": {"type": "number", "exclusiveMinimum": 0},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "additionalProperties": False,
}
"""The JSON Schema a product record must meet (currency: an ISO 4217 code such as EUR)."""


@dataclass(frozen=True)
class Example:
    """A bundled example: what to ask, how to grade it, and the tools the grader needs.

    The fields are the form a person would otherwise fill in; `grader_tools` builds fresh
    tool instances each call.
    """

    name: str
    """Short identifier (``--example NAME``, URL-safe)."""
    title: str
    """One line for menus."""
    description: str
    """What the example shows, in a sentence or two."""
    prompt: str
    """The user prompt sent to the worker."""
    rubric: str
    """The rubric, one criterion per bullet."""
    worker_system_prompt: str
    """The worker's system prompt."""
    max_iterations: int = 4
    """Grader passes allowed before the run stops."""
    tools_factory: Callable[[], list[BaseTool]] | None = field(
        default=None, repr=False, compare=False
    )
    """Builds the grader's evidence tools; None when the rubric needs none."""

    def grader_tools(self) -> list[BaseTool]:
        """The evidence tools to give the grader (empty when none are needed)."""
        return list(self.tools_factory()) if self.tools_factory else []

    def criteria(self) -> list[str]:
        """The rubric's criteria, parsed."""
        return parse_criteria(self.rubric)


def _find_duplicates_tools() -> list[BaseTool]:
    from rubric_core.tools.python_tests import python_tests_tool

    return [
        python_tests_tool(
            FIND_DUPLICATES_TESTS_TOOL,
            [dict(case) for case in FIND_DUPLICATES_TESTS],
            function="find_duplicates",
            description="Run the find_duplicates test cases (basic, empty, no_duplicates, "
            "unhashable) against Python code that defines find_duplicates(lst).",
        )
    ]


def _product_tools() -> list[BaseTool]:
    from rubric_core.tools import json_schema_tool

    return [json_schema_tool(PRODUCT_SCHEMA_TOOL, PRODUCT_SCHEMA)]


_WRITER = (
    "You are a careful writer. Follow the request exactly. When a grader's feedback arrives, "
    "revise your answer so every failing criterion passes while the passing ones still hold, "
    "and reply with the complete revised answer only."
)

_EXAMPLES: tuple[Example, ...] = (
    Example(
        name="haiku",
        title="Haiku about spring",
        description="Line and syllable counts are checked by rules; the first draft has an "
        "eight-syllable middle line and never says 'spring'.",
        prompt="Write a haiku about spring. Reply with the three lines of the poem only.",
        rubric="- The poem has three lines\n- Lines follow a 5-7-5 syllable pattern\n"
        "- The theme is spring",
        worker_system_prompt=_WRITER,
    ),
    Example(
        name="photosynthesis",
        title="One-sentence summary of photosynthesis",
        description="Sentence count and required terms; the first draft runs to two sentences "
        "and leaves out chlorophyll.",
        prompt="Write a one-sentence summary of photosynthesis.",
        rubric="- The answer is one sentence\n- The answer mentions light and chlorophyll",
        worker_system_prompt=_WRITER,
    ),
    Example(
        name="find_duplicates",
        title="Python: find_duplicates(lst)",
        description="The grader runs test cases in a sandbox; the first draft uses a set and "
        "fails on unhashable items such as lists.",
        prompt=(
            "Write a Python function `find_duplicates(lst)` that returns the elements of `lst` "
            "that appear more than once. List each duplicate once, in the order in which it "
            "first repeats, so `find_duplicates([1, 2, 2, 3, 1])` returns `[2, 1]`. The list "
            "may hold any values, lists included. Reply in markdown with the code in a "
            "```python block."
        ),
        rubric=(
            f"- All tests pass in {FIND_DUPLICATES_TESTS_TOOL}\n"
            "- The function is named `find_duplicates` and accepts a single list argument"
        ),
        worker_system_prompt=(
            "You are a senior Python engineer. Write correct, readable code. When a grader's "
            "feedback arrives, fix exactly what it reports and reply with the complete "
            "revised answer."
        ),
        tools_factory=_find_duplicates_tools,
    ),
    Example(
        name="json_product",
        title="JSON product record with a schema",
        description="The record must be bare JSON and validate against a JSON Schema; the "
        "first draft wraps it in prose, gives the price as a string and omits the currency.",
        prompt=(
            "Write a short JSON product record for an insulated stainless steel water bottle. "
            "It must validate against this JSON Schema (currency is an ISO 4217 code):\n\n"
            f"{json.dumps(PRODUCT_SCHEMA, indent=2)}\n\nReply with the JSON object only."
        ),
        rubric=(
            "- The answer is valid JSON\n"
            f"- The record validates against the JSON schema in {PRODUCT_SCHEMA_TOOL}"
        ),
        worker_system_prompt=_WRITER,
        tools_factory=_product_tools,
    ),
)

EXAMPLES: dict[str, Example] = {e.name: e for e in _EXAMPLES}
"""The bundled examples by name, in menu order."""


def list_examples() -> list[Example]:
    """The bundled examples, in menu order."""
    return list(EXAMPLES.values())


def get_example(name: str) -> Example:
    """The bundled example called `name`.

    Raises:
        KeyError: No such example; the message lists the known names.

    """
    try:
        return EXAMPLES[name]
    except KeyError:
        known = ", ".join(EXAMPLES)
        msg = f"Unknown example {name!r}. Known examples: {known}."
        raise KeyError(msg) from None
