"""The models an OpenAI-compatible server offers, read from its ``GET /models`` list.

Ollama, vLLM, llama.cpp's server and LM Studio all answer ``GET {base_url}/models`` with
``{"data": [{"id": "llama3.1", ...}, ...]}``, so the app can offer their models instead of
asking for names typed by hand. Only the base URL given is asked, within `TIMEOUT_S` for the
whole exchange (a server that trickles its answer a byte at a time is given up on then too), and
a key is sent only when the caller passes one (the one configured for that base URL). A server
that cannot be asked, or answers something else, gives no list and a reason, never an error.

The ids are the server's text, shown in the sidebar and put in model strings: an id that is not
plain text of at most `MAX_ID_CHARS` characters, or that holds a key (a server may echo the
bearer token it was sent) or text shaped like one, is left out.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import httpx

from rubric_core.datasets import has_control_chars
from rubric_core.redact import redact

if TYPE_CHECKING:
    from collections.abc import Coroutine

T = TypeVar("T")

TIMEOUT_S = 2.0
"""Seconds the list may take, connection included: the sidebar waits for it."""

MAX_BYTES = 1_000_000
"""Largest model list read."""

MAX_MODELS = 200
"""Most model ids kept."""

MAX_ID_CHARS = 200
"""Longest model id kept."""

MAX_URL_CHARS = 2_000
"""Longest base URL asked."""


@dataclass(frozen=True)
class ServerModels:
    """What a server's model list said."""

    models: tuple[str, ...] = ()
    """Model ids, as the server lists them (in its order)."""
    problem: str | None = None
    """Why there is no list (unreachable, not a list), said for a person; None when read."""


def list_server_models(base_url: str, *, api_key: str | None = None,
                       timeout_s: float = TIMEOUT_S) -> ServerModels:
    """Ask ``{base_url}/models`` which models the server offers.

    Args:
        base_url: The OpenAI-compatible base URL (``http://127.0.0.1:11434/v1``).
        api_key: Sent as a bearer token when given; only pass the key configured for this
            base URL.
        timeout_s: Bound on the whole exchange, connection and every byte of the answer.

    Returns:
        The model ids, or the reason there are none.

    """
    url = base_url.strip().rstrip("/") + "/models"
    problem = _url_problem(url)
    if problem is not None:
        return ServerModels(problem=problem)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        status, body = _run(_fetch(url, headers, timeout_s))
    except TimeoutError:
        return ServerModels(problem=f"it did not answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return ServerModels(problem=redact(f"it did not answer ({type(exc).__name__}: {exc})"))
    if body is None:
        return ServerModels(problem="its model list is too large to read")
    if status != 200:
        return ServerModels(problem=redact(f"{url} answered HTTP {status}"))
    try:
        data = json.loads(body)
        items = data["data"]
        if not isinstance(items, list):
            raise TypeError(items)
        ids = [str(item["id"]) for item in items if isinstance(item, dict) and item.get("id")]
    except (ValueError, KeyError, TypeError):
        return ServerModels(problem=redact(f"{url} did not answer with a model list"))
    kept = [i for i in ids if _plain_id(i)]
    if ids and not kept:
        return ServerModels(problem="it lists no model id that can be shown (control "
                            "characters, very long, or shaped like a key)")
    return ServerModels(models=tuple(dict.fromkeys(kept))[:MAX_MODELS])


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be asked (a person typed it), or None."""
    if not url.startswith(("http://", "https://")):
        return "the base URL must start with http:// or https://"
    if len(url) > MAX_URL_CHARS:
        return f"the base URL is over {MAX_URL_CHARS:,} characters"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (reading it checks it: a port past 65535 raises)
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL):
        return "the base URL is not a valid URL (check its host and port)"
    if parts.username is not None or parts.password is not None:
        return ("the base URL carries a user name or password: give the server's URL alone "
                "and its key separately")
    return None


def _plain_id(model_id: str) -> bool:
    """Whether a listed id can be shown and used: short plain text, no key in it."""
    return (len(model_id) <= MAX_ID_CHARS and not has_control_chars(model_id)
            and redact(model_id) == model_id)


async def _fetch(url: str, headers: dict[str, str], timeout_s: float
                 ) -> tuple[int, bytes | None]:
    """``GET url`` within ``timeout_s`` in all: the status and body (None: over `MAX_BYTES`).

    Raises:
        TimeoutError: The whole exchange took longer (each read being quick is not enough).
        httpx.HTTPError: The request failed.

    """
    async with (asyncio.timeout(timeout_s),
                httpx.AsyncClient(timeout=timeout_s, follow_redirects=False,
                                  trust_env=False) as client,
                client.stream("GET", url, headers=headers) as response):
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_BYTES:
                return response.status_code, None
        return response.status_code, bytes(body)


def _run(coro: Coroutine[object, object, T]) -> T:
    """Run ``coro`` to its end from sync code, also when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


__all__ = [
    "MAX_BYTES", "MAX_ID_CHARS", "MAX_MODELS", "MAX_URL_CHARS", "TIMEOUT_S", "ServerModels",
    "list_server_models",
]
