"""The Experiments page on the queue engine in a real headless Chromium: the bundled dataset run
on the DBOS queues, the Queue panel showing this app's process running cells while they run and
the final counts after.

Starts ``streamlit run serve.py`` with a temporary database (`browser_support`); screenshots
go to ``artifacts/browser/`` (``26-*.png``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
from browser_support import app_in_browser, open_experiments_with_the_demo_dataset, shot, wait_idle

from rubric_core.engine import engine_database
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.browser


def test_an_experiment_on_the_engine_shows_its_queue(tmp_path: Path) -> None:
    db = tmp_path / "browser.sqlite3"
    with app_in_browser(db, log_name="streamlit-engine.log", last_shot="26-engine-last") as page:
        page.get_by_role("heading", name="Author").wait_for()
        wait_idle(page)
        open_experiments_with_the_demo_dataset(page)
        page.locator(".st-key-exp_rate_cells input").wait_for()  # the engine's rate limit
        # Record every worker row the Queue panel shows while the experiment runs.
        page.evaluate("""() => {
            window.__workers = [];
            const seen = () => {
                const text = document.body.innerText;
                for (const m of text.matchAll(/pid \\d+ on [^\\s]+ \\(this app\\)/g))
                    if (!window.__workers.includes(m[0])) window.__workers.push(m[0]);
            };
            new MutationObserver(seen).observe(document.body,
                {subtree: true, childList: true, characterData: true});
        }""")
        page.locator(".st-key-exp_start button").click()
        page.get_by_text(re.compile(r"\d+ queued · [1-9]\d* running · ")).first.wait_for()
        page.get_by_text("Queue").first.scroll_into_view_if_needed()
        shot(page, "26-engine-queue-running")
        page.get_by_text("Experiment finished").wait_for()
        wait_idle(page)
        page.get_by_text("0 queued · 0 running · 24 done · 0 cancelled").wait_for()
        page.get_by_text("No cell is running on any worker.").wait_for()
        page.get_by_text("Queue").first.scroll_into_view_if_needed()
        shot(page, "26b-engine-queue-finished")
        workers = page.evaluate("() => window.__workers")
    # The cells ran in the app's own process, shown by its pid and host only.
    assert len(workers) == 1, workers
    with Store(db) as store:
        [exp] = store.list_experiments()
        assert [c.status for c in store.experiment_cells(exp.experiment_id)] == [
            "satisfied"] * 24
    assert (tmp_path / engine_database(str(db)).rsplit("/", 1)[1]).is_file()
