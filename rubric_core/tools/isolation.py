"""The kernel boundary around graded code: how `rubric_core.tools.sandbox` starts its child.

Two modes, chosen by ``RUBRIC_STUDIO_SANDBOX``:

- ``bwrap`` (the default): the child runs under bubblewrap in new user, PID, network, IPC, UTS,
  cgroup and mount namespaces. Its filesystem is an empty read-only root holding ``/usr`` (and
  the merged-usr links), the Python installation (read-only, its site-packages hidden), a fresh
  ``/proc`` of its own PID namespace, a minimal ``/dev`` and one writable work dir ``/work``, a
  tmpfs of bounded size. No home, project, database or example file exists in there, the
  environment is cleared, there is no network but the sandbox's own loopback, every capability
  is dropped, and a seccomp filter refuses the system calls that are kernel attack surface
  rather than anything graded code needs (see `SECCOMP_DENIED`). ``--die-with-parent`` plus the PID
  namespace mean that when the sandbox's first process ends or is killed, every process the
  candidate started ends with it. When this process is root the sandbox drops to uid 65534
  first (an outer mount namespace lends it the Python installation, which may sit in a
  directory only root can enter), so the kernel's per-user process limit applies, as it does
  not for root.
- ``unsafe-process``: only a separate process with rlimits and an audit hook, in the same
  filesystem, network and user as the app. The name says what it is: it exists for machines
  without bubblewrap (macOS, locked-down containers) and only when asked for by name.

Where bubblewrap or unprivileged user namespaces are missing, `sandbox_status` says exactly what
to install or enable, and no code runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import site
import struct
import subprocess
import sys
import threading

SANDBOX_ENV = "RUBRIC_STUDIO_SANDBOX"
"""Environment variable choosing the mode: ``bwrap`` (default) or ``unsafe-process``."""

BWRAP_ENV = "RUBRIC_STUDIO_BWRAP"
"""Environment variable giving the bubblewrap binary to use (default: ``bwrap`` on PATH)."""

BWRAP = "bwrap"
UNSAFE_PROCESS = "unsafe-process"
MODES = (BWRAP, UNSAFE_PROCESS)

SANDBOX_UID = 65534
"""The user (``nobody``) the sandbox runs as, inside and, when the app is root, outside too."""

WORK_DIR = "/work"
"""The candidate's working directory inside the sandbox."""

SHM_LIMIT_BYTES = 1024 * 1024
"""Size of the sandbox's ``/dev/shm`` (multiprocessing's semaphores live there)."""

INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: 'sudo apt-get install bubblewrap'; Fedora: "
    "'sudo dnf install bubblewrap'; Arch: 'sudo pacman -S bubblewrap'). There is no "
    "bubblewrap for macOS or Windows: run Rubric Studio on Linux (a VM or a container) to "
    "grade code."
)
USERNS_HINT = (
    "Enable unprivileged user namespaces: 'sudo sysctl -w kernel.unprivileged_userns_clone=1' "
    "(Debian), 'sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0' or an AppArmor "
    "profile allowing bwrap 'userns' (Ubuntu 23.10+), 'sudo sysctl -w "
    "user.max_user_namespaces=15000' where it is 0; in Docker, run the container with "
    "'--security-opt seccomp=unconfined --security-opt apparmor=unconfined'."
)
UNSAFE_HINT = (
    f"To run graded code anyway with the weaker process-only sandbox (same user, filesystem and "
    f"network as the app), set {SANDBOX_ENV}={UNSAFE_PROCESS}."
)

# System calls the sandbox refuses with EPERM. None is needed to run Python code; each is
# kernel attack surface (frequent privilege-escalation bugs) or a way to look at, or out of,
# the sandbox. Numbers per architecture: x86_64 from arch/x86/entry/syscalls/syscall_64.tbl,
# aarch64 from include/uapi/asm-generic/unistd.h.
SECCOMP_DENIED: dict[str, tuple[int, int]] = {
    # name: (x86_64, aarch64)
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "syslog": (103, 116),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "acct": (163, 89),
    "quotactl": (179, 60),
    # Memory that no rlimit counts: System V shared memory segments and message queues outlive
    # a detach (RLIMIT_AS sees a segment only while it is mapped), and extended attributes on
    # the work dir's tmpfs are kernel memory outside its size limit. No stdlib module uses
    # either (multiprocessing uses POSIX shm in the size-limited /dev/shm); shutil's xattr
    # copying ignores EPERM.
    "shmget": (29, 194),
    "msgget": (68, 186),
    "setxattr": (188, 5),
    "lsetxattr": (189, 6),
    "fsetxattr": (190, 7),
    "setxattrat": (463, 463),
}

