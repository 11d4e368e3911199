"""Run untrusted candidate Python against tests, in a separate, limited child process.

The candidate code is model output, so it is never executed in the calling process. Each run:

- starts ``sys.executable -I -B -c <harness>``, where the harness is the source text of
  `rubric_core.tools._sandbox_harness` (stdlib-only: under ``-I`` the project is not on the
  child's path), in a new session (its own process group) with a fresh minimal environment
  (``PATH`` and ``LANG`` only) and a fresh temporary working directory that is removed
  afterwards;
- sets rlimits before ``exec``: CPU seconds, address space (``memory_mb``), processes, file
  size (which also caps stdout/stderr, as they go to files) and no core dumps;
- installs an audit hook in the child before the candidate runs that denies spawning processes
  (``fork``, ``exec``, ``subprocess``, ``system``, the same calls through ``ctypes``), signalling
  other processes, raising rlimits, network connections, reading other processes' ``/proc``
  entries, and writing, deleting or renaming anything outside the working directory;
- enforces a wall-clock timeout and then kills the whole process group; the group is killed
  after every run anyway, so nothing the candidate started survives it;
- receives results only on a dedicated pipe, one line per event, each prefixed with a random
  nonce, so text the candidate prints cannot forge a pass;
- for named cases, sends the child only the calls, never the expected values or exceptions:
  the child reports what each call returned or raised and this process judges it, so code that
  tampers with the harness cannot report a pass without knowing the answers.

The audit hook is defence in depth, not a boundary: code in the same interpreter can tamper with
the harness. The process boundary, rlimits, timeout and process-group kill are what hold. A
pytest-style test source runs its assertions in the child, so its verdicts are only as
trustworthy as the candidate is cooperative; prefer named cases to grade hostile code. Note
that the kernel ignores ``RLIMIT_NPROC`` for root, which is why process creation is also denied
in the child.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from collections.abc import Callable

    from langchain_core.tools import BaseTool
    from pydantic import ValidationError

DEFAULT_TIMEOUT_S = 10.0
"""Wall-clock seconds a run may take by default."""

MAX_TIMEOUT_S = 300.0
"""The largest timeout `run_tests` accepts."""

TOOL_MAX_TIMEOUT_S = 30.0
"""Timeouts asked for through the `run_python_tests` tool are clamped to this."""

MIN_MEMORY_MB = 64
"""Below this the interpreter itself cannot start."""

MAX_MEMORY_MB = 16_384
"""The largest address-space limit `run_tests` accepts."""

MAX_SOURCE_CHARS = 200_000
"""Longest candidate code or test source accepted."""

MAX_CASES = 200
"""Most test cases one run accepts."""

OUTPUT_READ_BYTES = 64 * 1024
"""At most this much of the child's stdout (head) and stderr (tail) is read back."""

OUTPUT_KEEP_CHARS = 2_000
"""At most this much of each stream is put into the result."""

FILE_LIMIT_BYTES = 1024 * 1024
"""RLIMIT_FSIZE: the largest file the child may write, its stdout and stderr included."""

PROCESS_LIMIT = 64
"""RLIMIT_NPROC headroom (the kernel counts every task of the user, and ignores it for root)."""

_RESULT_READ_BYTES = 1024 * 1024
_REASON_CHARS = 500
_CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_CASE_KEYS = ("name", "call", "args", "kwargs", "expected", "raises")
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_OPEN_FENCE = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n", re.MULTILINE)
_PYTHON_INFO = frozenset({"python", "py", "python3", "py3", "pycon", "ipython"})


TestRunResult = dict[str, Any]
"""``{"ok", "passed", "failures", "error", "stdout", "stderr"}``: ``ok`` is true only when every
test ran and passed; ``passed`` lists test names in run order; ``failures`` holds
``{"name", "reason"}`` for tests that failed or never ran; ``error`` describes a problem with the
run as a whole (bad arguments, timeout, crash, code that does not load) or is None; ``stdout``
and ``stderr`` hold the head and tail of the candidate's output (capped)."""


