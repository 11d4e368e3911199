"""The Experiments page in a real headless Chromium: a bad upload, the bundled dataset run, a
grid cell opened in Review.

Starts ``streamlit run serve.py`` with a temporary database (`browser_support`); screenshots
go to ``artifacts/browser/`` (``2x-*.png``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
from browser_support import app_in_browser, shot, wait_idle
from playwright.sync_api import expect

from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.browser


@pytest.fixture
def app_page(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    db = tmp_path / "browser.sqlite3"
    with app_in_browser(db, log_name="streamlit-experiments.log",
                        last_shot="29-experiments-last") as page:
        yield page, db


def test_bundled_experiment_runs_and_a_cell_opens_in_review(
    app_page: tuple[Any, Path], tmp_path: Path
) -> None:
    page, db = app_page
    page.get_by_role("heading", name="Author").wait_for()
    wait_idle(page)
    page.get_by_role("link", name="Experiments").click()
    page.get_by_role("heading", name="Experiments").wait_for()
    wait_idle(page)
    shot(page, "21-experiments-empty")

    # A bad upload names the row and column, and nothing is stored.
    bad = tmp_path / "bad.csv"
    bad.write_text("id,prompt\na,Say hi\nb,\n")
    page.locator(".st-key-dataset_upload input[type='file']").set_input_files(str(bad))
    wait_idle(page)
    page.locator(".st-key-store_dataset button").click()
    page.get_by_text("row 3, column 'prompt': the prompt is empty").wait_for()
    shot(page, "22-bad-upload")
    with Store(db) as store:
        assert store.list_datasets() == []

    # The bundled dataset, run with demo + rules.
    page.locator(".st-key-load_demo_dataset button").click()
    page.get_by_text("Bundled dataset 'bundled-demo' is stored as version 1").wait_for()
    wait_idle(page)
    page.locator(".st-key-exp_cfg_0").scroll_into_view_if_needed()
    shot(page, "22b-new-experiment-form")
    page.locator(".st-key-exp_start button").click()
    page.get_by_text("Experiment finished").wait_for()
    wait_idle(page)
    page.get_by_text("finished · 24/24 cells ended").wait_for()
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    shot(page, "23-experiment-finished")
    with Store(db) as store:
        [exp] = store.list_experiments()
        cells = store.experiment_cells(exp.experiment_id)
    assert [c.status for c in cells] == ["satisfied"] * 24

    page.get_by_role("tab", name="Summary").click()
    shot(page, "24-experiment-summary")
    page.get_by_role("tab", name="Grid").click()

    # A click on the second row's cell opens that run in Review.
    grid = page.locator(f".st-key-exp_grid_{exp.experiment_id} "
                        "[data-testid='stDataFrameResizable']")
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()
    assert box is not None
    # The grid is drawn on a canvas: the first pointer event over it only focuses it.
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + 35 + 35 + 17)
    page.wait_for_timeout(300)
    page.mouse.click(box["x"] + box["width"] * 0.7, box["y"] + 35 + 35 + 17)
    picker = page.locator(".st-key-review_run [role='combobox']")
    expect(picker).to_have_value(re.compile(cells[1].run.run_id[:8]))
    page.get_by_role("tab", name="Iterations").wait_for()
    wait_idle(page)
    shot(page, "25-cell-opened-in-review")
