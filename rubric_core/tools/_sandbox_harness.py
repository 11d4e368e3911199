"""The child side of `rubric_core.tools.sandbox`: load candidate code and run its tests.

This file is never imported by the parent. `rubric_core.tools.sandbox` reads its text and runs
it as ``python -I -S -B -c <this source>`` inside the sandbox (see
`rubric_core.tools.isolation`). It reads its spec (JSON) from stdin, sets the limits that must
be set from inside, reports events on the inherited pipe ``spec["fd"]``, one line each,
prefixed with ``spec["nonce"]``, and never returns: it ends with ``os._exit`` so candidate
threads and atexit handlers cannot run after the last report.

The boundary is the kernel's (namespaces, seccomp, rlimits), not this file: candidate code runs
in this interpreter and can change anything here. That is why the parent sends only the calls
of named cases, never what they should return or raise, and judges the outcomes itself. In the
``unsafe-process`` mode only, `guard` installs an audit hook as a speed bump.

The project is not on the child's path: this module must stay stdlib-only and must not import
``rubric_core``. Two habits keep it from changing what the candidate's code sees:

- ``typing`` is imported for the type checker only (``TYPE_CHECKING`` is a plain ``False``
  here), so the child never loads it;
- every ``compile`` passes ``dont_inherit=True``, so this module's
  ``from __future__ import annotations`` does not leak into the candidate's code.
"""

from __future__ import annotations

import builtins
import errno
import json
import linecache
import os
import resource
import sys
import traceback
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn


def main() -> NoReturn:
    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    sys.argv = [""]
    nonce = spec.pop("nonce")
    out = os.fdopen(spec.pop("fd"), "w", encoding="utf-8")
    dumps = json.dumps
    tasks = spec["task_limit"]
    if spec["mode"] == "bwrap":
        # Set here, inside the user namespace, so the kernel counts this sandbox's tasks only.
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
    mem_reason = f"memory limit exceeded ({spec['memory_mb']} MB)"
    size_reason = f"output/file size limit exceeded ({spec['file_limit'] // 1024} KB)"
    disk_reason = f"disk limit exceeded ({spec['disk_limit'] // (1024 * 1024)} MB in the work dir)"
    task_reason = f"process/thread limit reached ({tasks} tasks)"
    exception_paths = exception_namer()

    def emit(event: str, **data: object) -> None:
        data["event"] = event
        out.write(nonce + " " + dumps(data) + "\n")
        out.flush()

    def finish() -> NoReturn:
        for stream in (sys.stdout, sys.stderr):
            # Not contextlib.suppress: that allocates and looks up a name the candidate can
            # replace, and nothing may stop this function from reaching os._exit.
            try:  # noqa: SIM105
                stream.flush()
            except BaseException:
                pass
        os._exit(0)

    def clip(text: object, limit: int = 500) -> str:
        text = str(text)
        return text if len(text) <= limit else text[:limit] + "... [truncated]"

    def where(tb: types.TracebackType | None) -> str:
        frames = [f for f in traceback.extract_tb(tb) if f.filename in ("<solution>", "<tests>")]
        if not frames:
            return ""
        f = frames[-1]
        line = (f.line or "").strip()
        detail = ": " + clip(line, 160) if line else ""
        return f" (at {f.filename} line {f.lineno}{detail})"

    def describe(exc: BaseException) -> str:
        if isinstance(exc, MemoryError):
            return mem_reason
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            return size_reason
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return disk_reason + ": " + clip(exc, 200)
        if (isinstance(exc, OSError) and exc.errno == errno.EAGAIN) or (
            isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
        ):
            return task_reason + ": " + clip(exc, 200)
        if isinstance(exc, SystemExit):
            return f"called sys.exit({clip(repr(exc.code), 80)})"
        try:
            message = str(exc)
        except BaseException:
            message = "<unprintable>"
        name = type(exc).__name__
        if isinstance(exc, AssertionError) and not message:
            return "assertion failed" + where(exc.__traceback__)
        return clip(name + (": " + message if message else "")) + where(exc.__traceback__)

    def to_json(value: object) -> Any:
        def default(obj: object) -> Any:
            if hasattr(obj, "tolist") and callable(obj.tolist):
                return obj.tolist()
            msg = f"a {type(obj).__name__} value is not JSON-serialisable"
            raise TypeError(msg)

        return json.loads(dumps(value, default=default))

    if spec["mode"] != "bwrap":
        guard(os.path.realpath(os.getcwd()))

    for name, text in (("<solution>", spec["code"]), ("<tests>", spec["source"] or "")):
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    module = types.ModuleType("solution")
    module.__file__ = "<solution>"
    sys.modules["solution"] = module

    cases = spec["cases"]  # the parent knows their names; only test source reports its own
    try:
        code = compile(spec["code"], "<solution>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        emit(
            "fatal",
            error="the candidate code does not compile: "
            f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})",
        )
        finish()
    except MemoryError:
        emit("fatal", error=mem_reason)
        finish()
    try:
        exec(code, module.__dict__)
    except MemoryError:
        emit("fatal", error="the candidate code failed while loading: " + mem_reason)
        finish()
    except BaseException as exc:
        emit("fatal", error="the candidate code failed while loading: " + describe(exc))
        finish()

    if cases is not None:
        run_cases(cases, module, spec["function"], emit, describe, to_json, clip,
                  exception_paths)
    else:
        run_source(spec["source"], module, emit, describe, mem_reason)
    emit("done")
    finish()


