"""Red-team attacks on secrets: make a configured key reach a byte it must never reach.

A key here is configured (an environment variable named like a secret) but not key-shaped, so
only the configured-value scrubbing can catch it; each test then looks for it in every byte
the attack could reach: the database file and its WAL, what a grader model is sent, a log
record, a printed traceback.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from langchain_core.messages import AIMessage, ToolMessage

from rubric_core import redact, session
from rubric_core.redact import REDACTED, RedactingSerializer
from rubric_core.settings import RunSettings
from rubric_core.store import Store
from tests.scripted import ScriptedChatModel, verdict

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
RUBRIC = "- The answer says hello"


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "zq" + uuid.uuid4().hex  # not key-shaped: only configuration can name it
    monkeypatch.setenv("RED_TEAM_API_KEY", value)
    return value


def _echoing_answer(secret: str) -> AIMessage:
    """A worker's final answer that carries the key outside its text content."""
    return AIMessage(
        content="hello",
        additional_kwargs={"reasoning_content": f"the key is {secret}",
                           "refusal": secret},
        response_metadata={"model_name": "m", "echo": {"headers": [f"x-key: {secret}"]}},
        invalid_tool_calls=[{"name": "lookup", "args": f'{{"key": "{secret}"', "id": "c1",
                             "error": f"bad json near {secret}", "type": "invalid_tool_call"}],
    )


def _stored_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.iterdir() if p.is_file())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "db.sqlite3") as s:
        yield s


# --------------------------------------------------------------------------- checkpoints


def test_a_key_outside_message_content_never_reaches_a_checkpoint(secret: str) -> None:
    serde = RedactingSerializer()
    messages = [
        _echoing_answer(secret),
        AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": secret},
                                           "id": "c2"}]),
        ToolMessage(content="ok", tool_call_id="c2", artifact={"raw": secret}),
    ]
    kind, data = serde.dumps_typed({"messages": messages})
    assert secret.encode() not in data
    restored = serde.loads_typed((kind, data))["messages"]
    # Everything else survives the scrub: types, ids, the tool call's shape.
    assert [type(m) for m in restored] == [AIMessage, AIMessage, ToolMessage]
    assert restored[1].tool_calls[0]["args"] == {"q": REDACTED}
    assert restored[0].content == "hello" and restored[2].tool_call_id == "c2"


def _pg_bytes(url: str) -> bytes:
    """Every value of every table of a PostgreSQL database, as bytes."""
    import psycopg

    out: list[bytes] = []
    with psycopg.connect(url) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        out.append(bytes(value))
                    elif value is not None:
                        out.append(str(value).encode())
    return b"\n".join(out)


def test_a_worker_that_echoes_the_key_leaves_it_in_no_stored_byte(
    secret: str, db_location: str | Path
) -> None:
    # Both backends: SQLite's saver serializes whole checkpoints, PostgreSQL's stores
    # primitives inline as JSONB and the rest as blobs.
    worker = ScriptedChatModel(default=_echoing_answer(secret))
    grader = ScriptedChatModel(default=verdict("satisfied", "ok", ["The answer says hello"]))
    models = {"worker": worker, "grader": grader}
    settings = RunSettings(prompt="Say hello", rubric=RUBRIC, max_iterations=1)
    with Store(db_location) as opened:
        run = session.start(opened, settings, models=lambda m, role, url: models[role])
        events = list(run)
    assert events[-1]["status"] == "satisfied"
    stored = (_stored_bytes(Path(db_location).parent) if isinstance(db_location, Path)
              else _pg_bytes(db_location))
    assert b"hello" in stored  # the scan sees the stored run
    assert secret.encode() not in stored


def test_a_key_in_the_run_config_never_reaches_checkpoint_metadata(
    secret: str, db_location: str | Path
) -> None:
    # LangGraph copies every string of config["configurable"] (where a configurable model's
    # api_key goes) and config["metadata"] into each checkpoint's metadata, stored as JSON
    # past the serializer.
    from langchain.agents import create_agent

    with Store(db_location) as opened:
        agent = create_agent(model=ScriptedChatModel(default="hi"), checkpointer=opened.saver())
        config = {"configurable": {"thread_id": "keyed-thread", "api_key": secret},
                  "metadata": {"note": f"key {secret}"}}
        agent.invoke({"messages": [("user", "hello")]}, config)
        state = agent.get_state({"configurable": {"thread_id": "keyed-thread"}})
        assert state.values["messages"][-1].content == "hi"  # stored under its own thread
    stored = (_stored_bytes(Path(db_location).parent) if isinstance(db_location, Path)
              else _pg_bytes(db_location))
    assert b"keyed-thread" in stored
    assert secret.encode() not in stored