_ARCHES = {
    # machine: (AUDIT_ARCH_*, column in SECCOMP_DENIED, clone nr, clone3 nr)
    "x86_64": (0xC000003E, 0, 56, 435),
    "aarch64": (0xC00000B7, 1, 220, 435),
}
_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000
_EPERM, _ENOSYS = 1, 38


@dataclasses.dataclass(frozen=True)
class SandboxStatus:
    """What `run_tests` would do now."""

    mode: str
    """``bwrap``, ``unsafe-process``, or ``unavailable`` when graded code cannot run."""
    ready: bool
    """True when graded code can run."""
    detail: str
    """One or two sentences for people: what is in force, or exactly what to install/enable."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """How to start one sandboxed child: the argv prefix before ``python -c ...``."""

    mode: str
    """``bwrap`` or ``unsafe-process``."""
    argv: list[str]
    """Everything before the interpreter's own arguments (the interpreter included)."""
    uses_seccomp: bool
    """Whether a seccomp program must be passed (see `seccomp_program`)."""


def requested_mode() -> str:
    """The mode named by ``RUBRIC_STUDIO_SANDBOX`` (``bwrap`` when unset)."""
    return os.environ.get(SANDBOX_ENV, "").strip() or BWRAP


def bwrap_binary() -> str | None:
    """The bubblewrap binary to use, or None when there is none."""
    configured = os.environ.get(BWRAP_ENV, "").strip()
    if configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else None
    return shutil.which("bwrap")


def base_python() -> str:
    """The real interpreter binary behind this one (a venv's ``python`` is a link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _python_roots() -> list[str]:
    """Directories that hold the Python installation, outside /usr (which is always mounted)."""
    roots: list[str] = []
    for path in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(base_python())):
        real = os.path.realpath(path)
        if real == "/usr" or real.startswith("/usr/") or real == "/":
            continue
        if not any(real == root or real.startswith(root + "/") for root in roots):
            roots = [root for root in roots if not root.startswith(real + "/")] + [real]
    return roots


def _hidden_package_dirs() -> list[str]:
    """Installed-package directories of the base Python: hidden, so no project code is visible."""
    prefixes = sorted({sys.base_prefix, sys.base_exec_prefix})
    dirs = [*site.getsitepackages(prefixes), "/usr/lib/python3/dist-packages"]
    dirs += [f"/usr/local/lib/python3.{sys.version_info.minor}/dist-packages"]
    found: list[str] = []
    for path in dirs:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in found:
            found.append(real)
    return found


def _hidden_app_dirs(mounted: list[str]) -> list[str]:
    """App directories inside a mounted tree, to hide behind an empty read-only tmpfs.

    For example a project in /usr/src/app, or a venv or database under /usr/local.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    project = os.path.dirname(os.path.dirname(here))  # the directory holding rubric_core/
    wanted = [os.getcwd(), project, sys.prefix, os.path.expanduser("~")]
    if db := os.environ.get("RUBRIC_STUDIO_DB", "").strip():
        wanted.append(os.path.dirname(os.path.abspath(os.path.expanduser(db))))
    bases = (sys.base_prefix, sys.base_exec_prefix)
    needed = [base_python(), *(os.path.realpath(p) for p in bases)]
    hidden: list[str] = []
    for path in wanted:
        real = os.path.realpath(path)
        inside = any(real == m or real.startswith(m.rstrip("/") + "/") for m in mounted)
        # Never hide something the interpreter itself lives in (or an ancestor of it).
        covers_needed = any(n == real or n.startswith(real.rstrip("/") + "/") for n in needed)
        if inside and not covers_needed and os.path.isdir(real) and real not in hidden:
            hidden.append(real)
    return hidden


def seccomp_supported() -> bool:
    """Whether `seccomp_program` has syscall numbers for this CPU architecture."""
    return sys.platform == "linux" and platform.machine() in _ARCHES


