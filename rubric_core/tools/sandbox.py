"""Run untrusted candidate Python against tests, in a kernel-enforced sandbox.

The candidate code is model output, so it is never executed in the calling process. Each run
starts the base interpreter as ``python -I -S -B -c <harness>`` (the harness is the source text
of `rubric_core.tools._sandbox_harness`, stdlib-only) through `rubric_core.tools.isolation`:
by default under bubblewrap, in its own user, PID, network, IPC, UTS and mount namespaces, with
a seccomp filter, a read-only system, no project files and a size-limited work dir. Where that
is not possible the run is refused with a message saying what to install or enable, unless the
operator opted into the weaker ``RUBRIC_STUDIO_SANDBOX=unsafe-process``; every result names
the mode it ran in (``sandbox``).

Limits, each enforced by the kernel and each reported as a failure with its reason: wall clock
(the whole sandbox is killed), CPU seconds (``RLIMIT_CPU``), memory (``RLIMIT_AS`` per
process), file size and output size (``RLIMIT_FSIZE``, which also caps stdout/stderr, as they go
to files), total bytes in the work dir (the tmpfs size), processes and threads
(``RLIMIT_NPROC``, counted inside the sandbox's own user namespace) and no core dumps.

Verdicts: results come back only on a dedicated pipe, one line per event, each prefixed with a
random nonce, so text the candidate prints cannot forge a pass. For named cases the child gets
only the calls, never the expected values or exceptions; it reports what each call returned or
raised (an exception as the dotted paths that resolve to its class and bases) and this process
judges it, so code that tampers with the harness cannot report a pass without knowing the
answers, and an exception class that only borrows a builtin's name matches nothing. A
pytest-style test source runs its assertions in the child, so its verdicts are only as
trustworthy as the candidate is cooperative; prefer named cases to grade hostile code.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
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

from rubric_core.tools import isolation
from rubric_core.tools._common import validation_handler
from rubric_core.tools.fences import extract_python_code

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

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

WORK_DIR_LIMIT_BYTES = 32 * 1024 * 1024
"""Total bytes the candidate may keep in its work dir (the sandbox's tmpfs size)."""

TASK_LIMIT = 16
"""Processes plus threads the sandbox may hold at once (RLIMIT_NPROC inside its namespace).
In ``unsafe-process`` mode it is headroom over the user's own tasks, and root is exempt."""

FD_LIMIT = 64
"""RLIMIT_NOFILE: open files per process. Memory behind a descriptor (a ``memfd``, a pipe's or
a socket's buffer) is not counted by RLIMIT_AS, so this bounds it: at most this many 1 MiB
(`FILE_LIMIT_BYTES`) memfds per process."""

WORK_DIR_FILE_LIMIT = 10_000
"""Files, directories and links the candidate may keep in its work dir (and in /dev/shm);
checked from outside while it runs (see `_FileCountWatch`)."""

_STATUS_READ_BYTES = 4096
_WATCH_INTERVAL_S = 0.02
_WATCHED_MOUNTS = ((isolation.WORK_DIR, WORK_DIR_LIMIT_BYTES),
                   ("/dev/shm", isolation.SHM_LIMIT_BYTES))

RUNS_CODE = "rubric_studio_runs_code"
"""Tool metadata key: true on tools that execute candidate code in the sandbox."""

_log = logging.getLogger(__name__)
_RESULT_READ_BYTES = 1024 * 1024
_REASON_CHARS = 500
_CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_CASE_KEYS = ("name", "call", "args", "kwargs", "expected", "raises")


TestRunResult = dict[str, Any]
"""``{"ok", "passed", "failures", "error", "stdout", "stderr", "sandbox"}``: ``ok`` is true only
when every test ran and passed; ``passed`` lists test names in run order; ``failures`` holds
``{"name", "reason"}`` for tests that failed or never ran; ``error`` describes a problem with the
run as a whole (bad arguments, no sandbox, timeout, crash, code that does not load) or is None;
``stdout`` and ``stderr`` hold the head and tail of the candidate's output (capped);
``sandbox`` is the mode the code ran in (``bwrap`` or ``unsafe-process``), or None when nothing
ran."""


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
    sandbox: str | None = None,
) -> TestRunResult:
    return {
        "ok": ok,
        "passed": passed or [],
        "failures": failures or [],
        "error": error,
        "stdout": stdout,
        "stderr": stderr,
        "sandbox": sandbox,
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
            wanted, problem = _exception_path(case["raises"])
            if problem:
                return [], f"{where}: {problem}"
            item["raises"] = wanted
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


def _exception_path(raises: object) -> tuple[str, str]:
    """The dotted path an expected exception is matched by: (path, problem)."""
    if not isinstance(raises, str) or not _DOTTED_NAME.match(raises.strip()):
        return "", ("'raises' must be an exception class: a builtin name like 'ValueError' or a "
                    "module path like 'json.JSONDecodeError'")
    path = raises.strip().removeprefix("builtins.")
    if "." in path:
        return path, ""
    builtin = getattr(builtins, path, None)
    if not (isinstance(builtin, type) and issubclass(builtin, BaseException)):
        return "", (f"'raises': {path!r} is not a built-in exception; name another class by its "
                    "module path, like 'json.JSONDecodeError' or 'solution.MyError'")
    return "builtins." + path, ""


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


def _limits(cpu: int, memory_mb: int, mode: str) -> list[tuple[int, int, int]]:
    """The (resource, soft, hard) limits for a child, clamped to what this process may set."""
    memory = memory_mb * 1024 * 1024
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_FSIZE, FILE_LIMIT_BYTES, FILE_LIMIT_BYTES),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NOFILE, FD_LIMIT, FD_LIMIT),
    ]
    if mode != isolation.BWRAP:
        # Under bwrap the harness sets RLIMIT_NPROC inside the sandbox's user namespace. Here
        # it counts every task of the user (and root is exempt), so add headroom.
        uid = os.geteuid()
        tasks = TASK_LIMIT if uid == 0 else _user_task_count(uid) + TASK_LIMIT
        wanted.append((resource.RLIMIT_NPROC, tasks, tasks))
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