# The child-side program, read once at import. It goes to the child as `-c` source, not as a
# path, so no file path shows in the child's `__main__` or tracebacks (harness frames read
# `<string>`), and every run executes this text whatever happens to the file afterwards.
_HARNESS = Path(__file__).with_name("_sandbox_harness.py").read_text(encoding="utf-8")


def _fmt_seconds(seconds: float) -> str:
    text = f"{seconds:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _result(
    *,
    ok: bool = False,
    passed: list[str] | None = None,
    failures: list[dict[str, str]] | None = None,
    error: str | None = None,
    stdout: str = "",
    stderr: str = "",
) -> TestRunResult:
    return {
        "ok": ok,
        "passed": passed or [],
        "failures": failures or [],
        "error": error,
        "stdout": stdout,
        "stderr": stderr,
    }


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_cases(cases: list[Any], function: str | None) -> tuple[list[dict[str, Any]], str]:
    """Normalise test cases, or explain the first problem (empty string when none)."""
    if not cases:
        return [], "tests is an empty list: give at least one case"
    if len(cases) > MAX_CASES:
        return [], f"too many test cases ({len(cases)}; at most {MAX_CASES})"
    normal: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, case in enumerate(cases, start=1):
        where = f"test case {index}"
        if not isinstance(case, dict):
            return [], f"{where} is a {type(case).__name__}, not an object"
        name = case.get("name", f"case_{index}")
        if not isinstance(name, str) or not name.strip():
            return [], f"{where}: 'name' must be a non-empty string"
        name = name.strip()
        if name in seen:
            return [], f"{where}: duplicate test name {name!r}"
        seen.add(name)
        where = f"test case {name!r}"
        item: dict[str, Any] = {"name": name}
        if ("call" in case) == ("args" in case):
            return [], f"{where}: give exactly one of 'call' (an expression) or 'args' (a list)"
        if "call" in case:
            if not isinstance(case["call"], str) or not case["call"].strip():
                return [], f"{where}: 'call' must be a non-empty expression string"
            item["call"] = case["call"].strip()
        else:
            if not isinstance(case["args"], list):
                return [], f"{where}: 'args' must be a list of positional arguments"
            if function is None:
                return [], f"{where} uses 'args', so 'function' must name the function to call"
            item["args"] = case["args"]
            kwargs = case.get("kwargs", {})
            if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
                return [], f"{where}: 'kwargs' must be an object of keyword arguments"
            item["kwargs"] = kwargs
        if "raises" in case:
            if not isinstance(case["raises"], str) or not case["raises"].isidentifier():
                return [], f"{where}: 'raises' must be an exception class name like 'ValueError'"
            item["raises"] = case["raises"]
        elif "expected" in case:
            item["expected"] = case["expected"]
        else:
            return [], f"{where}: give 'expected' (the JSON value the call should return)"
        try:
            json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return [], f"{where} is not plain JSON data: {exc}"
        normal.append(item)
    return normal, ""


def _check_spec(
    tests: object, function: object, timeout_s: object
) -> tuple[list[dict[str, Any]] | None, str | None, str]:
    """Validate a test spec: (cases, source, problem); exactly one of cases/source is set."""
    if function is not None and (not isinstance(function, str) or not _DOTTED_NAME.match(function)):
        return None, None, f"function must be a Python name like 'solve', not {function!r}"
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not 0 < timeout_s <= MAX_TIMEOUT_S  # also false for NaN
    ):
        return None, None, f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]"
    if isinstance(tests, str):
        text = tests.strip()
        if not text:
            return None, None, "tests is empty: give test cases or pytest-style test source"
        if len(text) > MAX_SOURCE_CHARS:
            return None, None, f"the test source is too long (over {MAX_SOURCE_CHARS} characters)"
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                tests = parsed
        if isinstance(tests, str):
            return None, tests, ""
    if not isinstance(tests, list):
        return None, None, (
            "tests must be a list of cases ({'name', 'call' or 'args', 'expected'}) or a string "
            f"of pytest-style test functions, not {type(tests).__name__}"
        )
    cases, problem = _check_cases(tests, function if isinstance(function, str) else None)
    return (cases or None), None, problem


