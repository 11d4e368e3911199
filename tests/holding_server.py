"""A loopback server that holds calls, and a SIGINT disposition for child processes.

`HoldingServer` lets a test act on processes in the middle of their model calls without racing
them; `sigint` starts children as a terminal's foreground job would (or as a background job of
a script, which inherits SIGINT ignored).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from openai_server import DelayedServer, Reply, verdict

if TYPE_CHECKING:
    from collections.abc import Iterator

CRITERION = "answers the question"

class HoldingServer(DelayedServer):
    """A `DelayedServer` whose grader passes `CRITERION` at once, that answers its first
    ``free`` calls and holds every later one until `release`.

    While it holds them no cell can end, so a test can act on the processes calling it without
    racing them. A stopped run ends after its step in progress, so release the calls after
    asking for the stop.

    Attributes:
        held: Calls held so far (released or not).
    """

    def __init__(self, *, free: int, delay_s: float = 0.05) -> None:
        super().__init__(delay_s=delay_s, grader_reply=verdict("satisfied", (), (CRITERION,)))
        self.free, self.calls, self.held = free, 0, 0
        self._gate = threading.Event()
        self._count = threading.Lock()

    def respond(self, body: dict[str, Any]) -> Reply:
        """Hold the call once ``free`` calls were answered, then answer as `DelayedServer`."""
        with self._count:
            self.calls += 1
            hold = self.calls > self.free
            self.held += hold
        if hold:
            self._gate.wait()
        return super().respond(body)

    def release(self, after_s: float = 0.0) -> None:
        """Answer the held calls and every later one (``after_s`` from now, in the background)."""
        if after_s:
            threading.Timer(after_s, self._gate.set).start()
        else:
            self._gate.set()

    def wait_held(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` calls are held (or fail the test)."""
        deadline = time.monotonic() + timeout_s
        while self.held < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.held >= count, f"only {self.held} of {count} calls arrived"


@contextlib.contextmanager
def sigint(disposition: Any) -> Iterator[None]:
    """Processes started inside inherit this SIGINT disposition (``SIG_IGN`` stays ignored; a
    handler becomes the default action, so a Python child raises KeyboardInterrupt)."""
    before = signal.signal(signal.SIGINT, disposition)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
