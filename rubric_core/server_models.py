"""The models an OpenAI-compatible server offers, read from its ``GET /models`` list.

Ollama, vLLM, llama.cpp's server and LM Studio all answer ``GET {base_url}/models`` with
``{"data": [{"id": "llama3.1", ...}, ...]}``, so the app can offer their models instead of
asking for names typed by hand. Only the base URL given is asked, within `TIMEOUT_S`, and a
key is sent only when the caller passes one (the one configured for that base URL). A server
that cannot be asked, or answers something else, gives no list and a reason, never an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from rubric_core.redact import redact

TIMEOUT_S = 2.0
"""Seconds the list may take, connection included: the sidebar waits for it."""

MAX_BYTES = 1_000_000
"""Largest model list read."""

MAX_MODELS = 200
"""Most model ids kept."""


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
        timeout_s: Bound on the whole request.

    Returns:
        The model ids, or the reason there are none.

    """
    url = base_url.strip().rstrip("/") + "/models"
    if not url.startswith(("http://", "https://")):
        return ServerModels(problem="the base URL must start with http:// or https://")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with (httpx.Client(timeout=timeout_s, follow_redirects=False,
                           trust_env=False) as client,
              client.stream("GET", url, headers=headers) as response):
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    return ServerModels(problem="its model list is too large to read")
            status = response.status_code
    except httpx.HTTPError as exc:
        return ServerModels(problem=redact(f"it did not answer ({type(exc).__name__}: {exc})"))
    if status != 200:
        return ServerModels(problem=f"{url} answered HTTP {status}")
    try:
        data = json.loads(body)
        items = data["data"]
        ids = [str(item["id"]) for item in items if isinstance(item, dict) and item.get("id")]
    except (ValueError, KeyError, TypeError):
        return ServerModels(problem=f"{url} did not answer with a model list")
    return ServerModels(models=tuple(dict.fromkeys(ids))[:MAX_MODELS])


__all__ = ["MAX_BYTES", "MAX_MODELS", "TIMEOUT_S", "ServerModels", "list_server_models"]
