"""Evidence tools a grader model may call instead of guessing.

- `run_python_tests` runs candidate code against tests in a sandboxed child process
  (`python_tests_tool` binds a fixed test spec into a one-argument tool); the kernel boundary
  itself is `rubric_core.tools.sandbox`, and the verdicts are made outside it
  (`rubric_core.tools.testspec`);
- `text_stats` counts lines, words, sentences, characters and syllables per line;
- `check_text` runs one exact check (substring, regex, length, JSON, JSON Schema);
- `json_schema_tool` builds a one-argument tool that validates JSON against a fixed schema.

Every tool answers bad arguments with a readable message in its result rather than raising, so
the grader can read what went wrong and try again. The plain functions behind the tools
(`run_tests`, `text_stats_data`, `run_check`, `count_syllables`, `extract_python_code`) are
exported for code that needs the same evidence without a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rubric_core.tools.checks import check_text, json_schema_tool, run_check
from rubric_core.tools.fences import extract_python_code
from rubric_core.tools.python_tests import python_tests_tool, run_python_tests, run_tests
from rubric_core.tools.text import count_syllables, text_stats, text_stats_data

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

DEFAULT_TOOLS: dict[str, BaseTool] = {
    "run_python_tests": run_python_tests,
    "text_stats": text_stats,
    "check_text": check_text,
}
"""The general-purpose evidence tools, by name."""

__all__ = [
    "DEFAULT_TOOLS",
    "check_text",
    "count_syllables",
    "extract_python_code",
    "json_schema_tool",
    "python_tests_tool",
    "run_check",
    "run_python_tests",
    "run_tests",
    "text_stats",
    "text_stats_data",
]
