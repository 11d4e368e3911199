"""Red-team attacks on the host check: Host and Origin values a rebinding page or a crafted
client could send that look like ours. Judged by whether the wrapped app was reached."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rubric_core import host_check

HOSTS = host_check.allowed_hosts({})


def _reaches_app(headers: list[tuple[bytes, bytes]], kind: str = "http") -> bool:
    reached: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request"}

    async def send(message: dict[str, Any]) -> None:
        return None

    middleware = host_check.HostCheckMiddleware(app, allowed_hosts=HOSTS)
    scope = {"type": kind, "path": "/_stcore/stream", "headers": headers}
    asyncio.run(middleware(scope, receive, send))
    return bool(reached)


@pytest.mark.parametrize(
    "host",
    [
        pytest.param(b"localhost.", id="trailing_dot"),
        pytest.param(b"127.1", id="short_ipv4"),
        pytest.param(b"2130706433", id="decimal_ipv4"),
        pytest.param(b"0x7f.0.0.1", id="hex_ipv4"),
        pytest.param(b"0177.0.0.1", id="octal_ipv4"),
        pytest.param(b"[::ffff:127.0.0.1]", id="ipv4_mapped_ipv6"),
        pytest.param(b"[::1%25lo]", id="ipv6_zone"),
        pytest.param(b"localhost\x00.evil.example", id="nul"),
        pytest.param(b" localhost", id="leading_space"),
        pytest.param(b"localhost ", id="trailing_space"),
        pytest.param("ｌｏｃａｌｈｏｓｔ".encode(), id="fullwidth"),
        pytest.param(b"localhost\r\nX-Evil: 1", id="header_injection"),
        pytest.param(b"evil.example#localhost", id="fragment"),
        pytest.param(b"evil.example?localhost", id="query"),
    ],
)
def test_lookalike_host_headers_do_not_reach_the_app(host: bytes) -> None:
    assert not _reaches_app([(b"host", host)])
    assert not _reaches_app([(b"host", host)], kind="websocket")


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([], id="no_host"),
        pytest.param([(b"host", b"localhost"), (b"host", b"evil.example")], id="ours_then_theirs"),
        pytest.param([(b"host", b"evil.example"), (b"host", b"localhost")], id="theirs_then_ours"),
        pytest.param([(b"HOST", b"evil.example"), (b"host", b"localhost")], id="case_duplicates"),
    ],
)
def test_missing_or_repeated_host_headers_do_not_reach_the_app(
    headers: list[tuple[bytes, bytes]],
) -> None:
    assert not _reaches_app(headers)


@pytest.mark.parametrize(
    "origin",
    [
        pytest.param(b"http://localhost.evil.example", id="ours_as_a_prefix"),
        pytest.param(b"http://evil.example@localhost", id="user_info"),
        pytest.param(b"ws://evil.example", id="ws_scheme"),
        pytest.param(b"http://localhost:8501 http://evil.example", id="two_origins_in_one"),
        pytest.param(b"", id="empty"),
    ],
)
def test_a_websocket_from_a_lookalike_origin_does_not_reach_the_app(origin: bytes) -> None:
    headers = [(b"host", b"localhost:8501"), (b"origin", origin)]
    assert not _reaches_app(headers, kind="websocket")
    both = [(b"host", b"localhost:8501"), (b"origin", b"http://localhost:8501"),
            (b"origin", origin)]
    assert not _reaches_app(both, kind="websocket")


def test_our_own_names_still_reach_the_app() -> None:
    for host in (b"localhost:8501", b"127.0.0.1", b"[::1]:1", b"LOCALHOST"):
        assert _reaches_app([(b"host", host)])
        assert _reaches_app([(b"host", host), (b"origin", b"http://127.0.0.1:8501")],
                            kind="websocket")
