"""The first page a fresh server shows is the app's own, even on a deep link.

Streamlit takes a ``pages/`` folder beside the main script for an old-style multipage app until
a script calls ``st.navigation``; app.py does, but only once its first run gets there. Before
`serve.py` said so up front, the first run after the server started showed every file in
``pages/`` by its lower-case name ("app", "calls view", ...) for as long as that run's imports
took. Real server, real headless Chromium, the sidebar read every 0.1 s while the page loads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from browser_support import ARTIFACTS, CHROMIUM_FLAGS, chromium_path, streamlit_server

if TYPE_CHECKING:
    from pathlib import Path

OWN_PAGES = ["Author", "Run", "Review", "Experiments", "Rubric lab"]


def test_a_deep_link_as_the_servers_first_page_shows_only_the_apps_navigation(
        tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (streamlit_server(tmp_path / "db.sqlite3", ARTIFACTS / "streamlit-first-run.log")
          as url, sync_playwright() as pw):
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/experiments")
            seen: list[list[str]] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                nav = page.locator('[data-testid="stSidebarNav"] a')
                names = [n.strip() for n in nav.all_inner_texts()]
                if names and (not seen or seen[-1] != names):
                    seen.append(names)
                if names and page.get_by_text("Upload a dataset").count():
                    break
                time.sleep(0.1)
            reached = page.get_by_text("Upload a dataset").count() > 0  # the linked page
            page.screenshot(path=str(ARTIFACTS / "first-run-deep-link.png"), full_page=True)
        finally:
            browser.close()
    assert seen, "the sidebar never showed a navigation"
    for names in seen:  # never Streamlit's list of the files in pages/
        assert [n.splitlines()[-1].strip() for n in names] == OWN_PAGES, seen
    assert reached, "the deep link did not end on the Experiments page"