def test_the_grader_is_not_sent_a_key_the_worker_echoed(secret: str, store: Store) -> None:
    # The key was configured for the worker's endpoint; the grader may be another provider.
    worker = ScriptedChatModel(default=AIMessage(f"hello, my key is {secret}"))
    grader = ScriptedChatModel(default=verdict("satisfied", "ok", ["The answer says hello"]))
    models = {"worker": worker, "grader": grader}
    settings = RunSettings(prompt=f"Say hello (key {secret})", rubric=RUBRIC,
                           max_iterations=1)
    list(session.start(store, settings, models=lambda m, role, url: models[role]))
    assert grader.calls, "the grader was never called"
    sent = "".join(str(m.content) for call in grader.calls for m in call)
    assert secret not in sent and REDACTED in sent


# --------------------------------------------------------------------------- shapes of keys


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://127.0.0.1:9/v1/chat?key=Zq81hd7Gq0Lm2", id="key"),
        pytest.param("http://127.0.0.1:9/v1?api-version=1&access_token=Zq81hd7Gq0Lm2",
                     id="access_token"),
        pytest.param("https://h.example/v1?x-goog-api-key=Zq81hd7Gq0Lm2#f", id="goog"),
        pytest.param("https://h.example/v1?sig=Zq81hd7Gq0Lm2&se=2030", id="sas_signature"),
        pytest.param("postgresql://h/db?user=u&password=Zq81hd7Gq0Lm2", id="password"),
    ],
)
def test_a_credential_in_a_url_query_is_scrubbed(url: str) -> None:
    request = httpx.Request("POST", url)
    response = httpx.Response(401, request=request)
    with pytest.raises(httpx.HTTPStatusError) as caught:
        response.raise_for_status()
    for text in (str(caught.value), repr(caught.value), url):
        cleaned = redact.redact(text)
        assert "Zq81hd7Gq0Lm2" not in cleaned and REDACTED in cleaned, cleaned
    # The rest of the URL stays readable.
    assert redact.redact("http://h/v1?api-version=2024-06-01") == (
        "http://h/v1?api-version=2024-06-01")


def test_a_base_url_with_a_query_credential_is_stored_scrubbed(store: Store) -> None:
    settings = RunSettings(prompt="Say hello", rubric=RUBRIC,
                           base_url="http://127.0.0.1:9/v1?token=Zq81hd7Gq0Lm2")
    record = store.create_run(settings.redacted())
    stored = store.get_run(record.run_id)
    assert stored is not None and stored.settings.base_url is not None
    assert "Zq81hd7Gq0Lm2" not in stored.settings.to_json()
    assert b"Zq81hd7Gq0Lm2" not in Path(store.path).read_bytes()


def test_the_libpq_password_variable_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "pg-" + uuid.uuid4().hex)
    value = os.environ["PGPASSWORD"]
    assert redact.redact(f"echoed {value}") == f"echoed {REDACTED}"


# --------------------------------------------------------------------------- logs and tracebacks


def test_a_logged_exception_chain_is_scrubbed(
    secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    redact.install_log_redaction()
    log = logging.getLogger("red.team")
    try:
        try:
            raise KeyError(secret)
        except KeyError as inner:
            msg = "wrapped"
            raise RuntimeError(msg) from inner
    except RuntimeError:
        log.exception("failed", stack_info=True)
    assert secret not in caplog.text
    for record in caplog.records:
        assert secret not in logging.Formatter().format(record)


def test_the_cli_prints_no_key_in_an_unexpected_traceback(secret: str, tmp_path: Path) -> None:
    # A failure nothing anticipated reaches the interpreter's own traceback printer.
    script = (
        "import sys, rubric_core.cli as cli, rubric_core.cli.run as run_command\n"
        "def boom(*args, **kwargs):\n"
        "    raise RuntimeError('provider said: ' + __import__('os').environ['RED_TEAM_API_KEY'])\n"
        "run_command.run = boom\n"
        "sys.exit(cli.main(['run', '--example', 'haiku']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode != 0
    assert "RuntimeError" in proc.stderr, proc.stderr
    assert secret not in proc.stdout + proc.stderr
    assert REDACTED in proc.stderr


def test_no_description_of_a_model_or_a_run_spec_shows_its_key(secret: str) -> None:
    # What an error page, a debugger or a log line would print of the objects holding keys.
    from rubric_core.app_support import build_model

    models = [
        build_model("openai-compatible:m", base_url="http://127.0.0.1:9/v1", secrets={},
                    session_key=secret),
        build_model("hybrid:openai-compatible:m", base_url="http://127.0.0.1:9/v1", secrets={},
                    session_key=secret),
        build_model("openai:m", base_url=None, secrets={"OPENAI_API_KEY": secret}),
    ]
    spec = session.build_spec(RunSettings(prompt="p", rubric="- c", worker_model="openai:m"),
                              models=lambda m, role, url: models[2])
    for obj in (*models, spec):
        for shown in (repr(obj), str(obj), f"{obj!r:>10}"):
            assert secret not in shown
    for model in models:
        assert secret not in model.model_dump_json()
        assert secret not in str(model.model_dump())


def test_the_run_page_does_not_show_a_key_the_worker_streams(secret: str) -> None:
    # The Run page draws the answer token by token, from events nothing has stored yet.
    from rubric_core.app_support import running

    shown = running.answer_markdown(f"Sure! The key is {secret}\nbye")
    assert secret not in shown and REDACTED in shown

