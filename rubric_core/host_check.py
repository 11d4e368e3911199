"""Answer only this server's own host names: the DNS-rebinding defence for the app.

A page on ``evil.example`` can rebind its name to 127.0.0.1 and then talk to a local app as if
it were same-origin. Its browser still sends ``Host: evil.example`` (and, on a WebSocket,
``Origin: http://evil.example``), so refusing every request whose ``Host`` is not one of ours
stops it. Served names: ``127.0.0.1``, ``localhost``, ``[::1]`` and the names listed in
``RUBRIC_STUDIO_ALLOWED_HOSTS`` (``a.example,b.example``).

Any port is accepted: the name is what defeats rebinding, and the port a browser sees differs
from the served one behind an SSH tunnel, port forwarding or a reverse proxy.

:class:`HostCheckMiddleware` is a plain ASGI middleware (no Streamlit in it); ``serve.py``
puts it in front of the Streamlit app through ``st.App(middleware=...)``, and
:func:`require_installed`, the app's lifespan, makes the server refuse to start unless the
middleware actually sits in the request path.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Mapping

    from starlette.types import ASGIApp, Receive, Scope, Send

ALLOWED_HOSTS_ENV: Final = "RUBRIC_STUDIO_ALLOWED_HOSTS"
"""Environment variable listing extra served host names, comma-separated."""

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
"""Names always served; IPv6 addresses are kept without brackets."""

HOST_REFUSED: Final = (
    "Forbidden: this server does not answer to that Host name. Rubric Studio serves "
    f"127.0.0.1, localhost, [::1] and the names in {ALLOWED_HOSTS_ENV}.\n"
)
ORIGIN_REFUSED: Final = (
    "Forbidden: WebSocket from a page whose Origin is not one of this server's host names.\n"
)
NOT_INSTALLED: Final = (
    "This server does not check Host names, so a web page could reach it through DNS "
    "rebinding. Stop it and start the app with `.venv/bin/streamlit run serve.py`."
)

_LOGGER: Final = logging.getLogger(__name__)

# A Host header or Origin authority: a name or IPv4 address, or a bracketed IPv6 address,
# then an optional port. Anything else (user info, paths, odd characters) is refused.
_AUTHORITY: Final = re.compile(
    r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?"
)
_NAME: Final = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")

_installed = False


def _ipv6(text: str) -> str | None:
    try:
        return ipaddress.IPv6Address(text).compressed
    except ValueError:
        return None


def host_name(authority: str) -> str | None:
    """The host name in a ``Host`` header value, normalised for comparison.

    Args:
        authority: ``name``, ``name:port``, ``[ipv6]`` or ``[ipv6]:port``.

    Returns:
        The name lower-cased (an IPv6 address compressed, without brackets), or None when the
        value is malformed or its port is out of range.

    """
    match = _AUTHORITY.fullmatch(authority)
    if match is None or (match["port"] is not None and int(match["port"]) > 65535):
        return None
    if match["ipv6"] is not None:
        return _ipv6(match["ipv6"])
    return match["name"].lower()


def origin_host_name(origin: str) -> str | None:
    """The host name of a WebSocket's ``Origin`` (``http(s)://authority``), or None.

    ``null`` (sandboxed frames, ``file:`` pages) and any other scheme give None.
    """
    scheme, sep, authority = origin.partition("://")
    if not sep or scheme.lower() not in {"http", "https"}:
        return None
    return host_name(authority)


def allowed_hosts(env: Mapping[str, str]) -> frozenset[str]:
    """The served host names: the loopback names plus those listed in ``env``.

    Args:
        env: The environment; ``RUBRIC_STUDIO_ALLOWED_HOSTS`` holds comma-separated names or
            IP addresses (IPv6 with or without brackets), no ports, schemes or wildcards.

    Returns:
        The names, normalised as :func:`host_name` returns them.

    Raises:
        ValueError: An entry is not a plain host name or address.

    """
    names = set(LOOPBACK_HOSTS)
    for entry in env.get(ALLOWED_HOSTS_ENV, "").split(","):
        text = entry.strip().lower()
        if not text:
            continue
        name = _ipv6(text.removeprefix("[").removesuffix("]")) if ":" in text else text
        if name is None or (":" not in name and _NAME.fullmatch(name) is None):
            msg = (
                f"{ALLOWED_HOSTS_ENV}: {entry.strip()!r} is not a host name. List the names "
                "clients use, comma-separated, without ports, schemes or wildcards, e.g. "
                f"{ALLOWED_HOSTS_ENV}=studio.lan,192.168.1.20"
            )
            raise ValueError(msg)
        names.add(name)
    return frozenset(names)


def installed() -> bool:
    """Whether a :class:`HostCheckMiddleware` is in front of the app this process serves."""
    return _installed


@asynccontextmanager
async def require_installed(_app: object) -> AsyncIterator[None]:
    """An ASGI app lifespan that refuses to start unless the host check is in the path.

    The middleware marks itself installed when the lifespan startup passes through it, which
    happens before this runs. If a framework change took the middleware out of the path,
    the server stops here instead of serving unchecked.

    Raises:
        RuntimeError: No :class:`HostCheckMiddleware` saw the startup.

    """
    if not _installed:
        msg = (
            "The host check middleware is not in the request path, so the server would answer "
            "any Host name; refusing to start. Check serve.py against the installed Streamlit."
        )
        raise RuntimeError(msg)
    yield


def _header_values(scope: Scope, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name]


async def _refuse_http(send: Send, text: str) -> None:
    body = text.encode()
    await send({
        "type": "http.response.start",
        "status": 403,
        "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"x-content-type-options", b"nosniff"),
        ],
    })
    await send({"type": "http.response.body", "body": body})


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send, text: str) -> None:
    # The server first hands over the handshake as "websocket.connect"; this answers it.
    if (await receive())["type"] != "websocket.connect":
        return
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = text.encode()
        await send({
            "type": "websocket.http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"text/plain; charset=utf-8")],
        })
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        # Without the denial-response extension, closing before accepting is answered 403.
        await send({"type": "websocket.close", "code": 1008})


class HostCheckMiddleware:
    """ASGI middleware: 403 for any request or WebSocket not addressed to a served name.

    HTTP requests and WebSocket upgrades need exactly one ``Host`` header naming a served host
    (any port). A WebSocket that sends an ``Origin`` needs it to name a served host too:
    browsers always send one, so a page on another site cannot open the app's stream even
    where its ``Host`` was rewritten (a proxy). Other scope types pass through.
    """

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str]) -> None:
        """Wrap ``app``.

        Args:
            app: The ASGI app to protect.
            allowed_hosts: Served names as :func:`allowed_hosts` returns them.

        Raises:
            ValueError: ``allowed_hosts`` is empty.

        """
        hosts = frozenset(allowed_hosts)
        if not hosts:
            msg = "allowed_hosts is empty: pass allowed_hosts(os.environ)."
            raise ValueError(msg)
        self._app = app
        self._hosts = hosts

    def _refusal(self, scope: Scope) -> str | None:
        hosts = _header_values(scope, b"host")
        if len(hosts) != 1 or host_name(hosts[0]) not in self._hosts:
            return HOST_REFUSED
        if scope["type"] == "websocket":
            origins = _header_values(scope, b"origin")
            if len(origins) > 1 or (origins and origin_host_name(origins[0]) not in self._hosts):
                return ORIGIN_REFUSED
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse or pass on one ASGI connection."""
        global _installed
        if scope["type"] == "lifespan":
            _installed = True
        elif scope["type"] in {"http", "websocket"} and (refusal := self._refusal(scope)):
            # Debug, not warning: the header values are the caller's, and anyone could fill
            # the log with refused requests.
            _LOGGER.debug("Refused %s %s: %s", scope["type"], scope.get("path"), refusal)
            if scope["type"] == "http":
                await _refuse_http(send, refusal)
            else:
                await _refuse_websocket(scope, receive, send, refusal)
            return
        await self._app(scope, receive, send)
