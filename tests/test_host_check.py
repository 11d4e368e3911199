"""The host check: the served names' rules, then the real server answering raw requests.

One ``streamlit run serve.py`` (the README's command, via ``browser_support``) serves the whole
module on a free loopback port with one configured extra name; requests go out with
``http.client`` carrying hand-written ``Host`` and ``Origin`` headers, and the WebSocket
upgrade is a hand-written handshake, so a 101 or a 403 is exactly what a browser would get.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from browser_support import ROOT, streamlit_server

from rubric_core import host_check

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

EXTRA_HOST = "studio.test"
PageAnswer = tuple[int, str]


@pytest.mark.parametrize(
    ("authority", "expected"),
    [
        pytest.param("127.0.0.1:8501", "127.0.0.1", id="ipv4_with_port"),
        pytest.param("LocalHost", "localhost", id="name_case_folded"),
        pytest.param("[::1]:8501", "::1", id="ipv6_bracketed_with_port"),
        pytest.param("[0:0:0:0:0:0:0:1]", "::1", id="ipv6_long_form_normalised"),
        pytest.param("localhost:99999", None, id="port_out_of_range"),
        pytest.param("localhost:", None, id="empty_port"),
        pytest.param("localhost:80a", None, id="port_not_digits"),
        pytest.param("user@localhost", None, id="user_info"),
        pytest.param("localhost/x", None, id="path"),
        pytest.param("::1", None, id="ipv6_without_brackets"),
        pytest.param("[evil.example]", None, id="brackets_around_a_name"),
        pytest.param("", None, id="empty"),
    ],
)
def test_host_name(authority: str, expected: str | None) -> None:
    assert host_check.host_name(authority) == expected


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        pytest.param("http://localhost:8501", "localhost", id="http"),
        pytest.param("HTTPS://studio.test", "studio.test", id="https_scheme_case_folded"),
        pytest.param("null", None, id="opaque_origin"),
        pytest.param("file://localhost", None, id="other_scheme"),
        pytest.param("http://localhost:8501/page", None, id="path_is_not_an_origin"),
    ],
)
def test_origin_host_name(origin: str, expected: str | None) -> None:
    assert host_check.origin_host_name(origin) == expected


def test_allowed_hosts_adds_configured_names_to_loopback() -> None:
    env = {host_check.ALLOWED_HOSTS_ENV: " Studio.Test, 192.168.1.20 ,[fd00::1],,fd00::2"}
    assert host_check.allowed_hosts(env) == host_check.LOOPBACK_HOSTS | {
        "studio.test", "192.168.1.20", "fd00::1", "fd00::2",
    }
    assert host_check.allowed_hosts({}) == host_check.LOOPBACK_HOSTS


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param("*", id="wildcard"),
        pytest.param("*.example.com", id="wildcard_subdomain"),
        pytest.param("studio.test:8501", id="port"),
        pytest.param("http://studio.test", id="scheme"),
        pytest.param("studio_test", id="underscore"),
    ],
)
def test_allowed_hosts_refuses_what_is_not_a_name(entry: str) -> None:
    with pytest.raises(ValueError, match=host_check.ALLOWED_HOSTS_ENV):
        host_check.allowed_hosts({host_check.ALLOWED_HOSTS_ENV: f"ok.example,{entry}"})


def test_startup_is_refused_unless_the_middleware_saw_it(monkeypatch: pytest.MonkeyPatch) -> None:
    async def startup() -> None:
        async with host_check.require_installed(None):
            pass

    monkeypatch.setattr(host_check, "_installed", False)
    with pytest.raises(RuntimeError, match="not in the request path"):
        asyncio.run(startup())

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await startup()  # the app's lifespan, reached through the middleware

    middleware = host_check.HostCheckMiddleware(inner, allowed_hosts=host_check.LOOPBACK_HOSTS)
    asyncio.run(middleware({"type": "lifespan"}, None, None))
    assert host_check.installed()


def test_websocket_refusal_without_the_denial_extension_closes_before_accepting() -> None:
    sent: list[dict[str, Any]] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        msg = "a refused WebSocket reached the app"
        raise AssertionError(msg)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/", "headers": [(b"host", b"evil.example")]}
    middleware = host_check.HostCheckMiddleware(inner, allowed_hosts=host_check.LOOPBACK_HOSTS)
    asyncio.run(middleware(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}]  # uvicorn answers this with 403


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("host_check")
    extra = {host_check.ALLOWED_HOSTS_ENV: EXTRA_HOST}
    with streamlit_server(tmp / "db.sqlite3", tmp / "streamlit.log", extra) as url:
        yield int(urlsplit(url).port or 0)


def _get(port: int, path: str, host: str, headers: dict[str, str] | None = None) -> PageAnswer:
    """GET ``path`` from the server on ``port`` with this exact ``Host`` header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host, **(headers or {})})
        response = conn.getresponse()
        body = b"" if response.status == 101 else response.read()
        return response.status, body.decode("utf-8", "replace")
    finally:
        conn.close()