def _read_events(
    fd: int, deadline: float, watch: _FileCountWatch | None = None
) -> tuple[bytes, bool, str | None]:
    """Read the result pipe until EOF, the deadline or a broken limit: (data, timed_out, why)."""
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if watch is not None and (why := watch.exceeded()):
                return b"".join(chunks), False, why
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), True, None
            if not selector.select(min(remaining, _WATCH_INTERVAL_S)):
                continue
            data = os.read(fd, 65536)
            if not data:
                return b"".join(chunks), False, None
            if size < _RESULT_READ_BYTES:
                chunks.append(data[: _RESULT_READ_BYTES - size])
                size += len(chunks[-1])


def _wait_exit(
    pid: int, deadline: float, watch: _FileCountWatch | None = None
) -> tuple[bool, str | None]:
    """Wait for the child to exit without reaping it (so its pgid stays reserved).

    Returns (exited, why): ``why`` names a limit the sandbox broke meanwhile.
    """
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True, None
        except ChildProcessError:
            return True, None
        if watch is not None and (why := watch.exceeded()):
            return False, why
        if time.monotonic() >= deadline:
            return False, None
        time.sleep(0.005)


class _FileCountWatch:
    """Counts, from outside, the files the candidate keeps in its tmpfs mounts.

    A tmpfs's ``size`` bounds the bytes in it, not its inodes: empty files and directories
    cost about 1 KB of kernel memory each, up to half the host's RAM pages of them, which no
    rlimit counts and bubblewrap has no mount option for. So this process reads the inode count
    of the sandbox's ``/work`` and ``/dev/shm`` through ``/proc/<pid>/root`` (the pid
    bubblewrap reports on its status fd) while it waits, and `_run_child` kills the sandbox
    when the count passes `WORK_DIR_FILE_LIMIT`.
    """

    def __init__(self, status_fd: int) -> None:
        self.status_fd = status_fd
        self.status = b""
        self.pid: int | None = None
        os.set_blocking(status_fd, False)

    def sandbox_pid(self) -> int | None:
        """The host pid of the sandbox's first process, once bubblewrap has reported it."""
        if self.pid is None and len(self.status) < _STATUS_READ_BYTES:
            try:
                self.status += os.read(self.status_fd, _STATUS_READ_BYTES - len(self.status))
            except (BlockingIOError, OSError):
                return None
            match = re.search(rb'"child-pid":\s*(\d+)', self.status)
            self.pid = int(match.group(1)) if match else None
        return self.pid

    def exceeded(self) -> str | None:
        """A reason when the sandbox holds more files than allowed, else None."""
        pid = self.sandbox_pid()
        if pid is None:
            return None
        for path, size in _WATCHED_MOUNTS:
            try:
                stats = os.statvfs(f"/proc/{pid}/root{path}")
            except OSError:  # the sandbox is gone
                continue
            if stats.f_blocks * stats.f_frsize != size:
                continue  # not the sandbox's tmpfs (yet): its root may still be the host's
            if stats.f_files - stats.f_ffree > WORK_DIR_FILE_LIMIT:
                return (f"file limit exceeded (more than {WORK_DIR_FILE_LIMIT:,} files and "
                        f"directories in {path})")
        return None


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


