"""The Rubric lab page in a real headless Chromium: a bad upload refused, the bundled set loaded,
an answer labelled with the keyboard, a re-grade run live, the health table's flags, and a
suggested rewrite accepted and graded, with κ improved.

Starts ``streamlit run serve.py`` with a temporary database (`browser_support`); screenshots
go to the test's temporary directory (``lab-*.png``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from browser_support import app_in_browser, open_tab, wait_idle
from playwright.sync_api import expect

from rubric_core.lab import BUNDLED_NAME
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.browser


@pytest.fixture
def app_page(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    db = tmp_path / "browser.sqlite3"
    with app_in_browser(db, log_name="streamlit-lab.log", last_shot="39-lab-last") as page:
        yield page, db


def test_the_offline_lab_loop_in_the_browser(app_page: tuple[Any, Path], tmp_path: Path) -> None:
    page, db = app_page

    def shot(name: str) -> None:
        page.screenshot(path=str(tmp_path / f"lab-{name}.png"), full_page=True)

    page.get_by_role("heading", name="Author").wait_for()
    wait_idle(page)
    page.get_by_role("link", name="Rubric lab").click()
    page.get_by_role("heading", name="Rubric lab").wait_for()
    wait_idle(page)

    # A bad upload names the row and column, and nothing is stored.
    open_tab(page, "Upload")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,request,answer,label:fine\n1,q,a,pass\n2,q,b,maybe\n")
    page.locator(".st-key-lab_upload input[type='file']").set_input_files(str(bad))
    wait_idle(page)
    page.locator(".st-key-lab_store_upload button").click()
    page.get_by_text("row 3, column 'label:fine': 'maybe' is not a verdict").wait_for()
    shot("1-bad-upload")
    with Store(db) as store:
        assert store.list_answer_sets() == []

    # The bundled labelled set, in one click.
    open_tab(page, "Bundled")
    page.locator(".st-key-lab_load_bundled button").click()
    page.get_by_text("The bundled set 'bundled' is stored").wait_for()
    wait_idle(page)

    # Label with the keyboard: F records fail on the current criterion and moves on.
    name = page.locator(".st-key-labeller input")
    name.fill("Cy")
    name.press("Enter")
    wait_idle(page)
    page.evaluate("() => document.activeElement.blur()")  # out of the text box
    expect(page.locator(".st-key-lab_fail")).to_contain_text("F")  # its shortcut is drawn
    page.keyboard.press("f")
    page.get_by_text("Saved: fail on “The answer is one sentence” for answer a01.").wait_for()
    wait_idle(page)
    shot("2-labelling")
    with Store(db) as store:
        mine = [(lb.item_id, lb.criterion, lb.passed)
                for lb in store.answer_labels(BUNDLED_NAME, 1) if lb.labeller == "Cy"]
    assert mine == [("a01", "The answer is one sentence", False)]

    # Re-grade with the saved rubric v1 and the offline grader.
    open_tab(page, "Re-grade")
    page.locator(".st-key-lab_start button").click()
    page.get_by_text("Re-grade finished").wait_for()
    wait_idle(page)
    page.get_by_text("32/32 gradings").wait_for()
    # The page's Stop, not the toolbar's (shown while a script runs).
    expect(page.locator(".st-key-lab_stop").get_by_role("button", name="Stop")).to_be_disabled()

    # The health table flags the weak criterion.
    health = open_tab(page, "Health")
    flagged = "The answer mentions sunlight (rules · bundled-plants v1): disagrees"
    health.get_by_text(flagged).wait_for()
    wait_idle(page)
    shot("3-health")

    # Refine: the demo refiner's suggestion, accepted, graded at once; κ before and after.
    open_tab(page, "Refine")
    page.locator(".st-key-lab_suggest button").click()
    page.locator(".st-key-lab_accept_0 button").click()
    page.get_by_text("Saved as 'bundled-plants' v2 and added as configuration 2").wait_for()
    page.get_by_text("κ with people 0.24 → 0.95").wait_for()
    wait_idle(page)
    shot("4-before-after")
    with Store(db) as store:
        [job] = store.list_regrade_jobs()
        assert store.regrade_counts(job.job_id) == {0: (32, 0), 1: (32, 0)}

    compare = open_tab(page, "Compare")
    compare.get_by_text("verdict(s) flipped").wait_for()
    wait_idle(page)
    shot("5-compare")
