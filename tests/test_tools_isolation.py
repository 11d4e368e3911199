"""The kernel boundary around graded code, attacked the way a hostile candidate would.

Every attack here is one that got through the old in-interpreter sandbox. Each test proves
containment by its effect on the host (a file unchanged, a listener that got nothing, no process
left, a secret absent from every byte that came back), not by the wording of a refusal. These
run for real under bubblewrap: the test command installs it, and `test_default_mode_is_bwrap`
fails (it does not skip) where it is missing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import rubric_core
from rubric_core.examples import FIND_DUPLICATES_TESTS
from rubric_core.tools import isolation, sandbox
from rubric_core.tools.python_tests import run_tests

PROBE = [{"name": "probe", "call": "probe()", "expected": "contained"}]


def run_probe(body: str, **kwargs: Any) -> dict[str, Any]:
    """Run ``def probe(): <body>`` in the sandbox; returns the whole result."""
    code = "def probe():\n" + textwrap.indent(textwrap.dedent(body), "    ")
    kwargs.setdefault("timeout_s", 10)
    return run_tests(code, PROBE, **kwargs)


def _said(result: dict[str, Any]) -> str:
    return json.dumps(result)


@pytest.fixture
def unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isolation.SANDBOX_ENV, isolation.UNSAFE_PROCESS)


def test_default_mode_is_bwrap() -> None:
    status = isolation.sandbox_status()
    assert status == isolation.sandbox_status(refresh=True)
    assert (status.mode, status.ready) == ("bwrap", True), status.detail
    assert "seccomp" in status.detail


# --------------------------------------------------------------------------- processes


@pytest.mark.parametrize(
    "spawn",
    [
        pytest.param("import ctypes\nctypes.CDLL(None).__libc_system(COMMAND.encode())",
                     id="ctypes_libc_system"),
        pytest.param(
            "import _posixsubprocess, os\n"
            "r, w = os.pipe()\n"
            "pid = _posixsubprocess.fork_exec(\n"
            "    [b'/bin/sh', b'-c', COMMAND.encode()], [b'/bin/sh'], True, (), None, None,\n"
            "    -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None,\n"
            "    False)\n"
            "os.waitpid(pid, 0)",
            id="posixsubprocess_fork_exec",
        ),
    ],
)
def test_shell_commands_run_only_inside_the_sandbox(spawn: str, tmp_path: Path) -> None:
    marker = tmp_path / "escaped.txt"
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    command = (f"id > {marker}; echo gone > {keep}; rm -f {keep}; "
               f"cat /proc/{os.getpid()}/environ > {marker}.env; id -u > /work/uid")
    result = run_probe(f"COMMAND = {command!r}\n{spawn}\nreturn open('/work/uid').read().strip()")
    # The shell ran, as the sandbox's unprivileged user, and touched nothing on the host.
    assert _failure(result) == f'expected "contained", got "{isolation.SANDBOX_UID}"', result
    assert not marker.exists() and not Path(f"{marker}.env").exists()
    assert keep.read_text() == "precious"


def test_no_process_the_candidate_starts_outlives_the_run() -> None:
    tag = f"{int(time.time()) % 1000 + 2000}.{uuid.uuid4().int % 10**9}"
    body = f"""
    import os
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv('/bin/sleep', ['sleep', {tag!r}])
        os._exit(0)
    os.wait()
    return 'contained'
    """
    result = run_probe(body)
    assert result["ok"] is True, result  # the grandchild was started and detached
    assert _processes_with(tag) == []
    # and when the run ends by timeout, with the grandchild still starting more
    looping = body.replace("return 'contained'", "while True:\n        pass")
    result = run_probe(looping, timeout_s=1.5)
    assert result["error"] == "timed out after 1.5 s"
    assert _processes_with(tag) == []


def _processes_with(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmdline:
                found.append(int(entry))
    return found


def test_the_host_processes_are_invisible_and_unsignallable() -> None:
    result = run_probe(f"""
    import os, signal
    try:
        os.kill({os.getpid()}, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
    """)
    # Only the sandbox's own init (1) and the harness (2) exist in its PID namespace.
    assert _failure(result) == 'expected "contained", got [1, 2]', result


# --------------------------------------------------------------------------- network


def test_a_ctypes_socket_cannot_reach_a_loopback_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(5)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        result = run_probe(f"""
        import ctypes, socket, struct
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
        addr = struct.pack('=HH4s8x', socket.AF_INET, socket.htons({port}),
                           socket.inet_aton('127.0.0.1'))
        rc = libc.connect(fd, addr, len(addr))
        libc.send(fd, b'stolen', 6, 0)
        return [rc, ctypes.get_errno()]
        """)
        with pytest.raises(BlockingIOError):
            listener.accept()
    # connect failed: the sandbox's loopback is down, its network namespace has nothing else
    assert "got [-1, " in _failure(result), result


# --------------------------------------------------------------------------- secrets


def test_the_parent_environment_is_unreadable_through_proc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "sk-proc-" + uuid.uuid4().hex
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    body = f"""
    import os
    seen = []
    proc = os.open('/proc', os.O_RDONLY | os.O_DIRECTORY)
    for pid in ['self', '1', '{os.getpid()}', '{os.getppid()}'] + os.listdir(proc):
        for name in ('environ', 'cmdline'):
            try:
                fd = os.open(f'{{pid}}/{{name}}', os.O_RDONLY, dir_fd=proc)
                seen.append(os.read(fd, 1 << 16).decode('latin-1'))
                os.close(fd)
            except OSError as exc:
                seen.append(repr(exc))
    print(seen)
    return seen
    """
    result = run_probe(body)
    assert result["ok"] is False and "OPENAI_API_KEY" not in _said(result)
    assert secret not in _said(result)
    env = run_tests("import os", [{"name": "env", "call": "sorted(os.environ)", "expected": 0}])
    assert _failure(env, "env") == 'expected 0, got ["HOME", "LANG", "PATH", "PWD", "TMPDIR"]'


def test_the_example_answer_key_is_not_in_the_sandbox() -> None:
    # A lookup-table "solution": read the expected values from the bundled example and replay
    # them. It can only pass if the answer key is readable from inside.
    project = Path(rubric_core.__file__).resolve().parent
    cheat = f"""
import ast, os
PATHS = ['/proc/1/cwd/rubric_core/examples.py', '/proc/2/cwd/rubric_core/examples.py',
         {str(project / "examples.py")!r}, 'rubric_core/examples.py', '../rubric_core/examples.py']
TABLE = {{}}
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['self']:
    PATHS.append(f'/proc/{{pid}}/cwd/rubric_core/examples.py')
for path in PATHS:
    try:
        source = open(path).read()
    except OSError:
        continue
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = [getattr(k, 'value', None) for k in node.keys]
            if 'args' in keys and 'expected' in keys:
                case = ast.literal_eval(node)
                TABLE[repr(case['args'][0])] = case['expected']
def find_duplicates(lst):
    return TABLE.get(repr(lst), 'no answer key')
"""
    cases = [dict(case) for case in FIND_DUPLICATES_TESTS]
    result = run_tests(cheat, cases, function="find_duplicates")
    assert result["ok"] is False and result["passed"] == [], result
    assert all('got "no answer key"' in failure["reason"] for failure in result["failures"])
    # The same cheat does work where the file is readable, so the test can tell.
    assert (project / "examples.py").exists()


# --------------------------------------------------------------------------- files


def test_fd_relative_writes_chmods_and_deletes_outside_change_nothing(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"original bytes\n")
    victim.chmod(0o644)
    before = (victim.read_bytes(), stat.S_IMODE(victim.stat().st_mode), victim.stat().st_mtime_ns)
    rel_dir, name = str(tmp_path).lstrip("/"), victim.name
    result = run_probe(f"""
    import os
    outcomes = []
    root = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
    for attempt in (
        lambda: os.write(os.open({rel_dir!r} + '/' + {name!r}, os.O_WRONLY | os.O_TRUNC,
                                 dir_fd=root), b'pwned'),
        lambda: os.chmod({rel_dir!r} + '/' + {name!r}, 0o777, dir_fd=root),
        lambda: os.unlink({rel_dir!r} + '/' + {name!r}, dir_fd=root),
        lambda: os.rename('/' + {rel_dir!r} + '/' + {name!r}, '/work/taken'),
        lambda: open({str(victim)!r}, 'w').write('pwned'),
        lambda: open('/etc/passwd', 'a').write('x'),
        lambda: open('/usr/bin/evil', 'w'),
        lambda: open({sys.executable!r}, 'a'),
    ):
        try:
            attempt()
            outcomes.append('did it')
        except OSError as exc:
            outcomes.append(exc.errno)
    return outcomes
    """)
    assert "did it" not in _failure(result), result
    after = (victim.read_bytes(), stat.S_IMODE(victim.stat().st_mode), victim.stat().st_mtime_ns)
    assert after == before


def test_the_app_database_cannot_be_opened(tmp_path: Path) -> None:
    db = tmp_path / "rubric_studio.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE runs (id TEXT, status TEXT)")
        conn.execute("INSERT INTO runs VALUES ('r1', 'needs_revision')")
    conn.close()
    before = db.read_bytes()
    result = run_probe(f"""
    import sqlite3
    conn = sqlite3.connect({str(db)!r})
    conn.execute("UPDATE runs SET status = 'satisfied'")
    conn.commit()
    return 'rewrote it'
    """)
    assert "unable to open database file" in _failure(result), result
    assert db.read_bytes() == before


def test_work_dir_is_fresh_per_run_and_nothing_is_left_on_the_host() -> None:
    tmp_before = set(os.listdir("/tmp"))
    first = run_probe("""
    import os
    open('note.txt', 'w').write('hi')
    os.makedirs('locked/inner')
    os.chmod('locked', 0)
    return [os.getcwd(), sorted(os.listdir('.'))]
    """)
    assert _failure(first) == 'expected "contained", got ["/work", ["locked", "note.txt"]]'
    second = run_probe("import os\nreturn os.listdir('.')")
    assert _failure(second) == 'expected "contained", got []'
    assert not {n for n in set(os.listdir("/tmp")) - tmp_before if "rubric_sandbox" in n}


def test_the_visible_filesystem_is_the_system_and_python_only() -> None:
    result = run_probe("""
    import os, sys
    return [sorted(os.listdir('/')), os.path.exists(sys.prefix + '/lib'), os.getuid()]
    """)
    listing = json.loads(_failure(result).split("got ", 1)[1])
    top, has_stdlib, uid = listing
    assert set(top) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "proc",
                        "dev", "work", "root", "opt", "home"} - {"home"}
    assert "etc" not in top and "tmp" not in top and "home" not in top
    assert has_stdlib is True and uid == isolation.SANDBOX_UID


def test_installed_packages_are_hidden() -> None:
    # Nothing pip installed (the project itself included, once installed) is importable or
    # readable: only the standard library is there.
    result = run_probe("""
    import importlib.util, site, sys, os
    hidden = [p for p in site.getsitepackages() if os.path.isdir(p) and os.listdir(p)]
    names = ('pip', 'langchain', 'rubric_core')
    return [importlib.util.find_spec(n) is None for n in names] + hidden
    """)
    assert _failure(result) == 'expected "contained", got [true, true, true]', result


# --------------------------------------------------------------------------- limits


def test_cpu_limit_is_enforced_and_reported() -> None:
    result = run_probe("while True:\n    pass", timeout_s=60, cpu_s=1)
    # The CPU limit ended it (its signal, not the 60 s timeout).
    assert result["error"] == "CPU time limit exceeded (killed by signal SIGXCPU)", result


def test_limits_inside_the_sandbox_are_the_promised_ones() -> None:
    import resource

    cases = [
        {"name": n, "call": f"resource.getrlimit(resource.RLIMIT_{n.upper()})[0]", "expected": v}
        for n, v in (("as", 256 * 1024 * 1024), ("fsize", sandbox.FILE_LIMIT_BYTES),
                     ("core", 0), ("cpu", 4), ("nproc", sandbox.TASK_LIMIT))
    ]
    cases.append({"name": "isolated", "call": "sys.flags.isolated", "expected": 1})
    result = run_tests("import resource, sys", cases, timeout_s=2.5, memory_mb=256)
    assert result["ok"] is True, result
    assert resource.RLIMIT_NPROC not in [lim[0] for lim in sandbox._limits(4, 256, "bwrap")]


def test_seccomp_refuses_kernel_attack_surface() -> None:
    calls = {  # name: arguments that succeed (or fail otherwise than EPERM) without the filter
        "ptrace": (0, 0, 0, 0),  # PTRACE_TRACEME
        "keyctl": (0, -3, 1),  # KEYCTL_GET_KEYRING_ID of the session keyring, create
        "unshare": (0x10000000,),  # CLONE_NEWUSER
        "io_uring_setup": (1, 0),
        "mount": (0, 0, 0, 0, 0),
    }
    column = 0 if os.uname().machine == "x86_64" else 1
    numbers = {name: isolation.SECCOMP_DENIED[name][column] for name in calls}
    probe = textwrap.dedent(f"""
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    out = {{}}
    for name, nr in {numbers!r}.items():
        ctypes.set_errno(0)
        rc = libc.syscall(nr, *{calls!r}[name])
        out[name] = ctypes.get_errno() if rc == -1 else 'ok'
    print(json.dumps(out))
    """)
    result = run_probe(probe.replace("print(json.dumps(out))", "return out"))
    assert _failure(result) == "expected \"contained\", got " + json.dumps(
        dict.fromkeys(calls, 1)), result
    # Without the filter (a plain child of this test), the same calls are not EPERM'd alike:
    # proof that the numbers name the calls they claim to.
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=30, check=True)
    unfiltered = json.loads(plain.stdout)
    assert unfiltered["ptrace"] == "ok" and unfiltered["keyctl"] == "ok", unfiltered


def test_clone_into_a_new_user_namespace_is_refused() -> None:
    result = run_probe("""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    clone = 56 if __import__('os').uname().machine == 'x86_64' else 220
    rc = libc.syscall(clone, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
    return [rc, ctypes.get_errno()]
    """)
    assert _failure(result) == 'expected "contained", got [-1, 1]', result


# --------------------------------------------------------------------------- verdicts


def test_an_exception_that_only_borrows_a_builtin_name_does_not_match() -> None:
    code = ("ValueError = type('ValueError', (Exception,), {})\n"
            "def f():\n    raise ValueError('x')\n")
    result = run_tests(code, [{"name": "v", "args": [], "raises": "ValueError"}], function="f")
    assert result["ok"] is False
    assert "only shares the name: it is solution.ValueError" in _failure(result, "v")
    # Rebinding the builtin itself does not help either.
    code = ("import builtins\nclass Fake(Exception):\n    pass\nFake.__name__ = 'ValueError'\n"
            "builtins.ValueError = Fake\ndef f():\n    raise Fake('x')\n")
    result = run_tests(code, [{"name": "v", "args": [], "raises": "ValueError"}], function="f")
    assert result["ok"] is False, result


def test_real_exceptions_match_by_identity_builtin_or_module_path() -> None:
    code = ("import json\nclass MyError(KeyError):\n    pass\n"
            "def bad_json():\n    json.loads('{')\n"
            "def mine():\n    raise MyError('k')\n")
    cases = [
        {"name": "value", "call": "bad_json()", "raises": "ValueError"},
        {"name": "alias", "call": "bad_json()", "raises": "json.JSONDecodeError"},
        {"name": "canonical", "call": "bad_json()", "raises": "json.decoder.JSONDecodeError"},
        {"name": "explicit_builtin", "call": "bad_json()", "raises": "builtins.Exception"},
        {"name": "own_class", "call": "mine()", "raises": "solution.MyError"},
        {"name": "its_base", "call": "mine()", "raises": "LookupError"},
        {"name": "wrong", "call": "mine()", "raises": "TypeError"},
    ]
    result = run_tests(code, cases)
    assert result["passed"] == [c["name"] for c in cases[:-1]], result
    assert _failure(result, "wrong").startswith("expected TypeError to be raised, got MyError")


# --------------------------------------------------------------------------- modes


def test_missing_bubblewrap_refuses_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setenv(isolation.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    result = run_probe(f"open({str(marker)!r}, 'w')\nreturn 'contained'")
    assert result["ok"] is False and result["sandbox"] is None
    assert "Graded code is not run" in result["error"]
    assert "apt-get install bubblewrap" in result["error"]
    assert "RUBRIC_STUDIO_SANDBOX=unsafe-process" in result["error"]
    assert not marker.exists()
    assert isolation.sandbox_status().ready is False


def test_blocked_user_namespaces_refuse_with_what_to_enable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A bwrap that fails the way it does where the kernel forbids unprivileged namespaces.
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely "
                    "because the kernel does not allow non-privileged user namespaces.' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(isolation.BWRAP_ENV, str(fake))
    result = run_probe("return 'contained'")
    assert result["ok"] is False and result["sandbox"] is None
    assert "could not create the sandbox" in result["error"]
    assert "kernel.unprivileged_userns_clone=1" in result["error"]
    assert "apparmor_restrict_unprivileged_userns" in result["error"]


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isolation.SANDBOX_ENV, "none")
    result = run_probe("return 'contained'")
    assert result["sandbox"] is None
    assert "'none' is not a sandbox mode" in result["error"]


def test_unsafe_process_mode_is_never_silent(
    unsafe: None, caplog: pytest.LogCaptureFixture
) -> None:
    monkey_flag = sandbox._warned_unsafe
    sandbox._warned_unsafe = False
    try:
        with caplog.at_level("WARNING", logger="rubric_core.tools.sandbox"):
            result = run_probe("return 'contained'")
    finally:
        sandbox._warned_unsafe = monkey_flag or sandbox._warned_unsafe
    assert result["ok"] is True and result["sandbox"] == "unsafe-process"
    assert any("UNSAFE" in record.getMessage() for record in caplog.records)
    status = isolation.sandbox_status()
    assert status.mode == "unsafe-process" and status.detail.startswith("UNSAFE")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param("import os\nos.fork()", "does not allow starting processes", id="fork"),
        pytest.param("import ctypes\nctypes.CDLL(None).fork()",
                     "does not allow calling fork through ctypes", id="fork_through_ctypes"),
        pytest.param("import subprocess\nsubprocess.run(['true'])",
                     "does not allow starting processes", id="subprocess"),
        pytest.param("import os\nos.kill(os.getppid(), 0)",
                     "does not allow signalling other processes", id="signal_the_parent"),
        pytest.param("import os\nopen(f'/proc/{os.getppid()}/environ').read()",
                     "reading other processes' /proc entries", id="read_parent_environ"),
        pytest.param("import socket\nsocket.create_connection(('127.0.0.1', 9))",
                     "does not allow network access", id="network"),
        pytest.param("open('/tmp/rubric_escape_' + __import__('uuid').uuid4().hex, 'w')",
                     "does not allow writing outside the sandbox directory", id="write_outside"),
    ],
)
def test_unsafe_process_mode_keeps_its_audit_hook(unsafe: None, body: str, reason: str) -> None:
    result = run_probe(body)
    assert result["sandbox"] == "unsafe-process"
    assert reason in _failure(result), result


def test_unsafe_process_mode_kills_its_process_group_on_timeout(unsafe: None) -> None:
    result = run_probe("import os\nGROUP = os.getpgid(0)\nwhile True:\n    pass", timeout_s=1.5)
    assert result["error"] == "timed out after 1.5 s"


def _failure(result: dict[str, Any], name: str = "probe") -> str:
    reasons = [f["reason"] for f in result["failures"] if f["name"] == name]
    assert reasons, f"no failure named {name!r} in {result}"
    return reasons[0]


def test_signals_are_named_from_bwrap_exit_codes() -> None:
    reason = sandbox._exit_reason(128 + signal.SIGXCPU, "", 128, "bwrap")
    assert reason == "CPU time limit exceeded (killed by signal SIGXCPU)"
    assert sandbox._exit_reason(3, "", 128, "bwrap").startswith("process exited with code 3")


def test_app_directories_inside_mounted_trees_are_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A project or database that lives under /usr (a container's /usr/src/app, say) must not
    # show through the read-only /usr mount. /usr/share/doc stands in for it here.
    project = Path("/usr/share/doc")
    assert any(project.iterdir())
    monkeypatch.chdir(project)
    monkeypatch.setenv("RUBRIC_STUDIO_DB", str(project / "rubric_studio.sqlite3"))
    result = run_probe(
        f"import os\nreturn [os.listdir({str(project)!r}), os.listdir('/usr/bin')[:1]]"
    )
    listing = json.loads(_failure(result).split("got ", 1)[1])
    assert listing[0] == [] and listing[1], result


def test_abstract_unix_sockets_of_the_host_are_out_of_reach() -> None:
    # Abstract-namespace sockets (X11's, D-Bus's) belong to a network namespace, not a path.
    name = "\0rubric-test-" + uuid.uuid4().hex
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(name)
        listener.listen(1)
        listener.setblocking(False)
        result = run_probe(f"""
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect({name!r})
            s.sendall(b'stolen')
            return 'connected'
        except OSError as exc:
            return exc.errno
        """)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert _failure(result) == 'expected "contained", got 111', result  # ECONNREFUSED


def test_signalling_every_process_reaches_only_the_sandbox(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        result = run_probe("import os, signal\nos.kill(-1, signal.SIGKILL)\nreturn 'alive'")
        assert result["ok"] is False  # the harness killed itself, nothing else
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_a_sandbox_start_that_fails_once_is_tried_again_before_the_answer_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's first start of the real bubblewrap raises (as a spawn did once: EFAULT);
    the second, real one runs, and the sandbox is available. The kernel's error cannot be made
    on demand, so the first ``subprocess.run`` is replaced by the error alone."""
    import errno

    real_run, calls = subprocess.run, []

    def run_failing_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0][0])
        if len(calls) == 1:
            raise OSError(errno.EFAULT, "Bad address", args[0][0])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(isolation.subprocess, "run", run_failing_once)
    status = isolation.sandbox_status(refresh=True)
    monkeypatch.undo()
    isolation.sandbox_status(refresh=True)  # the cache as the other tests expect it
    assert status.ready and status.mode == "bwrap", status.detail
    assert len(calls) == 2