def _upgrade(port: int, host: str, origin: str | None) -> PageAnswer:
    """Open the app's WebSocket (``/_stcore/stream``) as a browser would; the status is 101 or
    the refusal's."""
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Protocol": "streamlit",
    }
    if origin is not None:
        headers["Origin"] = origin
    return _get(port, "/_stcore/stream", host, headers)


@pytest.mark.parametrize(
    "name", ["127.0.0.1", "localhost", "[::1]", EXTRA_HOST], ids=lambda n: n.strip("[]")
)
def test_served_names_get_the_app_and_its_websocket(port: int, name: str) -> None:
    host = f"{name}:{port}"
    assert _get(port, "/", host)[0] == 200
    assert _get(port, "/_stcore/health", host) == (200, "ok")
    assert _upgrade(port, host, origin=f"http://{host}")[0] == 101
    assert _upgrade(port, host, origin=None)[0] == 101  # a program, not a page


def test_any_port_is_served(port: int) -> None:
    # A tunnel or proxy shows the browser another port; the name is what stops rebinding.
    assert _get(port, "/_stcore/health", f"localhost:{port + 1}") == (200, "ok")
    assert _get(port, "/_stcore/health", "localhost") == (200, "ok")


@pytest.mark.parametrize("path", ["/", "/_stcore/health", "/_stcore/host-config", "/nope"])
def test_other_host_names_get_403(port: int, path: str) -> None:
    status, body = _get(port, path, f"evil.example:{port}")
    assert (status, body) == (403, host_check.HOST_REFUSED)


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("127.0.0.1.evil.example:{port}", id="loopback_as_a_prefix"),
        pytest.param("localhost@evil.example:{port}", id="user_info"),
        pytest.param("localhost:{port}:{port}", id="two_ports"),
    ],
)
def test_lookalike_hosts_get_403(port: int, host: str) -> None:
    assert _get(port, "/", host.format(port=port))[0] == 403


def test_dns_rebinding_websocket_gets_403(port: int) -> None:
    """The observed attack: a rebound page opening the stream with its own Host and Origin."""
    host = f"evil.example:{port}"
    assert _upgrade(port, host, origin=f"http://{host}") == (403, host_check.HOST_REFUSED)


@pytest.mark.parametrize(
    "origin",
    [
        pytest.param("http://evil.example", id="other_site"),
        pytest.param("http://evil.example:{port}", id="other_site_same_port"),
        pytest.param("null", id="opaque"),
    ],
)
def test_websocket_from_another_origin_gets_403(port: int, origin: str) -> None:
    answer = _upgrade(port, f"127.0.0.1:{port}", origin=origin.format(port=port))
    assert answer == (403, host_check.ORIGIN_REFUSED)


def test_bad_allowed_hosts_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({host_check.ALLOWED_HOSTS_ENV: "*", "RUBRIC_STUDIO_DB": str(tmp_path / "db")})
    done = subprocess.run(
        [sys.executable, "-m", "streamlit", "run", "serve.py", "--server.port", "0",
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode != 0
    assert f"{host_check.ALLOWED_HOSTS_ENV}: '*' is not a host name" in done.stdout + done.stderr
