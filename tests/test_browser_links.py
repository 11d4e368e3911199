"""Links open what they name, with several runs and experiments stored (issue 37, 1).

Set up as a person does: runs and experiments made with the CLI in the app's database (the
linked run is the oldest), the app started with the README's command (`streamlit run serve.py`),
then headless Chromium opens the links the app and the CLI hand out: in fresh browser
sessions, and in a session that already shows another run (the browser's Back and Forward
change the URL under a live session). The linked run's answer must be on screen, the address
bar must keep linking to it, and a link that names nothing must say so instead of opening
another run. Before the fix a link was read once per session, and only a whole 32-character
run id opened anything: the id the CLI prints (8 characters, or the thread's) opened the newest
run and the address bar was rewritten to it.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING, Any

import pytest
from browser_support import (
    ARTIFACTS,
    CHROMIUM_FLAGS,
    TIMEOUT_MS,
    chromium_path,
    page_state,
    streamlit_server,
    wait_idle,
)
from playwright.sync_api import expect

from rubric_core.cli import main
from rubric_core.engine import shutdown_engine
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.browser


def _cli(*argv: str) -> str:
    out = io.StringIO()
    assert main(list(argv), out=out) in (0, 1), out.getvalue()
    return out.getvalue()


def _printed(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found is not None, text
    return found.group(1)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three runs (haiku first) and two experiments made with the CLI; what it printed."""
    root = tmp_path_factory.mktemp("links")
    db = root / "app.sqlite3"
    printed: dict[str, Any] = {"db": db}
    for example in ("haiku", "photosynthesis", "json_product"):
        out = _cli("run", "--example", example, "--db", str(db), "--quiet")
        printed[example] = {"short": _printed(r"recorded as run ([0-9a-f]{8}) ", out),
                            "thread": _printed(r"\(thread ([0-9a-f]{32})\)", out)}
    dataset = root / "rows.csv"
    dataset.write_text("id,prompt\nr1,Write a haiku about spring.\n", encoding="utf-8")
    try:
        for name in ("older", "newer"):
            out = _cli("eval", "--dataset", str(dataset), "--dataset-name", name,
                       "--rubric", "- The poem has three lines", "--db", str(db))
            printed[name] = _printed(r"experiment ([0-9a-f]{32}) ", out)
    finally:
        shutdown_engine()
    with Store(db) as store:
        for example in ("haiku", "photosynthesis", "json_product"):
            [run] = [r for r in store.list_runs(limit=None)
                     if r.run_id.startswith(printed[example]["short"])]
            printed[example]["id"] = run.run_id
            printed[example]["answer"] = store.evaluations(run.run_id)[-1]["answer"]
        newest = store.list_runs(origin="single", limit=1)[0]
    assert newest.run_id == printed["json_product"]["id"]  # the linked run is not the newest
    return printed


