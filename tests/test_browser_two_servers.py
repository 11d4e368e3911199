"""Two app servers on one PostgreSQL database, each in its own headless Chromium tab.

A run made on server A is listed and reviewed on server B, and one made on B on A; a run
stopped mid-revision by another process is resumed from B's Run page: nothing the pages show
comes from one process's memory. The database URL carries a password
(the throwaway server trusts local connections, so any password is accepted): it must be shown
masked in the sidebar and appear in neither page nor either server's log. Screenshots go to
``artifacts/browser/3x-*.png``.
"""

from __future__ import annotations

import re
import urllib.parse
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest
from browser_support import (
    ARTIFACTS,
    CHROMIUM_FLAGS,
    TIMEOUT_MS,
    choose,
    chromium_path,
    open_tab,
    shot,
    streamlit_server,
    wait_idle,
)
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect, sync_playwright

from rubric_core import session
from rubric_core.examples import get_example
from rubric_core.settings import RunSettings
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.browser

PASSWORD = "pg-browser-Secret-7f3a"


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` in its user part."""
    parts = urllib.parse.urlsplit(url)
    user, _, hosts = parts.netloc.rpartition("@")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{hosts}"))


@pytest.fixture
def two_pages(pg_url: str) -> Iterator[tuple[Any, Any, str]]:
    """Pages on servers A and B (both on ``pg_url`` with a password), and that URL."""
    url = with_password(pg_url, PASSWORD)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        app_a = stack.enter_context(streamlit_server(url, ARTIFACTS / "streamlit-pg-a.log"))
        app_b = stack.enter_context(streamlit_server(url, ARTIFACTS / "streamlit-pg-b.log"))
        pw = stack.enter_context(sync_playwright())
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        stack.callback(browser.close)
        pages = []
        for app in (app_a, app_b):
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            stack.callback(context.close)
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(app)
            pages.append(page)
        yield pages[0], pages[1], url


def run_haiku(page: Any) -> None:
    """Load the haiku example on `page`'s server and run it to the end."""
    page.get_by_role("link", name="Author").click()
    page.get_by_role("heading", name="Author").wait_for()
    wait_idle(page)
    choose(page, "example_select", "Haiku about spring")
    page.locator(".st-key-load_example button").click()
    expect(page.locator(".st-key-rubric_text textarea")).to_have_value(
        re.compile("5-7-5"), timeout=TIMEOUT_MS)
    wait_idle(page)
    page.get_by_role("link", name="Run").click()
    page.locator(".st-key-run_button button").click()
    page.locator(".st-key-final_status").get_by_text("satisfied", exact=False).first.wait_for()
    wait_idle(page)


def open_review(page: Any) -> Any:
    """Open Review on `page`; returns its run picker."""
    page.get_by_role("link", name="Review").click()
    page.get_by_role("tab", name="Iterations").wait_for()
    wait_idle(page)
    return page.locator(".st-key-review_run [role='combobox']")


def test_a_run_made_on_one_server_is_reviewed_on_the_other(
    two_pages: tuple[Any, Any, str],
) -> None:
    page_a, page_b, url = two_pages

    # B has nothing yet.
    page_b.get_by_role("heading", name="Author").wait_for()
    wait_idle(page_b)
    page_b.get_by_role("link", name="Review").click()
    page_b.get_by_text("No runs match these filters").wait_for()
    shot(page_b, "31-server-b-empty")

    # A runs the haiku; B's Review, in another process, opens that run.
    run_haiku(page_a)
    shot(page_a, "32-server-a-ran")
    with Store(url) as store:
        (first,) = store.list_runs()
    assert first.status == "satisfied"
    page_b.reload()
    picker = open_review(page_b)
    expect(picker).to_have_value(re.compile(first.run_id[:8]))
    page_b.get_by_text("1 run(s) match").wait_for()
    wait_idle(page_b)
    # A click that lands while a rerun redraws the tabs is lost: click again, at most 3 times.
    for attempt in range(3):
        open_tab(page_b, "Side by side")
        try:
            page_b.get_by_text("Before").first.wait_for(timeout=10_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            wait_idle(page_b)
    wait_idle(page_b)
    shot(page_b, "33-server-b-reviews-a-run")

    # And the other way: B runs, A's Review lists both, newest first.
    run_haiku(page_b)
    with Store(url) as store:
        second, again = store.list_runs()
    assert again.run_id == first.run_id and second.status == "satisfied"
    picker = open_review(page_a)
    expect(picker).to_have_value(re.compile(second.run_id[:8]))
    page_a.get_by_text("2 run(s) match").wait_for()
    shot(page_a, "34-server-a-lists-both")

    # The URL is shown masked; the password is on no page and in no log.
    for page in (page_a, page_b):
        sidebar = page.locator("[data-testid='stSidebar']").inner_text()
        assert ":***@" in sidebar
        assert PASSWORD not in page.content()
    for log in ("streamlit-pg-a.log", "streamlit-pg-b.log"):
        text = (ARTIFACTS / log).read_text()
        assert PASSWORD not in text
        assert "Traceback" not in text, text


def test_a_run_stopped_elsewhere_is_resumed_on_this_server(
    two_pages: tuple[Any, Any, str],
) -> None:
    _, page_b, url = two_pages
    haiku = get_example("haiku")
    settings = RunSettings(prompt=haiku.prompt, rubric=haiku.rubric, example_name="haiku",
                           worker_system_prompt=haiku.worker_system_prompt)
    with Store(url) as store:  # this test's process stands in for the other server
        run = session.start(store, settings)
        graded = False
        for event in run:
            graded = graded or event["type"] == "evaluation_finished"
            if graded and event["type"] == "worker_token":
                break  # mid-revision, after one grader pass
        run.close()
        stopped = store.get_run(run.run_id)
    assert stopped is not None and stopped.status == "interrupted"

    page_b.get_by_role("heading", name="Author").wait_for()
    wait_idle(page_b)
    page_b.get_by_role("link", name="Run").click()
    picker = page_b.locator(".st-key-resume_select_None [role='combobox']")
    expect(picker).to_have_value(re.compile(run.run_id[:8]))
    shot(page_b, "35-server-b-offers-resume")
    page_b.locator(".st-key-resume_button button").click()
    page_b.get_by_text(f"Resuming run {run.run_id[:8]}").wait_for()
    page_b.locator(".st-key-final_status").get_by_text("satisfied", exact=False).first.wait_for()
    wait_idle(page_b)
    shot(page_b, "36-server-b-resumed")
    with Store(url) as store:
        (resumed,) = store.list_runs()
        passes = store.evaluations(run.run_id)
    assert resumed.run_id == run.run_id and resumed.status == "satisfied"
    assert [ev["iteration"] for ev in passes] == [0, 1]  # the first pass was not graded again
