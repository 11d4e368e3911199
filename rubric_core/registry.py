"""What this process holds: the registry of what it is running, and its name on what it holds.

Streamlit starts a rerun on a new script thread while the one it replaces still unwinds, so a
page asks here whether a run or an experiment is still being driven by this process, finds the
stop event of one another rerun started, or waits for one to let go. `ActiveRegistry` is that
registry (one for runs in `rubric_core.session`, one for experiments in
`rubric_core.app_support.experimenting`). It answers for this process only: what other
processes hold is read from the database's rows, where each hold carries an owner name
(`new_owner`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Generic, TypeVar

from rubric_core.redact import redact

if TYPE_CHECKING:
    from collections.abc import Iterator

V = TypeVar("V")


STALE_AFTER_ENV = "RUBRIC_STUDIO_STALE_AFTER_S"
"""Environment variable that overrides `STALE_AFTER_S` (seconds, 3 to 3600)."""


def _stale_after_s() -> float:
    raw = os.environ.get(STALE_AFTER_ENV, "").strip()
    if not raw:
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 3.0 <= value <= 3600.0:  # NaN fails too
        msg = f"{STALE_AFTER_ENV} must be a number of seconds from 3 to 3600, got {raw!r}"
        raise ValueError(msg)
    return value


STALE_AFTER_S = _stale_after_s()
"""A ``running`` run untouched this long, and not recorded by this process, lost its owner
(`rubric_core.session`): 30 s, or `STALE_AFTER_ENV`. Every process sharing a database should
use the same value. A PostgreSQL transaction left idle this long is ended by the server
(`rubric_core.store`): its process is as good as gone, and it must not hold the rows of the
runs others take over."""


HEARTBEAT_ENV = "RUBRIC_STUDIO_HEARTBEAT_S"
"""Environment variable that overrides `HEARTBEAT_S` (seconds, 0.05 up to a third of
`STALE_AFTER_S`)."""


def _heartbeat_s() -> float:
    default = min(5.0, STALE_AFTER_S / 3)
    raw = os.environ.get(HEARTBEAT_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.05 <= value <= STALE_AFTER_S / 3:  # NaN fails too
        msg = (f"{HEARTBEAT_ENV} must be a number of seconds from 0.05 to a third of "
               f"{STALE_AFTER_ENV} ({STALE_AFTER_S / 3:g}), got {raw!r}")
        raise ValueError(msg)
    return value


HEARTBEAT_S = _heartbeat_s()
"""Seconds between an owner's touches of the rows it holds: a third of `STALE_AFTER_S` (at
most 5 s), or `HEARTBEAT_ENV`. More often, a live owner must be starved of the CPU for almost
`STALE_AFTER_S` before another process takes it for gone (the tests' short staleness)."""


def new_owner() -> str:
    """A name for one hold on a row (a run, a queue engine's executor): ``host:pid:random``.

    The host and process say who holds it (a reader can tell processes apart); the random
    part tells two holds of one process apart.
    """
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_process(owner: str | None) -> tuple[str, str]:
    """``(host, pid)`` of a hold's owner (`new_owner`), as text (empty parts when unreadable)."""
    host, _, rest = (owner or "").partition(":")
    return host, rest.partition(":")[0]


def owned_here(owner: str | None) -> bool:
    """Whether a hold's owner (`new_owner`) is this very process."""
    return owner_process(owner) == (socket.gethostname(), str(os.getpid()))


_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")


def describe_owner(owner: str | None) -> str:
    """``pid N on HOST`` for a message naming the process that holds something.

    The owner is read from the database, where any process sharing it may have written it, and
    the message may be drawn as Markdown: a host that is not a host name's characters (or is
    key-shaped), or a pid that is not digits, is shown as ``?``, so no text of the row reaches
    the message.
    """
    host, pid = owner_process(owner)
    shown_host = host if _HOST_NAME.fullmatch(host) and redact(host) == host else "?"
    return f"pid {pid if pid.isdigit() and len(pid) <= 10 else '?'} on {shown_host}"


def owner_is_gone(owner: str | None) -> bool:
    """Whether a hold's owner (`new_owner`) was a process of this host that has exited.

    Then its hold is stale at once, without waiting for its heartbeat to age: a run whose
    process was killed on this machine can be resumed right away. Only a process of this
    host can be checked (another host's pids mean nothing here); this process itself is
    never gone; a pid reused since by another process reads as alive (the heartbeat rule
    then decides, as for another host).
    """
    host, pid_text = owner_process(owner)
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, under another user
        return False
    return False


class ActiveRegistry(Generic[V]):
    """Ids this process is working on right now, each with a value (e.g. its stop event).

    Thread-safe. An id is added when the work starts and discarded when it has unwound, so a
    page's next rerun can tell "still running or stopping here" from "free".

    Args:
        noun: What an id names, capitalised, for the error of a second `add` (``"Run"``).

    """

    def __init__(self, noun: str) -> None:
        self.noun = noun
        self._values: dict[str, V] = {}
        self._changed = threading.Condition()

    def __contains__(self, key: object) -> bool:
        with self._changed:
            return key in self._values

    def get(self, key: str) -> V | None:
        """The value registered with ``key``, or None when it is not active."""
        with self._changed:
            return self._values.get(key)

    def keys(self) -> set[str]:
        """A snapshot of the active ids."""
        with self._changed:
            return set(self._values)

    def add(self, key: str, value: V) -> None:
        """Register ``key`` as active.

        Raises:
            RuntimeError: It is active already (running, or still stopping).

        """
        with self._changed:
            if key in self._values:
                msg = (f"{self.noun} {key[:8]} is already running or stopping in this server; "
                       "wait a moment and try again.")
                raise RuntimeError(msg)
            self._values[key] = value

    def discard(self, key: str) -> None:
        """Unregister ``key`` (if registered) and wake whoever waits for it."""
        with self._changed:
            self._values.pop(key, None)
            self._changed.notify_all()

    @contextlib.contextmanager
    def hold(self, key: str, value: V) -> Iterator[V]:
        """`add` for the length of a ``with`` block, then `discard`; yields ``value``."""
        self.add(key, value)
        try:
            yield value
        finally:
            self.discard(key)

    def wait_until_inactive(self, key: str, timeout_s: float) -> bool:
        """Wait for ``key`` to be discarded; True when it is no longer active."""
        with self._changed:
            return self._changed.wait_for(lambda: key not in self._values, timeout=timeout_s)


__all__ = ["ActiveRegistry", "new_owner", "owner_is_gone"]