def _limits(timeout_s: float, memory_mb: int) -> list[tuple[int, int, int]]:
    """The (resource, soft, hard) limits for a child, clamped to what this process may set."""
    cpu = math.ceil(timeout_s) + 1
    memory = memory_mb * 1024 * 1024
    uid = os.geteuid()
    # Root is exempt from RLIMIT_NPROC; for anyone else it counts all their tasks, so add headroom.
    tasks = PROCESS_LIMIT if uid == 0 else _user_task_count(uid) + PROCESS_LIMIT
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_NPROC, tasks, tasks),
        (resource.RLIMIT_FSIZE, FILE_LIMIT_BYTES, FILE_LIMIT_BYTES),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    limits = []
    for kind, soft, hard in wanted:
        current = resource.getrlimit(kind)[1]
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        limits.append((kind, soft, hard))
    return limits


def _user_task_count(uid: int) -> int:
    """Tasks (threads) that `uid` runs now: what RLIMIT_NPROC is compared with."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as status:
                for line in status:
                    if line.startswith("Threads:"):
                        count += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return count


def _apply_limits(limits: list[tuple[int, int, int]]) -> None:
    # Runs in the forked child before exec: keep it to plain system calls.
    for kind, soft, hard in limits:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(kind, (soft, hard))


def _read_events(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Read the result pipe until EOF or the deadline: (data, timed_out)."""
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), True
            if not selector.select(remaining):
                continue
            data = os.read(fd, 65536)
            if not data:
                return b"".join(chunks), False
            if size < _RESULT_READ_BYTES:
                chunks.append(data[: _RESULT_READ_BYTES - size])
                size += len(chunks[-1])


def _wait_exit(pid: int, deadline: float) -> bool:
    """Wait for the child to exit without reaping it (so its pgid stays reserved)."""
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_stream(handle: IO[bytes], *, tail: bool) -> str:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - OUTPUT_READ_BYTES) if tail else 0)
    text: str = handle.read(OUTPUT_READ_BYTES).decode("utf-8", errors="replace")
    if len(text) <= OUTPUT_KEEP_CHARS:
        return text
    if tail:
        return "[truncated] ..." + text[-OUTPUT_KEEP_CHARS:]
    return text[:OUTPUT_KEEP_CHARS] + "... [truncated]"