@pytest.fixture(scope="module")
def app(stored: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The app on the stored database, and a headless Chromium to open links in."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "streamlit-links.log"
    with streamlit_server(stored["db"], log) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            yield url, browser
        finally:
            browser.close()


def _open(app: tuple[str, Any], path: str) -> Any:
    """A fresh browser session (its own context) on ``path``."""
    url, browser = app
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.rubric_log_path = ARTIFACTS / "streamlit-links.log"
    page.goto(url + path)
    return page


def _see(locator: Any) -> None:
    expect(locator).to_be_visible(timeout=TIMEOUT_MS)


def _at(page: Any, url: str) -> None:
    expect(page).to_have_url(re.compile(url), timeout=TIMEOUT_MS)


def _shows_run(page: Any, run: dict[str, str], others: list[dict[str, str]]) -> None:
    """The page shows ``run`` (its link, its answer), the URL links to it, and no other run."""
    try:
        _see(page.get_by_text(f"Link to this run: ?run={run['id']}"))
        wait_idle(page)
        _at(page, f"/review\\?(.*&)?run={run['id']}(&|$)")
        _see(page.get_by_text(run["answer"].splitlines()[0]).first)
        for other in others:
            expect(page.get_by_text(other["answer"].splitlines()[0])).to_have_count(0)
    except AssertionError:
        print(f"--- the page at the failure:\n{page_state(page)}")
        raise


def test_run_links_open_the_linked_run_in_a_new_session_and_in_one_showing_another(
        stored: dict[str, Any], app: tuple[str, Any]) -> None:
    haiku, photo, newest = stored["haiku"], stored["photosynthesis"], stored["json_product"]
    # Fresh sessions: the link the Review page shows, the id the CLI prints, the thread id the
    # CLI prints, and a link to the home page.
    for path in (f"/review?run={haiku['id']}", f"/review?run={haiku['short']}",
                 f"/review?run={haiku['thread']}", f"/?run={haiku['short']}"):
        page = _open(app, path)
        _shows_run(page, haiku, [photo, newest])
        page.context.close()

    # A session that already shows a run: another is picked, then Back and Forward.
    page = _open(app, f"/review?run={haiku['short']}")
    _shows_run(page, haiku, [photo, newest])
    page.locator(".st-key-review_run [role='combobox']").click()
    page.get_by_role("option", name=re.compile("photosynthesis")).click()
    _shows_run(page, photo, [haiku, newest])
    page.go_back()
    _shows_run(page, haiku, [photo, newest])
    page.go_forward()
    _shows_run(page, photo, [haiku, newest])
    page.screenshot(path=str(ARTIFACTS / "links-01-back-and-forward.png"), full_page=True)
    page.context.close()

    # A link that names no run says so, and opens none in its place.
    page = _open(app, "/review?run=0123abcd")
    _see(page.get_by_text("The link ?run=0123abcd opens no run"))
    wait_idle(page)
    expect(page.get_by_text("Link to this run")).to_have_count(0)
    for run in (haiku, photo, newest):
        expect(page.get_by_text(run["answer"].splitlines()[0])).to_have_count(0)
    _at(page, r"run=0123abcd")
    page.context.close()


def test_experiment_and_draft_links_open_what_they_name(
        stored: dict[str, Any], app: tuple[str, Any]) -> None:
    older, newer = stored["older"], stored["newer"]
    caption = "Link to this experiment: ?experiment="
    page = _open(app, f"/experiments?experiment={older[:8]}")
    _see(page.get_by_text(caption + older))
    wait_idle(page)
    _at(page, f"experiment={older}")
    # In the same session: the newer one is picked, then Back opens the linked one again.
    page.locator(".st-key-exp_pick [role='combobox']").click()
    page.get_by_role("option", name=re.compile("newer")).click()
    _see(page.get_by_text(caption + newer))
    page.go_back()
    _see(page.get_by_text(caption + older))
    wait_idle(page)
    _at(page, f"experiment={older}")
    page.context.close()

    # A draft with a link: the draft is restored and the linked run opened.
    page = _open(app, "/")
    page.get_by_role("heading", name="Author").wait_for()
    wait_idle(page)
    prompt = page.locator(".st-key-prompt textarea")
    prompt.fill("A prompt typed before the link was shared.")
    prompt.press("Control+Enter")
    wait_idle(page)
    _at(page, r"draft=[0-9a-f]{32}")
    draft = _printed(r"draft=([0-9a-f]{32})", page.url)
    page.context.close()
    haiku = stored["haiku"]
    page = _open(app, f"/review?draft={draft}&run={haiku['short']}")
    _shows_run(page, haiku, [stored["photosynthesis"], stored["json_product"]])
    _at(page, r"draft=[0-9a-f]{32}")
    page.get_by_role("link", name="Author").click()
    expect(page.locator(".st-key-prompt textarea")).to_have_value(
        "A prompt typed before the link was shared.", timeout=TIMEOUT_MS)
    page.context.close()