def _exit_reason(returncode: int, stderr: str, memory_mb: int, mode: str) -> str:
    if mode == isolation.BWRAP and returncode > 128:
        returncode = 128 - returncode  # bwrap exits 128 + N when its child died of signal N
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


def _shown(path: str) -> str:
    return path.removeprefix("builtins.")


def _same_json(actual: object, expected: object) -> bool:
    """JSON equality where ``true``/``false`` are not the numbers 1 and 0 (as Python's are).

    Otherwise a candidate returning ``True`` would pass a case expecting ``1``, and ``[1, 0]``
    one expecting ``[true, false]``. Integers and floats of equal value stay equal.
    """
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            _same_json(a, e) for a, e in zip(actual, expected, strict=True))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            _same_json(actual[key], expected[key]) for key in expected)
    return actual == expected


def _judge(case: dict[str, Any], report: dict[str, Any]) -> tuple[bool, str]:
    """Compare what the child says one case did with what the case expects."""
    raised = report.get("raised")
    if isinstance(raised, list):
        wanted = case.get("raises")
        error = str(report.get("error") or "raised an exception")
        if wanted and wanted in raised:
            return True, ""
        if wanted:
            reason = f"expected {_shown(wanted)} to be raised, got {error}"
            first = raised[0] if raised and isinstance(raised[0], str) else None
            if first is None or first.rpartition(".")[2] == wanted.rpartition(".")[2]:
                where = f"it is {first}" if first else "it has no importable path"
                reason += f" (a different class that only shares the name: {where})"
            return False, reason
        return False, error
    if "error" in report:
        return False, str(report["error"])
    if "raises" in case:
        return False, f"expected {_shown(case['raises'])} to be raised, but it returned normally"
    expected = json.dumps(case["expected"])
    if "unjsonable" in report:
        return False, (f"expected {_clip(expected, 200)}, got a value that is not "
                       f"JSON-comparable ({report['unjsonable']})")
    if "value" not in report:
        return False, "the sandbox reported no outcome for this case"
    if _same_json(report["value"], json.loads(expected)):
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
                entry = os.path.join(root, name)
                # os.walk lists a symlink to a directory among the dirs, and chmod follows it:
                # a link the candidate planted would open up a directory of its choosing.
                if not os.path.islink(entry):
                    with contextlib.suppress(OSError):
                        os.chmod(entry, 0o700)
        shutil.rmtree(path, ignore_errors=True)


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
    if cpu_s is not None and (not _is_number(cpu_s) or not 0 < cpu_s <= MAX_TIMEOUT_S):
        return _result(error=f"cpu_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    status = isolation.sandbox_status()
    if not status.ready:
        return _result(error=status.detail)
    seconds = float(timeout_s)
    cpu = math.ceil(cpu_s) if cpu_s is not None else math.ceil(seconds) + 1
    return _run_child(code, cases, source, function, seconds, memory_mb, cpu)


def _run_child(
    code: str,
    cases: list[dict[str, Any]] | None,
    source: str | None,
    function: str | None,
    seconds: float,
    memory_mb: int,
    cpu: int,
) -> TestRunResult:
    mode = isolation.requested_mode()
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    status_read, status_write = os.pipe()
    seccomp_fd = isolation.seccomp_fd() if mode == isolation.BWRAP else None
    # Under bwrap the work dir is the sandbox's own tmpfs, so no host directory is made.
    workdir = tempfile.mkdtemp(prefix="rubric_sandbox_") if mode != isolation.BWRAP else None
    if mode == isolation.UNSAFE_PROCESS:
        _warn_unsafe_once()
    spec = {
        "nonce": nonce,
        "fd": write_fd,
        "code": code,
        "cases": None if cases is None else [_call_only(case) for case in cases],
        "source": source,
        "function": function,
        "memory_mb": memory_mb,
        "file_limit": FILE_LIMIT_BYTES,
        "disk_limit": WORK_DIR_LIMIT_BYTES,
        "task_limit": TASK_LIMIT,
        "mode": mode,
    }
    limits = _limits(cpu, memory_mb, mode)
    if mode == isolation.BWRAP:
        launch = isolation.launch(
            work_bytes=WORK_DIR_LIMIT_BYTES, seccomp_fd=seccomp_fd, status_fd=status_write
        )
        argv = [*launch.argv, "-I", "-S", "-B"]
        pass_fds = tuple(fd for fd in (write_fd, status_write, seccomp_fd) if fd is not None)
    else:
        argv = [sys.executable, "-I", "-B"]
        pass_fds = (write_fd,)
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    [*argv, "-c", _HARNESS],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=workdir or "/",
                    env=dict(_CHILD_ENV),
                    pass_fds=pass_fds,
                    start_new_session=True,
                    preexec_fn=lambda: _apply_limits(limits),
                )
            except OSError as exc:
                return _result(error=f"could not start the sandbox: {exc}", sandbox=mode)
            finally:
                for fd in (write_fd, status_write, seccomp_fd):
                    if fd is not None:
                        os.close(fd)
            deadline = time.monotonic() + seconds
            try:
                assert proc.stdin is not None
                with proc.stdin:
                    proc.stdin.write(json.dumps(spec).encode("utf-8"))
            except (BrokenPipeError, OSError):
                pass  # the child died at once; its exit status says why
            watch = _FileCountWatch(status_read) if mode == isolation.BWRAP else None
            raw, timed_out, broken = _read_events(read_fd, deadline, watch)
            if not timed_out and broken is None:
                exited, broken = _wait_exit(proc.pid, deadline, watch)
                timed_out = not exited and broken is None
            _kill_group(proc.pid)
            returncode = proc.wait()
            _wait_sandbox_gone(status_read, watch)
            stdout = _read_stream(out, tail=False)
            stderr = _read_stream(err, tail=True)
        events = _parse_events(raw, nonce)
        run_error: str | None = broken
        if broken is None and not any(event.get("event") == "done" for event in events):
            if timed_out:
                run_error = f"timed out after {_fmt_seconds(seconds)} s"
            else:
                run_error = _exit_reason(returncode, stderr, memory_mb, mode)
        result = _assemble(events, run_error, stdout, stderr, cases)
        result["sandbox"] = mode
        return result
    finally:
        os.close(read_fd)
        os.close(status_read)
        if workdir is not None:
            _remove_tree(workdir)


_warned_unsafe = False


def _warn_unsafe_once() -> None:
    global _warned_unsafe
    if not _warned_unsafe:
        _warned_unsafe = True
        _log.warning("%s", isolation.sandbox_status().detail)


def _wait_sandbox_gone(
    status_fd: int, watch: _FileCountWatch | None = None, limit_s: float = 5.0
) -> None:
    """Block until the sandbox's first process (its PID namespace's init) has exited.

    Killing bubblewrap ends the sandbox through ``--die-with-parent``, asynchronously; the PID
    namespace's init exits only once every process in it is gone, so waiting for it means
    nothing the candidate started outlives this call.
    """
    pid = (watch or _FileCountWatch(status_fd)).sandbox_pid()
    if pid is None:
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                if stat.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return  # exited; only waiting to be reaped by its parent
        except OSError:
            return
        time.sleep(0.002)


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
        handle_validation_error=validation_handler(name),
        metadata={RUNS_CODE: True},
    )
