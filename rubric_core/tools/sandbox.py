"""The kernel boundary around graded code: the one module to audit for what the child can reach.

Candidate code is model output, so it never runs in this process. `run_child` starts the base
interpreter as ``python -I -S -B -c <harness>`` (the harness is the source text of
`rubric_core.tools._sandbox_harness`, stdlib-only), with the command line and the seccomp filter
`rubric_core.tools.isolation` builds, and watches it until it is gone. Nothing here checks a
test spec or judges an outcome: that is `rubric_core.tools.testspec`, and
`rubric_core.tools.python_tests.run_tests` puts the steps together.

What the child can reach, by default (``bwrap``): it runs in its own user, PID, network, IPC,
UTS, cgroup and mount namespaces, as uid 65534 with every capability dropped, behind a seccomp
filter, and sees a read-only system (``/usr`` and the Python installation, its site-packages
hidden), its own ``/proc``, a small ``/dev/shm``, one writable work dir ``/work`` (a tmpfs of
`WORK_DIR_LIMIT_BYTES`, gone with the run), a loopback of its own, an environment of ``PATH``,
``LANG``, ``HOME``, ``TMPDIR`` and ``PWD`` only, and the pipes it was given: the spec on stdin,
the event pipe, and files for its stdout and stderr. What it cannot reach: the network, the
host's loopback, the home directory, ``/etc``, ``/tmp``, the project, the database, any example
file, the answer key (named cases are sent with their calls only: `_call_only` strips
``expected`` and ``raises`` here, whatever the caller passes), or this process's memory.
Where bubblewrap cannot run, nothing runs and the reason says what to install or enable, unless
the operator opted into the weaker ``RUBRIC_STUDIO_SANDBOX=unsafe-process`` (a separate process
with rlimits, in the app's own filesystem, network and user); every run names its mode.

Limits, each enforced by the kernel and each reported as the run's error: wall clock (the whole
sandbox is killed, and `run_child` waits for its PID namespace's init to exit, so nothing the
candidate started outlives the call), CPU seconds (``RLIMIT_CPU``), memory (``RLIMIT_AS`` per
process), file size and output size (``RLIMIT_FSIZE``, which also caps stdout/stderr, as they go
to files), bytes in the work dir (the tmpfs size), files in the work dir and ``/dev/shm``
(counted from outside by `_FileCountWatch`: a tmpfs bounds bytes, not inodes), open files
(``RLIMIT_NOFILE``), processes and threads (``RLIMIT_NPROC``, counted inside the sandbox's own
user namespace) and no core dumps.

Events come back only on the dedicated pipe, one line each, prefixed with a random nonce, so
text the candidate prints cannot forge one (`_parse_events`). A pytest-style test source runs
its assertions in the child, so its verdicts are only as trustworthy as the candidate is
cooperative; named cases are judged outside.

The test-running names that lived here before (`run_tests`, the tools, `extract_python_code`,
`TestRunResult` and their limits) stay importable from this module; they are read from their
own modules on first use, since those import this one.
"""

from __future__ import annotations

import contextlib
import json
import logging
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
from typing import IO, Any, NamedTuple

from rubric_core.tools import isolation

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

_log = logging.getLogger(__name__)
_RESULT_READ_BYTES = 1024 * 1024
_CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

# The child-side program, read once at import. It goes to the child as `-c` source, not as a
# path, so no file path shows in the child's `__main__` or tracebacks (harness frames read
# `<string>`), and every run executes this text whatever happens to the file afterwards.
_HARNESS = Path(__file__).with_name("_sandbox_harness.py").read_text(encoding="utf-8")


class ChildRun(NamedTuple):
    """What one sandboxed run reported, before anything is judged."""

    started: bool
    """False when no child ran (no sandbox here, or it could not start); ``error`` says why."""
    events: list[dict[str, Any]]
    """The events the child reported on its pipe, in order (nonce checked, then dropped)."""
    error: str | None
    """Why the run as a whole failed (timeout, a broken limit, a crash), or None."""
    stdout: str
    """The head of the child's standard output, capped."""
    stderr: str
    """The tail of the child's standard error, capped."""
    mode: str | None
    """The mode the child ran in (``bwrap`` or ``unsafe-process``), None when nothing ran."""


def _not_started(error: str, mode: str | None) -> ChildRun:
    return ChildRun(started=False, events=[], error=error, stdout="", stderr="", mode=mode)


def _fmt_seconds(seconds: float) -> str:
    text = f"{seconds:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


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



def run_child(
    code: str,
    *,
    cases: list[dict[str, Any]] | None,
    source: str | None,
    function: str | None,
    seconds: float,
    memory_mb: int,
    cpu: int,
) -> ChildRun:
    """Run candidate code and its tests in a fresh sandbox, and collect what the child reports.

    Arguments are taken as already checked (`rubric_core.tools.testspec.check_spec`); this
    function only refuses to run when no sandbox is available in the requested mode.

    Args:
        code: The candidate's Python source (untrusted).
        cases: Named cases, or None for a test source. Only their calls reach the child: the
            ``expected`` and ``raises`` keys are dropped here.
        source: Pytest-style test source, or None for named cases.
        function: The function ``args`` cases call.
        seconds: Wall-clock limit for the whole sandbox.
        memory_mb: Address-space limit for each process, in MB.
        cpu: CPU seconds each process may use.

    Returns:
        A `ChildRun`: the child's events and output, and the run-level error if it never
        finished (a timeout, a broken limit, its exit status), for the caller to judge.

    """
    status = isolation.sandbox_status()
    if not status.ready:
        return _not_started(status.detail, None)
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
                return _not_started(f"could not start the sandbox: {exc}", mode)
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
        return ChildRun(
            started=True, events=events, error=run_error, stdout=stdout, stderr=stderr, mode=mode
        )
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
