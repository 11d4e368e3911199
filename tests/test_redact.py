"""Secrets: scrubbed from everything stored, exported, logged or printed; keys sent only to the
endpoint they were configured for. Through the real CLI and real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rubric_core import redact
from rubric_core.app_support import build_model
from rubric_core.redact import REDACTED, redact_data

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
ENV_KEY = "sk-envkey-" + "A1b2C3d4E5f6G7h8"


# --------------------------------------------------------------------------- the scrubber


KEY_SHAPED = [
        pytest.param("Authorization: Bearer abc.DEF-123_456", "abc.DEF-123_456", id="bearer"),
        pytest.param("key sk-proj-ABCDEFGHIJKLMNOP1234 leaked", "sk-proj-ABCDEFGHIJKLMNOP1234",
                     id="openai"),
        pytest.param("sk-ant-api03-ABCDEFGHIJKLMNOP", "sk-ant-api03-ABCDEFGHIJKLMNOP",
                     id="anthropic"),
        pytest.param("gsk_ABCDEFGHIJKLMNOPQRST", "gsk_ABCDEFGHIJKLMNOPQRST", id="groq"),
        pytest.param("AIza" + "B" * 35, "AIza" + "B" * 35, id="google"),
        pytest.param('{"api_key": "hunter2hunter2"}', "hunter2hunter2", id="json_assignment"),
        pytest.param("api-key=supersecret99", "supersecret99", id="query_assignment"),
        pytest.param("see https://h/x?Access_Token=zz9yy8xx7", "zz9yy8xx7", id="url_query"),
        pytest.param("BEARER\u00a0abcdefgh123", "abcdefgh123", id="bearer_nbsp"),
]


@pytest.mark.parametrize(("text", "gone"), KEY_SHAPED)
def test_key_shaped_tokens_are_redacted(text: str, gone: str) -> None:
    cleaned = redact.redact(text)
    assert gone not in cleaned and REDACTED in cleaned


def test_the_hint_search_never_skips_what_the_full_expression_scrubs() -> None:
    """`redact` runs its expression only over text holding a hint of a key shape: over 4,000
    texts built from every kind of key shape, with letters flipped in case or swapped for the
    ones case-insensitive matching folds to ASCII, amid noise, it gives what the expression
    alone gives (and most of them are scrubbed, so the comparison is not of untouched text)."""
    import random

    shapes = ["Bearer abcdefgh12", "bearer\u00a0abc.DEF-12", "sk-ABCDEFGHIJKLMN",
              "sk-ant-api03-ABCDEFGHIJKL", "gsk_ABCDEFGHIJKLMN", "xai-ABCDEFGHIJKLMN",
              "AIza" + "b" * 31, '"api_key": "hunter2hunter2"', "api-key=hunter22",
              "apikey: hunter22", "API-key: hunter22", "?key=abc", "&token=abc",
              "?x-secret=abc", "?password=abc", "&passwd=abc", "?sig=abc", "&signature=abc",
              "http://user:pass@host", "postgresql://u:p@h/db", "redis://:hunter22@h"]
    folds = {"k": "\u212a", "s": "\u017f", "i": "\u0131", "I": "\u0130"}
    noise = [" ", "\n", "x", "text ", "\\", "'", '"', "***", "=", ":", "@", "/"]
    rng = random.Random(20261206)
    scrubbed = 0
    for _ in range(4000):
        parts = []
        for _ in range(rng.randint(1, 3)):
            shape = list(rng.choice(shapes))
            for i, char in enumerate(shape):
                roll = rng.random()
                if roll < 0.1:
                    shape[i] = char.swapcase()
                elif roll < 0.13 and char in folds:
                    shape[i] = folds[char]
            parts += [rng.choice(noise), "".join(shape)]
        text = "".join(parts)
        expected = redact._KEY_SHAPES.sub(redact._shape, text)
        assert redact.redact(text, secrets=[]) == expected, text
        scrubbed += expected != text
    assert scrubbed > 3000


def test_configured_values_are_redacted_wherever_they_appear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "plainvalue-no-shape")
    monkeypatch.setenv("SHORT_KEY", "abc")  # too short to be treated as a secret
    redact.register_secret("registered-secret-value")
    text = "x plainvalue-no-shape y registered-secret-value z abc"
    assert redact.redact(text) == f"x {REDACTED} y {REDACTED} z abc"


def test_a_secret_set_or_changed_after_an_earlier_read_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LATE_SERVICE_PASSWORD", "first-value-123")
    assert "first-value-123" not in redact.redact("pw first-value-123")
    monkeypatch.setenv("LATE_SERVICE_PASSWORD", "second-value-456")
    assert redact.redact("pw second-value-456 first-value-123") == f"pw {REDACTED} first-value-123"
    monkeypatch.setenv("ANOTHER_SERVICE_SECRET", "third-value-789")
    assert "third-value-789" not in redact.redact("third-value-789")
    monkeypatch.delenv("ANOTHER_SERVICE_SECRET")
    assert redact.redact("third-value-789") == "third-value-789"
    redact.register_secret("registered-later-000")
    assert redact.redact("registered-later-000") == REDACTED


def test_ordinary_text_is_unchanged() -> None:
    text = "The poem has three lines; sk-1 is a label; Bearer of news; api_key: short"
    assert redact.redact(text) == text


def test_redact_data_walks_structures_and_keeps_keys() -> None:
    data = {"explanation": "Bearer abcdefgh12", "criteria": [{"gap": ("sk-" + "x" * 20,)}],
            "n": 3, "Bearer abcdefgh12": None}
    out = redact_data(data)
    assert out["explanation"] == f"Bearer {REDACTED}"
    assert out["criteria"][0]["gap"] == (REDACTED,)
    assert out["n"] == 3 and "Bearer abcdefgh12" in out


def _state(text: str) -> dict[str, Any]:
    """A checkpoint-like value with ``text`` in every place a model's reply can put it."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    return {
        "messages": [
            HumanMessage("write it"),
            AIMessage(content=text, tool_calls=[{"name": "look", "args": {"q": text},
                                                 "id": "c1"}],
                      response_metadata={"raw": [text]}),
            ToolMessage(content="ok", tool_call_id="c1", artifact={"a": (text, 1)}),
        ],
        "_rubric_evaluations": [{"explanation": text, "criteria": [{"gap": text}]}],
        "rubric": "- c1",
    }


