"""The Experiments page in a real headless Chromium: a bad upload, the bundled dataset run, a
grid cell opened in Review.

Starts ``streamlit run serve.py`` with a temporary database (`browser_support`); screenshots
go to ``artifacts/browser/`` (``2x-*.png``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from browser_support import (
    ARTIFACTS,
    app_in_browser,
    click_until_shown,
    open_tab,
    shot,
    wait_idle,
)
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
                        last_shot="29-experiments-last", accept_downloads=True) as page:
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
    page.get_by_text("bad.csv").wait_for()
    wait_idle(page)
    click_until_shown(page, page.locator(".st-key-store_dataset button"),
                      page.get_by_text("row 3, column 'prompt': the prompt is empty"))
    shot(page, "22-bad-upload")
    with Store(db) as store:
        assert store.list_datasets() == []

    # The bundled dataset, run with demo + rules.
    click_until_shown(
        page, page.locator(".st-key-load_demo_dataset button"),
        page.get_by_text("Bundled dataset 'bundled-demo' is stored as version 1"),
        done=page.get_by_text("Datasets (1 stored)"))
    # Two configurations: the second allows one grader pass, so some rows cannot be fixed.
    count = page.locator(".st-key-exp_config_count input")
    count.fill("2")
    count.press("Enter")
    wait_idle(page)
    cap = page.locator(".st-key-exp_cfg_1_cap input")
    cap.fill("1")
    cap.press("Enter")
    wait_idle(page)
    label = page.locator(".st-key-exp_cfg_1_label input")
    label.fill("one pass")
    label.press("Enter")
    wait_idle(page)
    page.locator(".st-key-exp_cfg_1").scroll_into_view_if_needed()
    shot(page, "22b-new-experiment-form")

    # Record every progress text the page shows while the experiment runs.
    page.evaluate("""() => {
        window.__progress = [];
        const seen = () => document.querySelectorAll('[data-testid="stProgress"]').forEach(e => {
            const text = e.innerText.trim();
            if (text && !window.__progress.includes(text)) window.__progress.push(text);
        });
        new MutationObserver(seen).observe(document.body,
            {subtree: true, childList: true, characterData: true, attributes: true});
    }""")
    page.locator(".st-key-exp_start button").click()
    page.get_by_text("Experiment finished").wait_for()
    wait_idle(page)
    page.get_by_text("finished · 48/48 cells ended").wait_for()
    expect(page.get_by_test_id("stMain").get_by_role("button", name="Stop")).to_be_disabled()
    shot(page, "23-experiment-finished")
    seen = page.evaluate("() => window.__progress")
    counts = [int(m.group(1)) for t in seen
              if (m := re.search(r"demo × rules: (\d+)/24 cells", t))]
    assert any(0 < n < 24 for n in counts), seen  # progress was shown live, not only at the end
    assert 24 in counts
    with Store(db) as store:
        [exp] = store.list_experiments()
        cells = store.experiment_cells(exp.experiment_id)
    first = [c for c in cells if c.config_index == 0]
    assert [c.status for c in first] == ["satisfied"] * 24
    capped = {c.row_id for c in cells if c.config_index == 1 and c.status != "satisfied"}
    assert capped  # one pass is not enough for every row

    open_tab(page, "Summary")
    shot(page, "24-experiment-summary")

    # Compare: the rows the one-pass configuration lost, with McNemar's exact p.
    open_tab(page, "Compare")
    page.get_by_text(f"{len(capped)} pass → fail, 0 fail → pass. McNemar's exact p =").wait_for()
    shot(page, "24b-experiment-compare")

    # Export: the CSV holds one row per row × configuration × pass × criterion.
    open_tab(page, "Export")
    button = page.locator(".st-key-exp_download_csv button")
    button.wait_for()
    with page.expect_download() as info:
        button.click()
    csv_path = ARTIFACTS / "experiment.csv"
    info.value.save_as(str(csv_path))
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    with Store(db) as store:
        expected = sum(len(ev["criteria"]) for c in cells
                       for ev in store.evaluations(c.run.run_id))
    assert len(frame) == expected
    assert set(frame["row_id"]) == {c.row_id for c in cells}
    assert set(frame["config_index"]) == {"0", "1"}

    open_tab(page, "Grid")

    # A click on the second row's cell under the second configuration (the grid's right-hand
    # column) shows that cell's answer and verdicts in place, beside the first configuration's;
    # "Open in Review" there opens its run.
    wanted = next(c for c in cells if c.config_index == 1 and c.row_id == first[1].row_id)
    grid = page.locator(f".st-key-exp_grid_{exp.experiment_id}_False "
                        "[data-testid='stDataFrameResizable']")
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()
    assert box is not None
    # The grid is drawn on a canvas: the first pointer event over it only focuses it.
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + 35 + 35 + 17)
    page.wait_for_timeout(300)
    page.mouse.click(box["x"] + box["width"] * 0.7, box["y"] + 35 + 35 + 17)
    page.get_by_text(f"row {wanted.row_id}", exact=False).first.wait_for()
    wait_idle(page)
    views = page.locator("[class*='st-key-exp_cell_view_2_']")
    expect(views).to_have_count(2)
    open_button = views.nth(0).get_by_role("button", name="Open in Review")
    open_button.scroll_into_view_if_needed()
    shot(page, "24-row-side-by-side")
    open_button.click()
    picker = page.locator(".st-key-review_run [role='combobox']")
    expect(picker).to_have_value(re.compile(wanted.run.run_id[:8]))
    page.get_by_role("tab", name="Iterations").wait_for()
    wait_idle(page)
    shot(page, "25-cell-opened-in-review")
