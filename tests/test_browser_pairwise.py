"""Head to head in a real headless Chromium: Review's Side by side judges two passes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from browser_support import app_in_browser, open_tab, shot, wait_idle

from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.browser

RUBRIC = "- The poem has three lines\n- The theme is spring"
GOOD = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"


def test_review_judges_two_passes_head_to_head(tmp_path: Path) -> None:
    db = tmp_path / "browser.sqlite3"
    with Store(db) as store:
        run = store.create_run(title="haiku", prompt="Write a haiku about spring.",
                               rubric=RUBRIC, worker_model="demo", grader_model="rules",
                               max_iterations=3)
        for i, answer in enumerate(["Autumn leaves fall", GOOD]):
            store.add_evaluation(run.run_id, {
                "grading_run_id": "g", "iteration": i, "result": "satisfied",
                "explanation": "ok", "criteria": [], "status": "satisfied",
                "unverified": False, "duration_s": 0.1, "input_tokens": None,
                "output_tokens": None, "answer": answer})
        store.finish_run(run.run_id, "satisfied")
    with app_in_browser(db, log_name="streamlit-pairwise.log",
                        last_shot="pairwise-last") as page:
        page.get_by_role("heading", name="Author").wait_for()
        page.get_by_role("link", name="Review").click()
        page.get_by_role("tab", name="Iterations").wait_for()
        wait_idle(page)
        open_tab(page, "Side by side")
        page.locator(".st-key-review_h2h_judge button").click()
        page.get_by_text("Judged 1 pair(s) in both orders with rules.").wait_for()
        wait_idle(page)
        shot(page, "pairwise-judged")
        body = page.locator("body").inner_text()
        assert "A = pass 1 · B = pass 2" in body
        assert "flip rate 0.00 (0 of 2 criterion judgements changed with the order)" in body
    with Store(db) as store:
        [record] = store.list_pairwise()
        assert record.pairs == 1 and record.source == "review"
