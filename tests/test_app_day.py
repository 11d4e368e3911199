"""A person's day with the app (issue #24), driven with AppTest: titles, Resume, Stop, drafts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from test_app import _messages, _texts, goto, load_example, run_loop
from test_app import app as app  # the fixtures test_app.py defines
from test_app import db_path as db_path
from test_app import navigation_routing as navigation_routing

from rubric_core.examples import get_example

if TYPE_CHECKING:
    from pathlib import Path

    from streamlit.testing.v1 import AppTest


def test_a_prompt_edited_away_from_an_example_is_the_users_own_run(
    app: AppTest, db_path: Path
) -> None:
    # Issue 24.1: every run after loading an example was titled after it, and the example's
    # hidden worker system prompt went with unrelated prompts.
    load_example(app, "haiku")
    assert get_example("haiku").worker_system_prompt
    app.text_area(key="prompt").input("Write a limerick about a programmer.").run()
    assert "no longer the example" in _texts(app.info)
    assert app.text_area(key="worker_system_prompt").value == ""
    store = run_loop(app)
    run = store.get_run(app.session_state["last_run_id"])
    assert run.title == "Write a limerick about a programmer."
    assert run.settings.worker_system_prompt == "" and run.settings.example_name is None
    goto(app, "review")
    app.text_input(key="filter_text").input("limerick").run()
    assert "Haiku about spring" not in str(app.dataframe[0].value)


def test_an_unchanged_example_keeps_its_title_and_a_set_system_prompt_is_shown(
    app: AppTest,
) -> None:
    load_example(app, "haiku")
    assert "set: sent with the run" in next(e.label for e in app.expander)
    store = run_loop(app)
    assert store.get_run(app.session_state["last_run_id"]).title == get_example("haiku").title
    assert "no longer the example" not in _messages(app)