def seccomp_program() -> bytes:
    """A classic-BPF seccomp program: deny `SECCOMP_DENIED`, user namespaces and foreign ABIs.

    Calls from another architecture or ABI (i386 via ``int 0x80``, x32) kill the process, since
    their numbers differ; ``clone`` with ``CLONE_NEWUSER`` gets EPERM; ``clone3`` gets ENOSYS, as
    its flags sit behind a pointer the filter cannot read, and libc then falls back to
    ``clone``. Everything else is allowed.
    """
    audit_arch, column, clone_nr, clone3_nr = _ARCHES[platform.machine()]
    ld_abs, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    errno_ret = 0x00050000
    denied = sorted({numbers[column] for numbers in SECCOMP_DENIED.values()})

    prog: list[tuple[int, int, int, int]] = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, kill),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
    ]
    if platform.machine() == "x86_64":
        prog += [(jge, 0, 1, _X32_SYSCALL_BIT), (ret, 0, 0, kill)]
    prog += [(jeq, 0, 1, clone3_nr), (ret, 0, 0, errno_ret | _ENOSYS)]
    # clone: look at the low word of its flags argument (seccomp_data.args[0] at offset 16).
    prog += [
        (jeq, 0, 3, clone_nr),
        (ld_abs, 0, 0, 16),
        (jset, 0, 1, _CLONE_NEWUSER),
        (ret, 0, 0, errno_ret | _EPERM),
        (ld_abs, 0, 0, 0),
    ]
    for index, number in enumerate(denied):
        # jump straight to the EPERM return after the remaining checks and the ALLOW
        prog.append((jeq, len(denied) - index, 0, number))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, errno_ret | _EPERM)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def _bwrap_argv(
    bwrap: str, *, work_bytes: int, seccomp_fd: int | None, status_fd: int | None = None
) -> list[str]:
    """The full command that starts the base interpreter inside the sandbox."""
    root = os.geteuid() == 0
    roots = _python_roots()
    argv: list[str] = []
    lent: dict[str, str] = {}  # real path -> where the outer stage lends it (root only)
    if root:
        # Outer stage, as root: a private mount namespace that lends each Python root at a
        # path uid 65534 can reach, then drop to that uid for the real sandbox.
        setpriv = shutil.which("setpriv")
        if setpriv is None:  # checked by sandbox_status; kept here for direct callers
            msg = "setpriv (util-linux) is needed to drop root for the sandbox"
            raise RuntimeError(msg)
        argv += [bwrap, "--dev-bind", "/", "/", "--tmpfs", "/tmp", "--die-with-parent"]
        for index, path in enumerate(roots):
            lent[path] = f"/tmp/rubric-python-{index}"
            argv += ["--ro-bind", path, lent[path]]
        argv += ["--", setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}",
                 "--clear-groups", "--"]
    argv += [
        bwrap,
        "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
        "--cap-drop", "ALL", "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "HOME", WORK_DIR, "--setenv", "TMPDIR", WORK_DIR,
        "--ro-bind", "/usr", "/usr",
    ]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in roots:
        argv += ["--ro-bind", lent.get(path, path), path]
    system = ["/usr", *(os.path.realpath("/" + n) for n in ("bin", "sbin", "lib", "lib64"))]
    for path in _hidden_package_dirs() + _hidden_app_dirs([*system, *roots]):
        argv += ["--tmpfs", path, "--remount-ro", path]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(SHM_LIMIT_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", str(work_bytes), "--tmpfs", WORK_DIR, "--chdir", WORK_DIR,
    ]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    else:
        argv += ["--disable-userns"]
    argv += ["--remount-ro", "/", "--", base_python()]
    return argv


def launch(*, work_bytes: int, seccomp_fd: int | None, status_fd: int | None = None) -> Launch:
    """How to start a child in the current mode. Call `sandbox_status` first: this assumes ready.

    Args:
        work_bytes: Size of the sandbox's writable work dir.
        seccomp_fd: A readable fd holding `seccomp_program` (bwrap mode, when supported).
        status_fd: A writable fd for bubblewrap's JSON status (it reports the host pid of the
            sandbox's first process there).

    """
    mode = requested_mode()
    if mode == UNSAFE_PROCESS:
        return Launch(mode, [sys.executable], uses_seccomp=False)
    bwrap = bwrap_binary()
    assert bwrap is not None
    return Launch(
        BWRAP,
        _bwrap_argv(bwrap, work_bytes=work_bytes, seccomp_fd=seccomp_fd, status_fd=status_fd),
        uses_seccomp=seccomp_fd is not None,
    )