def test_a_checkpoint_without_secrets_is_stored_as_the_scrubbing_path_stores_it() -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from rubric_core.redact import RedactingSerializer, _scrub_stored, secret_values

    plain = JsonPlusSerializer()
    for text in ("an ordinary answer", "task-based; sk-1 is a label; api_key: short", "é ü"):
        state = _state(text)
        kind, data = RedactingSerializer().dumps_typed(state)
        assert (kind, data) == plain.dumps_typed(_scrub_stored(state, secret_values()))
        restored = plain.loads_typed((kind, data))
        assert restored["messages"][1].tool_calls[0]["args"] == {"q": text}


@pytest.mark.parametrize(("text", "gone"), KEY_SHAPED)
def test_a_checkpoint_never_stores_a_key_shape(text: str, gone: str) -> None:
    from rubric_core.redact import RedactingSerializer

    serde = RedactingSerializer()
    kind, data = serde.dumps_typed(_state(f"the key is {text} ok"))
    assert gone.encode() not in data
    assert serde.loads_typed((kind, data))["messages"][0].content == "write it"


@pytest.mark.parametrize("text", [
    pytest.param("\u017fk-ABCDEFGHIJKLMNOP1234", id="long_s_for_s"),
    pytest.param("s\u212a-ABCDEFGHIJKLMNOP1234", id="kelvin_sign_for_k"),
    pytest.param("sk-ABCDEFGHIJ\u017fKLMNOP", id="long_s_inside_the_key"),
    pytest.param("a\u0131za" + "B" * 35, id="dotless_i"),
    pytest.param("api_\u212aey=supersecret99", id="kelvin_in_api_key"),
    pytest.param("see https://h/x?to\u212aen=abcdefgh9", id="kelvin_in_query"),
])
def test_a_checkpoint_scrubs_what_redact_would_even_through_unicode_case_folding(
        text: str) -> None:
    """A hostile model may spell a key shape with the non-ASCII letters that case-insensitive
    matching takes for ASCII ones: the byte-level shortcut must not let through what `redact`
    scrubs."""
    from rubric_core.redact import RedactingSerializer

    assert redact.redact(text) != text  # the scrubber counts it as a key shape
    serde = RedactingSerializer()
    kind, data = serde.dumps_typed(_state(text))
    assert text.encode() not in data
    restored = serde.loads_typed((kind, data))
    assert restored["messages"][1].content == redact.redact(text)


def test_a_checkpoint_never_stores_a_configured_secret_or_an_error_holding_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rubric_core.redact import RedactingSerializer

    monkeypatch.setenv("MY_GATEWAY_TOKEN", "zq-no-shape-" + "7" * 12)
    secret = os.environ["MY_GATEWAY_TOKEN"]
    serde = RedactingSerializer()
    assert secret.encode() not in serde.dumps_typed(_state(f"x{secret}y"))[1]
    kind, data = serde.dumps_typed(ConnectionError(f"refused for {secret}"))
    assert secret.encode() not in data
    assert serde.loads_typed((kind, data)) == f"ConnectionError('refused for {REDACTED}')"
    # A lone surrogate (no UTF-8 for it) never reaches the stored bytes, NUL is kept (binary).
    assert serde.loads_typed(serde.dumps_typed({"t": "a\ud800b\x00"}))["t"] == "a?b\x00"


def test_log_records_are_redacted_for_every_logger(caplog: pytest.LogCaptureFixture) -> None:
    redact.install_log_redaction()
    secret = "sk-logsecret-" + "Z" * 16
    with caplog.at_level(logging.INFO):
        logging.getLogger("some.provider.sdk").warning("request failed with key %s", secret)
        try:
            msg = f"echo Authorization: Bearer {secret}"
            raise RuntimeError(msg)
        except RuntimeError:
            logging.getLogger("another").exception("boom")
    text = caplog.text
    assert secret not in text and REDACTED in text


