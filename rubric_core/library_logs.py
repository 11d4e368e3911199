"""Where our dependencies' own log records go: DBOS's and psycopg's, never a terminal unasked.

What they log when the database goes away (DBOS's "Notification listener error" and its
retries, psycopg_pool's "discarding closed connection") is what our own message says once, in
words a person can act on (`rubric_core.engine.outage`). A command of the CLI chooses with
`send_library_logs`: to a file (``--log-file PATH``), to standard error (``--verbose``), or
nowhere, the default. A process that does not choose (the app, a script, the tests) keeps
DBOS's warnings on its standard error of the moment (`rubric_core.engine.launch`) and
psycopg's on Python's last-resort handler, as before.

Every record is scrubbed of secrets before any handler sees it (`rubric_core.redact`).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

LIBRARY_LOGGERS = ("dbos", "psycopg", "sqlalchemy")
"""The loggers routed (their children too: ``psycopg.pool``)."""

FORMAT = "%(asctime)s %(levelname)s (%(name)s) %(message)s"
"""How a routed record is written."""

_routed: list[bool] = []  # set once a command chose where the records go


class CurrentStderr(logging.StreamHandler):
    """Writes each record to the ``sys.stderr`` of the moment, not the one of its creation.

    A handler that kept the stream of its creation writes to a closed one once the process
    redirected its output (a test's captured stderr, an app's), and fails.
    """

    @property
    def stream(self) -> Any:
        """The current ``sys.stderr``."""
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


def send_library_logs(*, verbose: bool = False, log_file: str | None = None
                      ) -> Callable[[], None]:
    """Send the `LIBRARY_LOGGERS` ' warnings to ``log_file``, to stderr, or nowhere.

    Args:
        verbose: Also write them to standard error.
        log_file: Append them to this file (created when missing).

    Returns:
        A function that puts back the loggers as they were (a command run in-process, as the
        tests run them, leaves the process as it found it).

    Raises:
        OSError: The log file cannot be opened for appending.

    """
    handlers: list[logging.Handler] = []
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="a", encoding="utf-8"))
    if verbose:
        handlers.append(CurrentStderr())
    formatter = logging.Formatter(FORMAT, datefmt="%H:%M:%S")
    for handler in handlers:
        handler.setFormatter(formatter)
    # A logger with no handler would reach Python's last resort (the terminal).
    handlers = handlers or [logging.NullHandler()]
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    saved = [(list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    was_routed = list(_routed)
    for logger in loggers:
        for old in list(logger.handlers):
            logger.removeHandler(old)
        for handler in handlers:
            logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    _routed[:] = [True]

    def restore() -> None:
        for logger, (before, level, propagate) in zip(loggers, saved, strict=True):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            for handler in before:
                logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
        for handler in handlers:
            handler.close()
        _routed[:] = was_routed

    return restore


def library_logs_routed() -> bool:
    """Whether a command chose where the library records go (`send_library_logs`)."""
    return bool(_routed)


__all__ = ["FORMAT", "LIBRARY_LOGGERS", "CurrentStderr", "library_logs_routed",
           "send_library_logs"]
