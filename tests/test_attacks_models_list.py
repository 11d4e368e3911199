"""Attacks on the model list a local server gives (`rubric_core.server_models`).

A hostile or broken server on the base URL: one that trickles its answer, lists ids that are
escape sequences, keys (the bearer token it was sent, echoed) or megabytes long, and a base URL
typed wrong. The sidebar asks on every script run (once a minute), so none may hang or raise.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from rubric_core.server_models import MAX_ID_CHARS, list_server_models

Handler = Callable[[socket.socket], None]


@pytest.fixture
def raw_server() -> Iterator[Callable[[Handler], str]]:
    """Start loopback servers that answer each connection with ``handler``; their base URL."""
    listeners: list[socket.socket] = []

    def start(handler: Handler) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=_serve, args=(handler, conn), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/v1"

    yield start
    for listener in listeners:
        listener.close()


def _serve(handler: Handler, conn: socket.socket) -> None:
    with conn:
        try:
            conn.recv(65536)
            handler(conn)
        except OSError:
            pass


def _answer(body: bytes) -> Handler:
    def handler(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return handler


def test_a_server_that_trickles_its_answer_is_given_up_on_in_time(raw_server) -> None:
    # Each byte comes well within the per-read timeout; only a bound on the whole exchange
    # stops the sidebar from waiting for minutes (it waited 63 s for this before). Each answer
    # would take a minute: giving up within a third of that is the bound (0.5 s is asked; the
    # gap keeps a loaded machine from failing the test).
    def trickle(conn: socket.socket) -> None:
        body = b'{"data": [' + b" " * 600 + b"]}"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        for byte in body:
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    def trickle_headers(conn: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 600:
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    for handler in (trickle, trickle_headers):
        started = time.monotonic()
        found = list_server_models(raw_server(handler), timeout_s=0.5)
        assert time.monotonic() - started < 20
        assert found.models == () and "within 0.5 s" in (found.problem or "")


def test_a_server_that_hangs_is_given_up_on_in_time(raw_server) -> None:
    started = time.monotonic()
    found = list_server_models(raw_server(lambda conn: time.sleep(60)), timeout_s=0.5)
    assert time.monotonic() - started < 20 and found.models == () and found.problem


KEY = "sk-proj-" + "K" * 40


def test_listed_ids_that_hold_keys_escapes_or_megabytes_are_left_out(raw_server) -> None:
    # A server may echo the bearer token it was sent as a model name: shown in the sidebar, the
    # operator's key would reach every browser. Escapes and huge names are not names either.
    ids = [KEY, f"Bearer {KEY}", "x\x1b[2J\x1b[31mred", "a\nb", "y" * (MAX_ID_CHARS + 1),
           "<script>alert(1)</script>", "llama3.1:8b", 7]
    body = json.dumps({"data": [{"id": i} for i in ids]}).encode()
    found = list_server_models(raw_server(_answer(body)), api_key=KEY)
    assert found.models == ("<script>alert(1)</script>", "llama3.1:8b", "7")
    assert found.problem is None


def test_a_list_of_only_unusable_ids_says_so(raw_server) -> None:
    body = json.dumps({"data": [{"id": KEY}]}).encode()
    found = list_server_models(raw_server(_answer(body)))
    assert found.models == () and "no model id that can be shown" in (found.problem or "")
    assert KEY not in (found.problem or "")


def test_a_huge_list_is_cut_and_a_huge_body_refused(raw_server) -> None:
    many = json.dumps({"data": [{"id": f"m{i}"} for i in range(50_000)]}).encode()
    assert len(list_server_models(raw_server(_answer(many)), timeout_s=5).models) == 200
    found = list_server_models(raw_server(_answer(b" " * 10_000_000)), timeout_s=5)
    assert found.models == () and "too large" in (found.problem or "")


@pytest.mark.parametrize("answer", [
    pytest.param(b"<html>hi</html>", id="html"),
    pytest.param(b'{"data": "llama"}', id="data_not_a_list"),
    pytest.param(b"[1, 2]", id="a_list"),
    pytest.param(b"\xff\xfe\x00", id="not_utf8"),
])
def test_an_answer_that_is_not_a_model_list_gives_a_reason(raw_server, answer: bytes) -> None:
    found = list_server_models(raw_server(_answer(answer)))
    assert found.models == () and found.problem


def test_a_redirect_is_not_followed(raw_server) -> None:
    seen: list[bytes] = []

    def elsewhere(conn: socket.socket) -> None:
        seen.append(b"asked")
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    target = raw_server(elsewhere)

    def redirect(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + target.encode() + b"/models\r\n"
                     b"Content-Length: 0\r\n\r\n")

    found = list_server_models(raw_server(redirect), api_key=KEY)
    assert "HTTP 302" in (found.problem or "") and seen == []


@pytest.mark.parametrize("url", [
    pytest.param("http://[::1", id="unclosed_bracket"),
    pytest.param("http://127.0.0.1:99999/v1", id="port_too_large"),
    pytest.param("http://127.0.0.1:abc/v1", id="port_not_a_number"),
    pytest.param("http://" + "a" * 70_000 + "/v1", id="huge"),
    pytest.param("http://user:hunter2@127.0.0.1:9/v1", id="credentials"),
    pytest.param("file:///etc/passwd", id="not_http"),
])
def test_a_base_url_typed_wrong_gives_a_reason_not_an_exception(url: str) -> None:
    # The sidebar asks on every script run: an exception here broke every page.
    found = list_server_models(url, timeout_s=0.5)
    assert found.models == () and found.problem
    assert "hunter2" not in found.problem


def test_the_list_is_read_from_inside_a_running_event_loop(raw_server) -> None:
    import asyncio

    url = raw_server(_answer(b'{"data": [{"id": "qwen"}]}'))

    async def inside() -> tuple[str, ...]:
        return list_server_models(url).models

    assert asyncio.run(inside()) == ("qwen",)
