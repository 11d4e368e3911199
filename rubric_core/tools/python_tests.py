"""Running candidate Python against tests: `run_tests` and the LangChain tools built on it.

`run_tests` is the one public entry: it checks the arguments and the test spec
(`rubric_core.tools.testspec`), runs the code in the kernel sandbox
(`rubric_core.tools.sandbox.run_child`, which sends the child the calls of named cases only)
and judges what the child reported here, outside the sandbox. `run_python_tests` is the grader's
tool for tests it writes itself; `python_tests_tool` binds a fixed test spec into a tool whose
only argument is the code, so the answer key stays with the application.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field

from rubric_core.tools import sandbox
from rubric_core.tools._common import is_number, validation_handler
from rubric_core.tools.fences import extract_python_code
from rubric_core.tools.testspec import (
    MAX_SOURCE_CHARS,
    MAX_TIMEOUT_S,
    TestRunResult,
    assemble,
    check_spec,
    run_result,
)

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

DEFAULT_TIMEOUT_S = 10.0
"""Wall-clock seconds a run may take by default."""

TOOL_MAX_TIMEOUT_S = 30.0
"""Timeouts asked for through the `run_python_tests` tool are clamped to this."""

MIN_MEMORY_MB = 64
"""Below this the interpreter itself cannot start."""

MAX_MEMORY_MB = 16_384
"""The largest address-space limit `run_tests` accepts."""

RUNS_CODE = "rubric_studio_runs_code"
"""Tool metadata key: true on tools that execute candidate code in the sandbox."""

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def run_tests(
    code: str,
    tests: list[dict[str, Any]] | str,
    *,
    function: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = 512,
    cpu_s: float | None = None,
) -> TestRunResult:
    """Run candidate code against tests in a sandboxed child process.

    Args:
        code: The candidate's Python source (untrusted).
        tests: Either a list of cases or pytest-style test source. A case is
            ``{"name", "call": "<expression using the candidate's names>", "expected"}`` or
            ``{"name", "args": [...], "kwargs": {...}, "expected"}`` (then ``function`` names
            what to call); ``"raises": "ValueError"`` may replace ``expected``. The actual value
            is compared with ``expected`` after both are normalised through JSON (tuples become
            lists). A string is test source whose ``test_*`` functions (and ``Test*`` classes'
            ``test_*`` methods) use plain ``assert``; it sees the candidate's names and may also
            ``from solution import ...``. A string holding a JSON list is read as cases.
        function: The function the ``args`` cases call (a dotted name is allowed).
        timeout_s: Wall-clock limit for the whole run, in seconds.
        memory_mb: Address-space limit for each process of the child, in MB.
        cpu_s: CPU seconds each process may use (``RLIMIT_CPU``); by default one second more
            than ``timeout_s``, rounded up.

    Returns:
        A `TestRunResult` dict: ``{"ok", "passed", "failures", "error", "stdout",
        "stderr", "sandbox"}``. Bad arguments, no sandbox, a timeout, a crash or code that
        does not load come back as ``ok=False`` with ``error`` explaining
        it; this function does not raise for anything the candidate or the caller got wrong.

    """
    if not isinstance(code, str) or not code.strip():
        return run_result(error="code must be a non-empty string of Python source")
    if len(code) > MAX_SOURCE_CHARS:
        return run_result(error=f"code is too long (over {MAX_SOURCE_CHARS} characters)")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or not (
        MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB
    ):
        bounds = f"[{MIN_MEMORY_MB}, {MAX_MEMORY_MB}]"
        return run_result(error=f"memory_mb must be an integer in {bounds}")
    cases, source, problem = check_spec(tests, function, timeout_s)
    if problem:
        return run_result(error=f"bad test specification: {problem}")
    if cpu_s is not None and (not is_number(cpu_s) or not 0 < cpu_s <= MAX_TIMEOUT_S):
        return run_result(error=f"cpu_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    seconds = float(timeout_s)
    cpu = math.ceil(cpu_s) if cpu_s is not None else math.ceil(seconds) + 1
    run = sandbox.run_child(
        code, cases=cases, source=source, function=function,
        seconds=seconds, memory_mb=memory_mb, cpu=cpu,
    )
    if not run.started:
        return run_result(error=run.error, sandbox=run.mode)
    # Judged here, outside the sandbox, against the cases' answers the child never saw.
    result = assemble(run.events, run.error, run.stdout, run.stderr, cases)
    result["sandbox"] = run.mode
    return result



class _RunPythonTestsArgs(BaseModel):
    code: str = Field(
        description="The candidate's Python source. A markdown answer is fine: the largest "
        "```python block is extracted."
    )
    tests: list[dict[str, Any]] | str = Field(
        description='Either a list of cases like {"name": "basic", "call": "f([1, 2])", '
        '"expected": [2]} or {"name": "basic", "args": [[1, 2]], "expected": [2]} (then give '
        '`function`); "raises": "ValueError" may replace "expected". Or a string of '
        "pytest-style test functions (def test_x(): assert ...) that use the candidate's names."
    )
    function: str | None = Field(
        default=None, description="The function that cases with 'args' call."
    )
    timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S,
        description=f"Wall-clock limit in seconds (at most {TOOL_MAX_TIMEOUT_S:g}).",
    )


class _CodeArgs(BaseModel):
    code: str = Field(
        description="The candidate's full Python source. A markdown answer is fine: the "
        "largest ```python block is extracted."
    )


def _run_python_tests(
    code: str,
    tests: list[dict[str, Any]] | str,
    function: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TestRunResult:
    if is_number(timeout_s) and float(timeout_s) > TOOL_MAX_TIMEOUT_S:
        timeout_s = TOOL_MAX_TIMEOUT_S
    try:
        return run_tests(extract_python_code(code), tests, function=function, timeout_s=timeout_s)
    except Exception as exc:  # the grader must get an answer, not a dead run
        return run_result(error=f"the test run failed: {type(exc).__name__}: {exc}")


run_python_tests: StructuredTool = StructuredTool.from_function(
    func=_run_python_tests,
    name="run_python_tests",
    description=(
        "Run the candidate's Python code against test cases in a sandbox (standard library "
        "only, no network, no files but its own, time and memory limits) and report which tests "
        "pass. Use it to verify "
        "claims about code behaviour instead of guessing."
    ),
    args_schema=_RunPythonTestsArgs,
    handle_validation_error=validation_handler("run_python_tests"),
    metadata={RUNS_CODE: True},
)
"""Tool: run candidate code against tests the grader writes (args: code, tests, function,
timeout_s)."""


def python_tests_tool(
    name: str,
    tests: list[dict[str, Any]] | str,
    *,
    function: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> BaseTool:
    """Build a tool that runs a fixed test spec against whatever code the grader passes.

    Args:
        name: The tool name the grader sees (letters, digits, ``_`` and ``-``; at most 64).
        tests: The test spec, as for `run_tests`.
        function: The function that ``args`` cases call.
        description: What the grader is told; a summary of the tests by default.
        timeout_s: Wall-clock limit per run, in seconds.

    Returns:
        A tool whose only argument is ``code`` and whose result is a `TestRunResult` dict.

    Raises:
        ValueError: If the name or the test spec is invalid. This is checked once, here, so a
            misconfigured tool never reaches a grader.

    """
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        msg = f"tool name must match {_TOOL_NAME.pattern}, got {name!r}"
        raise ValueError(msg)
    cases, source, problem = check_spec(tests, function, timeout_s)
    if problem:
        msg = f"bad test specification for tool {name!r}: {problem}"
        raise ValueError(msg)
    bound: list[dict[str, Any]] | str = json.loads(json.dumps(cases)) if cases else str(source)
    if description is None:
        if cases:
            listed = ", ".join(case["name"] for case in cases[:10])
            more = f" and {len(cases) - 10} more" if len(cases) > 10 else ""
            summary = f"{len(cases)} fixed test case(s) ({listed}{more})"
        else:
            summary = "a fixed pytest-style test suite"
        description = (
            f"Run the candidate's Python code against {summary} in a sandbox and report which "
            "pass. Pass the complete code as `code`."
        )

    def run(code: str) -> TestRunResult:
        try:
            return run_tests(
                extract_python_code(code), bound, function=function, timeout_s=float(timeout_s)
            )
        except Exception as exc:  # the grader must get an answer, not a dead run
            return run_result(error=f"the test run failed: {type(exc).__name__}: {exc}")

    return StructuredTool.from_function(
        func=run,
        name=name,
        description=description,
        args_schema=_CodeArgs,
        handle_validation_error=validation_handler(name),
        metadata={RUNS_CODE: True},
    )
