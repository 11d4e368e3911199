"""What the tracing tests share: a local collector served for one test, and a traced CLI run.

`serving` runs an HTTP server on 127.0.0.1 in a thread for the test's duration (and stops it by
itself after 120 s whatever happens); `traced_run` runs ``rubric-studio run`` on the offline
models in a fresh process whose environment holds no tracing or key settings but the ones
given, with `SECRET` in the prompt and in a configured key, so a test can tell whether the
tracer scrubbed it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterator
    from http.server import HTTPServer

ROOT = Path(__file__).resolve().parents[1]
SECRET = "Zq81hd7Gq0Lm2-configured-secret"
S = TypeVar("S", bound="HTTPServer")


@contextlib.contextmanager
def serving(server: S) -> Iterator[S]:
    """Serve ``server`` in a thread until the block ends (or 120 s have passed)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    deadline = threading.Timer(120, server.shutdown)  # stops by itself whatever happens
    deadline.daemon = True
    deadline.start()
    try:
        yield server
    finally:
        deadline.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def traced_run(**env: str) -> subprocess.CompletedProcess[str]:
    """``rubric-studio run`` of the haiku with ``env`` (tracing settings) and nothing inherited."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("LANGSMITH_", "LANGCHAIN_", "OTEL_"))
             and not k.endswith("_API_KEY")}
    clean.update(LANGSMITH_TRACING="true", MY_SERVICE_API_KEY=SECRET, **env)
    return subprocess.run(
        [sys.executable, "-m", "rubric_core", "run", "--prompt",
         f"Write a haiku about spring. My key is {SECRET}", "--rubric",
         "- The poem has three lines\n- It mentions spring", "--quiet"],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120, check=False)