def _exit_reason(returncode: int, stderr: str, memory_mb: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        if name == "SIGXCPU":
            return "CPU time limit exceeded (killed by signal SIGXCPU)"
        return f"killed by signal {name}"
    reason = f"process exited with code {returncode} before reporting results"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return f"memory limit exceeded ({memory_mb} MB): {reason}"
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    return f"{reason}; last stderr line: {last[:200]}" if last else reason


def _parse_events(raw: bytes, nonce: str) -> list[dict[str, Any]]:
    events = []
    prefix = nonce + " "
    for line in raw.decode("utf-8", errors="replace").splitlines():
        # `find`, not `startswith`: stray bytes the candidate wrote to the pipe may precede it.
        start = line.find(prefix)
        if start < 0:
            continue
        try:
            event = json.loads(line[start + len(prefix) :])
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _call_only(case: dict[str, Any]) -> dict[str, Any]:
    """A case as the child gets it: what to call, not what should come back."""
    return {key: value for key, value in case.items() if key not in ("expected", "raises")}


def _clip(text: object, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "... [truncated]"


def _judge(case: dict[str, Any], report: dict[str, Any]) -> tuple[bool, str]:
    """Compare what the child says one case did with what the case expects."""
    raised = report.get("raised")
    if isinstance(raised, list):
        wanted = case.get("raises")
        if wanted and wanted in raised:
            return True, ""
        return False, str(report.get("error") or "raised an exception")
    if "error" in report:
        return False, str(report["error"])
    if "raises" in case:
        return False, f"expected {case['raises']} to be raised, but it returned normally"
    expected = json.dumps(case["expected"])
    if "unjsonable" in report:
        return False, (f"expected {_clip(expected, 200)}, got a value that is not "
                       f"JSON-comparable ({report['unjsonable']})")
    if "value" not in report:
        return False, "the sandbox reported no outcome for this case"
    if report["value"] == json.loads(expected):
        return True, ""
    return False, f"expected {_clip(expected, 200)}, got {_clip(json.dumps(report['value']), 200)}"


def _assemble(
    events: list[dict[str, Any]],
    run_error: str | None,
    stdout: str,
    stderr: str,
    cases: list[dict[str, Any]] | None = None,
) -> TestRunResult:
    """Turn child events (and a run-level error, if the child never finished) into a result.

    With named ``cases`` the case list and every verdict come from this process; the child
    only says what each call returned or raised. For a test source, its verdicts are taken.
    """
    by_name = {case["name"]: case for case in cases or []}
    names: list[str] = list(by_name)
    outcomes: dict[str, tuple[bool, str]] = {}
    running: str | None = None
    error = run_error
    done = False
    for event in events:
        kind = event.get("event")
        if kind == "collected" and cases is None and isinstance(event.get("names"), list):
            names = [str(name) for name in event["names"]]
        elif kind == "start":
            running = str(event.get("name"))
        elif kind == "result":
            name = str(event.get("name"))
            if cases is None:
                outcomes[name] = (event.get("ok") is True, str(event.get("reason") or "failed"))
            elif name in by_name and name not in outcomes:
                outcomes[name] = _judge(by_name[name], event)
            running = None
        elif kind == "fatal":
            error = str(event.get("error"))
        elif kind == "done":
            done = True
    if not done and error is None:
        error = "the sandbox stopped without reporting results"
    passed = [name for name, (ok, _) in outcomes.items() if ok]
    failures = [
        {"name": name, "reason": reason} for name, (ok, reason) in outcomes.items() if not ok
    ]
    if running is not None and running not in outcomes and (cases is None or running in by_name):
        failures.append({"name": running, "reason": error or "did not finish"})
    for name in names:
        if name not in outcomes and name != running:
            failures.append({"name": name, "reason": "not run (see error)"})
    return _result(
        ok=error is None and not failures and bool(passed),
        passed=passed,
        failures=failures,
        error=error,
        stdout=stdout,
        stderr=stderr,
    )


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        # The candidate may have made parts of its directory unreadable; open them up and retry.
        for root, dirs, _ in os.walk(path):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(path, ignore_errors=True)


def run_tests(
    code: str,
    tests: list[dict[str, Any]] | str,
    *,
    function: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = 512,
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
        memory_mb: Address-space limit for the child, in MB.

    Returns:
        A `TestRunResult` dict: ``{"ok", "passed", "failures", "error", "stdout",
        "stderr"}``. Bad arguments, a timeout,
        a crash or code that does not load come back as ``ok=False`` with ``error`` explaining
        it; this function does not raise for anything the candidate or the caller got wrong.
    """
    if not isinstance(code, str) or not code.strip():
        return _result(error="code must be a non-empty string of Python source")
    if len(code) > MAX_SOURCE_CHARS:
        return _result(error=f"code is too long (over {MAX_SOURCE_CHARS} characters)")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or not (
        MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB
    ):
        return _result(error=f"memory_mb must be an integer in [{MIN_MEMORY_MB}, {MAX_MEMORY_MB}]")
    cases, source, problem = _check_spec(tests, function, timeout_s)
    if problem:
        return _result(error=f"bad test specification: {problem}")
    seconds = float(timeout_s)
    nonce = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="rubric_sandbox_")
    read_fd, write_fd = os.pipe()
    spec = {
        "nonce": nonce,
        "fd": write_fd,
        "code": code,
        "cases": None if cases is None else [_call_only(case) for case in cases],
        "source": source,
        "function": function,
        "memory_mb": memory_mb,
        "file_limit": FILE_LIMIT_BYTES,
    }
    limits = _limits(seconds, memory_mb)
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-B", "-c", _HARNESS],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=workdir,
                    env=dict(_CHILD_ENV),
                    pass_fds=(write_fd,),
                    start_new_session=True,
                    preexec_fn=lambda: _apply_limits(limits),
                )
            except OSError as exc:
                return _result(error=f"could not start the sandbox: {exc}")
            finally:
                os.close(write_fd)
            deadline = time.monotonic() + seconds
            try:
                assert proc.stdin is not None
                with proc.stdin:
                    proc.stdin.write(json.dumps(spec).encode("utf-8"))
            except (BrokenPipeError, OSError):
                pass  # the child died at once; its exit status says why
            raw, timed_out = _read_events(read_fd, deadline)
            if not timed_out:
                timed_out = not _wait_exit(proc.pid, deadline)
            _kill_group(proc.pid)
            returncode = proc.wait()
            stdout = _read_stream(out, tail=False)
            stderr = _read_stream(err, tail=True)
        events = _parse_events(raw, nonce)
        run_error: str | None = None
        if not any(event.get("event") == "done" for event in events):
            if timed_out:
                run_error = f"timed out after {_fmt_seconds(seconds)} s"
            else:
                run_error = _exit_reason(returncode, stderr, memory_mb)
        return _assemble(events, run_error, stdout, stderr, cases)
    finally:
        os.close(read_fd)
        _remove_tree(workdir)


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
    blocks = [
        (match.group("info").strip().split(" ")[0].lower().strip("{}."), match.group("body"))
        for match in _FENCE.finditer(text)
    ]
    python = [body for info, body in blocks if info in _PYTHON_INFO]
    pool = python or [body for _, body in blocks]
    if pool:
        return max(reversed(pool), key=len)  # the last of equally large blocks
    opening = _OPEN_FENCE.search(text)
    if opening:
        return text[opening.end() :]
    return text


def _validation_handler(tool_name: str) -> Callable[[ValidationError], str]:
    def handle(error: ValidationError) -> str:
        # One entry per argument; a union type reports each alternative, so join those.
        by_field: dict[str, list[str]] = {}
        for item in error.errors():
            field = str(item["loc"][0]) if item["loc"] else "arguments"
            by_field.setdefault(field, []).append(item["msg"])
        problems = "; ".join(f"{field}: {' or '.join(msgs)}" for field, msgs in by_field.items())
        return f"Invalid arguments for {tool_name}: {problems}"

    return handle


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
    if _is_number(timeout_s) and float(timeout_s) > TOOL_MAX_TIMEOUT_S:
        timeout_s = TOOL_MAX_TIMEOUT_S
    try:
        return run_tests(extract_python_code(code), tests, function=function, timeout_s=timeout_s)
    except Exception as exc:  # the grader must get an answer, not a dead run
        return _result(error=f"the test run failed: {type(exc).__name__}: {exc}")


run_python_tests: StructuredTool = StructuredTool.from_function(
    func=_run_python_tests,
    name="run_python_tests",
    description=(
        "Run the candidate's Python code against test cases in a sandbox (no network, no "
        "subprocesses, time and memory limits) and report which tests pass. Use it to verify "
        "claims about code behaviour instead of guessing."
    ),
    args_schema=_RunPythonTestsArgs,
    handle_validation_error=_validation_handler("run_python_tests"),
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
    cases, source, problem = _check_spec(tests, function, timeout_s)
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
            return _result(error=f"the test run failed: {type(exc).__name__}: {exc}")

    return StructuredTool.from_function(
        func=run,
        name=name,
        description=description,
        args_schema=_CodeArgs,
        handle_validation_error=_validation_handler(name),
    )