def run_cases(
    cases: list[dict[str, Any]],
    module: types.ModuleType,
    function: str | None,
    emit: Callable[..., None],
    describe: Callable[[BaseException], str],
    to_json: Callable[[object], Any],
    clip: Callable[[object, int], str],
    exception_paths: Callable[[type], list[str]],
) -> None:
    for case in cases:
        name = case["name"]
        emit("start", name=name)
        emit("result", name=name, **run_case(case, module, function, describe, to_json, clip,
                                             exception_paths))


def run_case(
    case: dict[str, Any],
    module: types.ModuleType,
    function: str | None,
    describe: Callable[[BaseException], str],
    to_json: Callable[[object], Any],
    clip: Callable[[object, int], str],
    exception_paths: Callable[[type], list[str]],
) -> dict[str, Any]:
    """What one case did: ``value``, ``raised`` + ``error``, ``unjsonable`` or ``error`` alone.

    ``raised`` lists the dotted paths that name the raised class and its bases (see
    `exception_namer`), so a class that merely shares a builtin's name matches nothing.

    The case carries no expected value or exception: the parent judges the outcome, so code
    that tampers with this process cannot report a pass without knowing the answer.
    """
    target: Any
    try:
        if "call" in case:
            target = compile(case["call"], "<call>", "eval", dont_inherit=True)
        else:
            # The parent only sends "args" cases together with a function name.
            assert function is not None
            target = module
            for part in function.split("."):
                if not hasattr(target, part):
                    return {"error": f"the candidate code does not define {function!r}"}
                target = getattr(target, part)
            if not callable(target):
                return {"error": f"{function!r} is not callable"}
    except SyntaxError as exc:
        return {"error": f"the call expression does not compile: {exc.msg}"}
    try:
        if "call" in case:
            actual = eval(target, module.__dict__)
        else:
            actual = target(*case["args"], **case.get("kwargs", {}))
    except BaseException as exc:
        return {"raised": exception_paths(type(exc)), "error": describe(exc)}
    try:
        return {"value": to_json(actual)}
    except (TypeError, ValueError) as exc:
        return {"unjsonable": clip(exc, 120)}


