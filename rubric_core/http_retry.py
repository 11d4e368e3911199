"""Retrying HTTP calls to model servers: which errors are transient, how long to wait, one wait.

One place for the retry policy that the grader (its bounded retry of a failed pass) and the
experiments (an HTTP client whose 429/5xx retries are shared by every request) both follow:

- `is_transient`: failures worth retrying (timeouts, rate limits, 5xx, dropped or cut replies);
- `retry_after_s`: the wait a server asked for (``retry-after-ms`` / ``Retry-After``), clamped;
- `SharedBackoff`: one wait raised by each 429/5xx and observed by every request, with the
  openai SDK HTTP clients (sync and async) that send their requests through it.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import functools
import itertools
import json
import math
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

RETRY_STATUS_CODES = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses that slow the experiment down instead of failing a row."""
RETRY_AFTER_MAX_S = 30.0
"""The longest wait a server's Retry-After may ask for; longer requests are cut to this."""


_TRANSIENT_NAMES = (
    "Timeout",
    "RateLimit",
    "APIConnection",
    "ConnectError",
    "ConnectionError",
    "ServiceUnavailable",
    "InternalServer",
    "Overloaded",
    "RemoteProtocol",
    "ReadError",
)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (its own or its response's), or None."""
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: timeouts, rate limits, 5xx, dropped or cut replies."""
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if isinstance(exc, json.JSONDecodeError):
        # A reply body cut short (a proxy or a server dying mid-write) is a transport glitch.
        return True
    status = http_status(exc)
    if status is not None and (status in (408, 409, 429) or status >= 500):
        return True
    return any(any(n in cls.__name__ for n in _TRANSIENT_NAMES) for cls in type(exc).__mro__)


def retry_after_s(headers: Mapping[str, str] | None, now: datetime | None = None) -> float | None:
    """How long a server asked the client to wait before retrying, in seconds.

    Reads ``retry-after-ms`` (milliseconds, sent by OpenAI), else ``Retry-After`` in either
    form RFC 9110 allows: delta-seconds (``"7"``) or an HTTP-date
    (``"Wed, 21 Oct 2015 07:28:00 GMT"``, read with `email.utils.parsedate_to_datetime`;
    a date without a zone is taken as UTC). The wait is clamped to 0 … `RETRY_AFTER_MAX_S`.

    Args:
        headers: Response headers (any case-insensitive mapping, e.g. ``httpx.Headers``).
        now: The current time, for tests; the clock's UTC time otherwise.

    Returns:
        The wait, or None when no header is present or none can be read.

    """
    if headers is None:
        return None
    wait: float | None = None
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            wait = float(millis) / 1000
    except (TypeError, ValueError):
        wait = None
    value = headers.get("retry-after") if wait is None else None
    if value is not None:
        try:
            wait = float(value)
        except (TypeError, ValueError):
            try:
                when = email.utils.parsedate_to_datetime(str(value))
            except (TypeError, ValueError, IndexError):
                return None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            wait = (when - (now or datetime.now(UTC))).total_seconds()
    if wait is None or math.isnan(wait):
        return None
    return min(max(wait, 0.0), RETRY_AFTER_MAX_S)


def exception_retry_after_s(exc: BaseException) -> float | None:
    """`retry_after_s` of the response an HTTP error carries; None when it carries none."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    try:
        return retry_after_s(headers)
    except Exception:  # a headers object of an unexpected shape: fall back to the backoff
        return None


class RetryCount:
    """HTTP requests sent again after a 429 or 5xx while one model call was under way."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0
        """Requests sent again so far."""


CALL_HTTP_RETRIES: contextvars.ContextVar[RetryCount | None] = contextvars.ContextVar(
    "rubric_call_http_retries", default=None)
"""The `RetryCount` of the model call under way in this context, if anyone counts: call traces
(`rubric_core.calls`) set a fresh one when a call starts, and `SharedBackoff.retry` adds each
request it sends again. A context (a thread, an asyncio task) makes one model call at a time,
so the count is that call's."""


class SharedBackoff:
    """One wait shared by every request of an experiment, raised by each 429 or 5xx.

    Thread-safe: cells call models on the experiments' event loop, other callers on threads.
    A failed request waits the server's ``Retry-After`` or an exponential delay (``base_s``
    doubling per consecutive failure, at most ``max_s``), whichever is longer, and every other
    request waits for the same moment before it is sent. A success resets the doubling. After
    ``max_attempts`` retries of one request its error goes to the client (and the grader's own
    bounded retry, or the cell's error status).

    Args:
        base_s: First delay.
        max_s: Longest delay.
        max_attempts: Retries of one request before its error is passed on.

    """

    def __init__(self, *, base_s: float = 0.5, max_s: float = 30.0, max_attempts: int = 8) -> None:
        if base_s < 0 or max_s < base_s or max_attempts < 0:
            msg = "need 0 <= base_s <= max_s and max_attempts >= 0"
            raise ValueError(msg)
        self.base_s, self.max_s, self.max_attempts = base_s, max_s, max_attempts
        self.hits = 0
        """429/5xx answers absorbed so far."""
        self.listeners: list[Any] = []
        """Callables ``(status_code, wait_s, hits)`` told of every backoff."""
        self._lock = threading.Lock()
        self._resume_at = 0.0
        self._streak = 0
        self._client: Any = None
        self._async_client: Any = None

    def _delay(self) -> float:
        with self._lock:
            return self._resume_at - time.monotonic()

    def wait(self) -> None:
        """Block until the shared wait is over."""
        while (delay := self._delay()) > 0:
            time.sleep(delay)

    async def await_turn(self) -> None:
        """`wait` for a coroutine: sleep on the event loop until the shared wait is over."""
        while (delay := self._delay()) > 0:
            await asyncio.sleep(delay)

    def retry(self, response: Any, attempt: int) -> bool:
        """Whether to send a request again after ``response`` (a 429/5xx, retries left).

        A retried answer counts as a failure (`failed`), raising the wait for everyone.
        """
        if response.status_code not in RETRY_STATUS_CODES or attempt >= self.max_attempts:
            if response.status_code < 400:
                self.succeeded()
            return False
        self.failed(response.status_code, retry_after_s(response.headers))
        if (counted := CALL_HTTP_RETRIES.get()) is not None:
            counted.count += 1
        return True

    def failed(self, status_code: int, retry_after: float | None) -> float:
        """Record a 429/5xx; returns the wait every request now observes."""
        with self._lock:
            delay = min(self.max_s, self.base_s * 2 ** self._streak)
            delay = max(delay, retry_after or 0.0)
            self._streak += 1
            self.hits += 1
            self._resume_at = max(self._resume_at, time.monotonic() + delay)
            hits = self.hits
        for listener in list(self.listeners):
            listener(status_code, delay, hits)
        return delay

    def succeeded(self) -> None:
        """A request went through: the next failure starts the doubling again."""
        with self._lock:
            self._streak = 0

    def http_client(self) -> Any:
        """The ``openai.DefaultHttpxClient`` whose requests go through this backoff.

        One client (one connection pool) is shared by every model of the experiment: building
        one per model would cost each cell a TLS context and new connections.
        """
        with self._lock:
            if self._client is None:
                self._client = _backoff_client_classes()[0](backoff=self)
            return self._client

    def http_async_client(self) -> Any:
        """The ``openai.DefaultAsyncHttpxClient`` twin of `http_client`, for async calls.

        Its connections belong to the batch work loop (`rubric_core.background.work_loop`),
        where every cell's (and re-graded item's) model calls are made.
        """
        with self._lock:
            if self._async_client is None:
                self._async_client = _backoff_client_classes()[1](backoff=self)
            return self._async_client


@functools.cache
def _backoff_client_classes() -> tuple[type, type]:
    """The openai SDK's sync and async HTTP clients, retrying 429/5xx through a `SharedBackoff`."""
    from openai import DefaultAsyncHttpxClient, DefaultHttpxClient

    class BackoffClient(DefaultHttpxClient):
        def __init__(self, *, backoff: SharedBackoff, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._backoff = backoff

        def send(self, request: Any, **kwargs: Any) -> Any:
            request.read()  # the body is sent again on a retry
            for attempt in itertools.count():
                self._backoff.wait()
                response = super().send(request, **kwargs)
                if not self._backoff.retry(response, attempt):
                    return response
                response.close()
            raise AssertionError  # unreachable: retry() ends the loop

    class AsyncBackoffClient(DefaultAsyncHttpxClient):
        def __init__(self, *, backoff: SharedBackoff, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._backoff = backoff

        async def send(self, request: Any, **kwargs: Any) -> Any:
            await request.aread()  # the body is sent again on a retry
            for attempt in itertools.count():
                await self._backoff.await_turn()
                response = await super().send(request, **kwargs)
                if not self._backoff.retry(response, attempt):
                    return response
                await response.aclose()
            raise AssertionError  # unreachable: retry() ends the loop

    return BackoffClient, AsyncBackoffClient


__all__ = [
    "CALL_HTTP_RETRIES", "RETRY_AFTER_MAX_S", "RETRY_STATUS_CODES", "RetryCount", "SharedBackoff",
    "exception_retry_after_s", "http_status", "is_transient", "retry_after_s",
]