# --------------------------------------------------------------------------- loopback servers


class _Recorder(ThreadingHTTPServer):
    """Records each request's Authorization header, then answers 401 echoing it back (as some
    providers' error bodies do)."""

    daemon_threads = True

    def __init__(self) -> None:
        self.authorizations: list[str] = []
        super().__init__(("127.0.0.1", 0), _EchoHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _EchoHandler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization") or ""
        self.server.authorizations.append(auth)
        body = json.dumps({"error": {"message": f"Invalid credentials in header "
                                                f"'Authorization: {auth}'",
                                     "type": "invalid_request_error", "code": "bad_auth"}})
        data = body.encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _cli(args: list[str], env_extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "RUBRIC_STUDIO"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "rubric_core", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120, check=False)


def _stored_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


@pytest.mark.parametrize(
    ("models", "where"),
    [
        pytest.param(["--model", "openai-compatible:m"], "error", id="worker_error"),
        pytest.param(["--model", "demo", "--grader", "openai-compatible:m"], "verdict",
                     id="grader_error_explanation"),
    ],
)
def test_an_echoed_key_is_scrubbed_from_output_database_and_export(
    recorder: _Recorder, tmp_path: Path, models: list[str], where: str
) -> None:
    db, csv = tmp_path / "runs.sqlite3", tmp_path / "out.csv"
    proc = _cli(["run", "--prompt", "Say hi", "--rubric", "- says hi", *models,
                 "--base-url", recorder.url, "--db", str(db), "--csv", str(csv),
                 "--max-iterations", "1"],
                {"OPENAI_API_KEY": ENV_KEY}, tmp_path)
    # The operator's own --base-url gets the operator's key, and the server echoed it back.
    assert recorder.authorizations and all(ENV_KEY in a for a in recorder.authorizations)
    assert proc.returncode == 1, proc.stderr
    said = proc.stdout + proc.stderr
    assert ENV_KEY not in said and f"Bearer {REDACTED}" in said, said
    assert any(line.startswith(where) and REDACTED in line for line in said.splitlines())
    assert ENV_KEY.encode() not in _stored_bytes(tmp_path)  # db, -wal and the CSV
    assert REDACTED in csv.read_text(encoding="utf-8") or where == "error"


# --------------------------------------------------------------------------- key routing


def _call(model: Any) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the recorder always answers 401
        model.invoke("hi")


@pytest.mark.parametrize(
    ("configured", "session_key", "expected"),
    [
        pytest.param(None, None, "Bearer not-needed", id="typed_url_gets_no_stored_key"),
        pytest.param(None, "sk-session-typed-0001", "Bearer sk-session-typed-0001",
                     id="typed_url_gets_the_session_key"),
        pytest.param("env", None, f"Bearer {ENV_KEY}", id="operator_url_gets_the_env_key"),
        pytest.param("secrets", None, "Bearer sk-from-secrets-0001",
                     id="operator_url_in_secrets_gets_the_secrets_key"),
    ],
)
def test_stored_keys_go_only_to_the_endpoint_they_were_configured_for(
    recorder: _Recorder, monkeypatch: pytest.MonkeyPatch,
    configured: str | None, session_key: str | None, expected: str,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    secrets: dict[str, Any] = {}
    if configured == "env":
        monkeypatch.setenv("RUBRIC_STUDIO_BASE_URL", recorder.url + "/")
    elif configured == "secrets":
        secrets = {"base_url": recorder.url, "OPENAI_API_KEY": "sk-from-secrets-0001"}
    for spec in ("openai-compatible:m", "openai:m", "hybrid:openai-compatible:m"):
        model = build_model(spec, base_url=recorder.url, secrets=secrets,
                            session_key=session_key)
        inner = getattr(model, "llm", model)
        _call(inner)
    assert recorder.authorizations == [expected] * 3


def test_a_key_streamed_token_by_token_never_shows_a_single_character_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rubric_core.redact import REDACTED, redact_stream

    secret = "live-Secret-8f3a91c2d7"
    monkeypatch.setenv("SOME_SERVICE_TOKEN", secret)
    shape = "sk-" + "A1b2C3d4E5f6G7h8"
    for key in (secret, shape):
        text = f"Sure, here it is: {key} — keep it safe."
        shown = [redact_stream(text[:n]) for n in range(len(text) + 1)]
        for frame in shown:  # every frame the page would draw while the tokens arrive
            for leak_len in range(4, len(key) + 1):
                assert key[:leak_len] not in frame, frame
        assert shown[-1] == f"Sure, here it is: {REDACTED} — keep it safe."
    # Text that only looks like a key's start for a moment comes out whole at the end.
    assert redact_stream("ask-me anything") == "ask-me anything"
    assert redact_stream("see sk-") == "see …"
    assert redact_stream("plain words") == "plain words"