def run_source(
    source: str,
    module: types.ModuleType,
    emit: Callable[..., None],
    describe: Callable[[BaseException], str],
    mem_reason: str,
) -> None:
    try:
        code = compile(source, "<tests>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        emit("fatal", error=f"the test source does not compile: {exc.msg} (line {exc.lineno})")
        return
    namespace = dict(module.__dict__)
    namespace["__name__"] = "tests"
    try:
        exec(code, namespace)
    except MemoryError:
        emit("fatal", error="the test source failed while loading: " + mem_reason)
        return
    except BaseException as exc:
        emit("fatal", error="the test source failed while loading: " + describe(exc))
        return
    tests: list[tuple[str, type | None, types.FunctionType]] = []
    for name, obj in list(namespace.items()):
        if name.startswith("test") and isinstance(obj, types.FunctionType):
            if obj.__code__.co_filename == "<tests>":
                tests.append((name, None, obj))
        elif name.startswith("Test") and isinstance(obj, type) and obj.__module__ == "tests":
            for attr, member in list(vars(obj).items()):
                if attr.startswith("test") and isinstance(member, types.FunctionType):
                    tests.append((name + "." + attr, obj, member))
    if not tests:
        emit("fatal", error="the test source defines no test functions (name them test_*)")
        return
    emit("collected", names=[name for name, _, _ in tests])
    for name, cls, func in tests:
        emit("start", name=name)
        ok: bool = True
        reason: str | None = None
        try:
            code = func.__code__
            required = code.co_argcount - len(func.__defaults__ or ()) - (1 if cls else 0)
            if required > 0:
                ok, reason = False, "the test takes arguments (pytest fixtures are not supported)"
            else:
                call = func.__get__(cls()) if cls else func
                if code.co_flags & 0x80:
                    import asyncio

                    asyncio.run(call())
                else:
                    call()
        except MemoryError:
            ok, reason = False, mem_reason
        except BaseException as exc:
            ok, reason = False, describe(exc)
        emit("result", name=name, ok=ok, reason=reason)


def exception_namer() -> Callable[[type], list[str]]:
    """A function naming an exception class and its bases by paths that resolve to them.

    Builtins are snapshotted now, before candidate code runs, so rebinding ``builtins.ValueError``
    later changes nothing. Any other class is named ``module.qualname`` (and by the shortest
    public alias in its package, such as ``json.JSONDecodeError`` for
    ``json.decoder.JSONDecodeError``) only when looking that path up gives the very same object.
    """
    real_builtins = {
        name: obj for name, obj in vars(builtins).items()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    }
    modules = sys.modules

    def lookup(module_name: str, qualname: str) -> object:
        target: object = modules.get(module_name)
        for part in qualname.split("."):
            if target is None:
                return None
            target = getattr(target, part, None)
        return target

    def paths(cls: type) -> list[str]:
        names: list[str] = []
        for klass in cls.__mro__:
            if real_builtins.get(klass.__name__) is klass:
                names.append("builtins." + klass.__name__)
                continue
            module_name = getattr(klass, "__module__", None)
            qualname = getattr(klass, "__qualname__", None)
            if not isinstance(module_name, str) or not isinstance(qualname, str):
                continue
            if module_name == "builtins" or "<locals>" in qualname:
                continue
            if lookup(module_name, qualname) is not klass:
                continue
            names.append(module_name + "." + qualname)
            parts = module_name.split(".")
            for end in range(1, len(parts)):
                package = ".".join(parts[:end])
                if lookup(package, qualname) is klass:
                    names.append(package + "." + qualname)
                    break
        return names

    return paths


def guard(workdir: str) -> None:
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    pid = os.getpid()
    own = str(pid)
    prefix = workdir.rstrip(os.sep) + os.sep
    blocked = {
        "os.fork": "starting processes", "os.forkpty": "starting processes",
        "os.system": "starting processes", "os.exec": "starting processes",
        "os.posix_spawn": "starting processes", "os.spawn": "starting processes",
        "subprocess.Popen": "starting processes", "os.killpg": "signalling process groups",
        "resource.setrlimit": "changing resource limits",
        "resource.prlimit": "changing resource limits",
        "socket.connect": "network access", "socket.bind": "network access",
        "socket.sendto": "network access", "socket.sendmsg": "network access",
        "socket.getaddrinfo": "network access", "socket.gethostbyname": "network access",
        "socket.gethostbyaddr": "network access",
    }
    one_path = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr",
                "os.chflags", "os.lchflags", "shutil.rmtree"}
    symbols = {"fork", "vfork", "clone", "clone3", "system", "popen", "execv", "execve",
               "execvp", "execvpe", "execl", "execlp", "execle", "fexecve", "posix_spawn",
               "posix_spawnp", "daemon", "kill", "killpg", "tgkill", "setrlimit", "prlimit",
               "prlimit64", "syscall", "ptrace", "setsid", "setpgid", "unshare"}

    def resolve(path: Any) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        return os.path.realpath(os.fsdecode(os.fspath(path)))

    def inside(path: Any) -> bool:
        real = resolve(path)
        return real is None or real == workdir or real.startswith(prefix) or real == os.devnull

    def deny(what: str) -> NoReturn:
        raise PermissionError("the sandbox does not allow " + what)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in blocked:
            deny(blocked[event])
        elif event == "open":
            path, mode, flags = args
            real = resolve(path)
            if real is None:
                return
            parts = real.split(os.sep)
            if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own:
                deny("reading other processes' /proc entries")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and not inside(real):
                deny(f"writing outside the sandbox directory: {real!r}")
        elif event in one_path:
            if not inside(args[0]):
                deny("changing files outside the sandbox directory")
        elif event in ("os.rename", "os.link"):
            if not (inside(args[0]) and inside(args[1])):
                deny("changing files outside the sandbox directory")
        elif event == "os.symlink":
            if not inside(args[1]):
                deny("changing files outside the sandbox directory")
        elif event == "os.kill":
            if args[0] != pid:
                deny("signalling other processes")
        elif event in ("ctypes.dlsym", "ctypes.dlsym/handle") and (
            isinstance(args[1], str) and args[1] in symbols
        ):
            deny(f"calling {args[1]} through ctypes")

    sys.addaudithook(hook)


if __name__ == "__main__":
    main()
