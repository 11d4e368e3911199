"""Red-team attacks on drafts and links (`rubric_core.app_support.drafts`, the store's drafts).

Judged by the database's bytes and by what a link can make the app open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from rubric_core.app_support.drafts import (
    draft_of,
    new_draft_id,
    param_id,
    restore_draft,
    sync_draft,
)
from rubric_core.app_support.links import link_request
from rubric_core.redact import redact
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

KEY = "sk-proj-" + "W" * 40


def test_a_base_url_carrying_a_password_is_kept_without_it(tmp_path: Path) -> None:
    # Runs refuse such a URL, but the draft kept what the sidebar held: the password was
    # stored in clear in the drafts table (and a URL's user info was scrubbed nowhere).
    db = tmp_path / "d.sqlite3"
    state = {"base_url": "http://bob:hunter2pass@127.0.0.1:8000/v1", "prompt": "hi",
             "session_api_key": KEY}
    params: dict[str, str] = {}
    with Store(db) as store:
        assert sync_draft(state, params, store) is None
        kept = store.load_draft(params["draft"])
    assert kept is not None and kept["base_url"] == "http://bob:[redacted]@127.0.0.1:8000/v1"
    data = db.read_bytes()
    assert b"hunter2pass" not in data and b"W" * 30 not in data  # nor the typed key


@pytest.mark.parametrize(("text", "scrubbed"), [
    ("postgresql://app:s3cret@db.lan/runs", "postgresql://app:[redacted]@db.lan/runs"),
    ('{"url": "https://u:p4ss@h/v1"}', '{"url": "https://u:[redacted]@h/v1"}'),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://user@host/v1 and mail a@b.c", "http://user@host/v1 and mail a@b.c"),
    ("https://x.example/a:b@c", "https://x.example/a:b@c"),
])
def test_a_url_password_is_scrubbed_wherever_it_appears(text: str, scrubbed: str) -> None:
    assert redact(text) == scrubbed


def test_a_draft_never_holds_the_typed_key_even_when_asked_to() -> None:
    assert "session_api_key" not in draft_of({"session_api_key": KEY, "prompt": "p"})


@pytest.mark.parametrize(("value", "restored"), [
    pytest.param(2.5, 2.5, id="dollars"),
    pytest.param(3, 3.0, id="an_int_becomes_the_fields_float"),
    pytest.param(0.0, 0.0, id="no_budget"),
    pytest.param(-1.0, None, id="negative"),
    pytest.param(float("nan"), None, id="nan"),
    pytest.param(float("inf"), None, id="infinite"),
    pytest.param(True, None, id="bool"),
    pytest.param("5", None, id="text"),
    pytest.param([5], None, id="list"),
])
def test_a_hand_edited_budget_in_a_draft_restores_only_as_dollars(
        value: object, restored: float | None) -> None:
    state: dict[str, object] = {}
    assert restore_draft(state, {"exp_budget": value}) == (restored is not None)
    assert state.get("exp_budget") == restored
    if restored is not None:
        assert type(state["exp_budget"]) is float  # the number field's own type


@pytest.mark.parametrize("value", [
    pytest.param("../../etc/passwd", id="traversal"),
    pytest.param("1' OR '1'='1", id="sql"),
    pytest.param("a" * 10_000_000, id="huge"),
    pytest.param(["0" * 32], id="list"),
    pytest.param("0" * 31, id="short"),
    pytest.param("0" * 32 + "\n", id="newline_is_stripped_then_ok"),
])
def test_a_malformed_id_in_a_link_opens_nothing(value: object) -> None:
    found = param_id(value)
    assert found is None or found == "0" * 32
    # A link takes a prefix too (the app and the CLI show 8 characters), and only hex digits:
    # what it names is looked up by the page (`find_run`), never used as a path or in SQL.
    link = link_request({"run": value, "experiment": value})
    assert link is None or link.target_id in ("0" * 31, "0" * 32)


def test_draft_ids_are_random_and_long() -> None:
    ids = {new_draft_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and param_id(i) == i for i in ids)


def test_a_draft_over_the_limit_is_refused_with_a_notice_not_stored(tmp_path: Path) -> None:
    state = {"prompt": "x" * 10_000_000}
    params: dict[str, str] = {}
    with Store(tmp_path / "d.sqlite3") as store:
        notice = sync_draft(state, params, store)
    assert notice is not None and "not being kept" in notice and "draft" not in params


def test_a_link_to_an_unknown_draft_restores_nothing(tmp_path: Path) -> None:
    state: dict[str, object] = {}
    params = {"draft": new_draft_id()}
    with Store(tmp_path / "d.sqlite3") as store:
        assert sync_draft(state, params, store) is None
    assert "prompt" not in state