def seccomp_fd() -> int | None:
    """A pipe's read end holding the seccomp program (caller closes it), or None if unsupported."""
    if not seccomp_supported():
        return None
    program = seccomp_program()
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)  # a few hundred bytes: far below the pipe buffer
    finally:
        os.close(write_fd)
    return read_fd


_status_lock = threading.Lock()
_status_cache: dict[tuple[str, str | None, int], SandboxStatus] = {}


def sandbox_status(*, refresh: bool = False) -> SandboxStatus:
    """Whether graded code can run now, in which mode, and if not, what to do about it.

    The first call per configuration starts one tiny sandbox to prove the kernel allows it
    (about 50 ms); the answer is cached. ``refresh`` probes again.
    """
    mode = requested_mode()
    key = (mode, os.environ.get(BWRAP_ENV), os.geteuid())
    with _status_lock:
        if not refresh and key in _status_cache:
            return _status_cache[key]
        status = _probe(mode)
        _status_cache[key] = status
        return status


def _probe(mode: str) -> SandboxStatus:
    if mode == UNSAFE_PROCESS:
        return SandboxStatus(
            UNSAFE_PROCESS, True,
            f"UNSAFE: {SANDBOX_ENV}={UNSAFE_PROCESS} is set, so graded code runs as a plain child "
            "process with rlimits: same user, files and network as the app, and it can read "
            "what the app can. Use it only for code you trust.",
        )
    if mode != BWRAP:
        return SandboxStatus(
            "unavailable", False,
            f"{SANDBOX_ENV}={mode!r} is not a sandbox mode: use {BWRAP!r} (the default) or "
            f"{UNSAFE_PROCESS!r}.",
        )
    if sys.platform != "linux":
        return SandboxStatus(
            "unavailable", False,
            f"Graded code is not run: the bubblewrap sandbox needs Linux, and this is "
            f"{sys.platform}. {INSTALL_HINT} {UNSAFE_HINT}",
        )
    bwrap = bwrap_binary()
    if bwrap is None:
        where = os.environ.get(BWRAP_ENV, "").strip()
        missing = f"{BWRAP_ENV}={where!r} is not an executable file" if where else (
            "bubblewrap ('bwrap') is not installed")
        return SandboxStatus(
            "unavailable", False, f"Graded code is not run: {missing}. {INSTALL_HINT} {UNSAFE_HINT}"
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return SandboxStatus(
            "unavailable", False,
            "Graded code is not run: the app runs as root, and the sandbox drops to an "
            "unprivileged user with 'setpriv', which is missing. Install util-linux "
            f"('sudo apt-get install util-linux'), or run the app as a normal user. {UNSAFE_HINT}",
        )
    fd = seccomp_fd()
    try:
        argv = _bwrap_argv(bwrap, work_bytes=1024 * 1024, seccomp_fd=fd)
        argv += ["-I", "-S", "-B", "-c", "import os; assert os.getcwd() == '/work'"]
        pass_fds = () if fd is None else (fd,)

        def start() -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(argv, capture_output=True, timeout=30, pass_fds=pass_fds,
                                  stdin=subprocess.DEVNULL, check=False)

        try:
            try:
                done = start()
            except OSError:
                # Once more before the answer is cached for the process's life: a start that
                # failed once (seen: EFAULT from the spawn, in one fresh-clone test run) need
                # not fail again; a missing or broken bubblewrap does.
                done = start()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return SandboxStatus(
                "unavailable", False, f"Graded code is not run: bubblewrap ({bwrap}) could not "
                f"be started: {exc}. {INSTALL_HINT} {UNSAFE_HINT}",
            )
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        last = said[-1][:300] if said else f"exit code {done.returncode}"
        lowered = last.lower()
        if "namespace" in lowered or "permission" in lowered or "not permitted" in lowered:
            hint = USERNS_HINT
        elif "unknown option" in lowered or "unrecognized" in lowered:
            hint = "Bubblewrap 0.6 or newer is needed: upgrade the bubblewrap package."
        else:
            hint = INSTALL_HINT
        return SandboxStatus(
            "unavailable", False,
            f"Graded code is not run: bubblewrap could not create the sandbox ({last}). "
            f"{hint} {UNSAFE_HINT}",
        )
    filtered = "a seccomp filter, " if fd is not None else ""
    return SandboxStatus(
        BWRAP, True,
        "bubblewrap: graded code runs in its own user, PID, network and mount namespaces with "
        f"{filtered}no network, a read-only system, no project files and a size-limited work dir.",
    )
