"""Start the real app (`streamlit run serve.py`) and drive Debian's headless Chromium against it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str:
    """The Chromium binary to drive; a missing browser is an error, never a skip."""
    path = os.environ.get("RUBRIC_STUDIO_CHROMIUM") or shutil.which("chromium")
    if not path:
        msg = (
            "Chromium is not installed: `apt-get install -y chromium` (scripts/test.sh does this "
            "when run as root), or set RUBRIC_STUDIO_CHROMIUM to a Chromium binary."
        )
        raise RuntimeError(msg)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def streamlit_server(
    db_path: Path | str, log_path: Path, extra_env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Run `streamlit run serve.py` (the README's command) on a free loopback port.

    Args:
        db_path: The database the app uses: a SQLite file or a PostgreSQL URL.
        log_path: Where the server's output goes.
        extra_env: More environment for the server (e.g. RUBRIC_STUDIO_ALLOWED_HOSTS).

    Yields:
        The app's URL, once its health check answers.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.pop("RUBRIC_STUDIO_ALLOWED_HOSTS", None)  # the caller's extra_env alone decides
    env.update(RUBRIC_STUDIO_DB=str(db_path), PYTHONUNBUFFERED="1", **(extra_env or {}))
    cmd = [
        sys.executable, "-m", "streamlit", "run", "serve.py",
        "--server.address", "127.0.0.1", "--server.port", str(port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
    ]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    msg = f"streamlit exited early:\n{log_path.read_text()}"
                    raise RuntimeError(msg)
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    msg = f"streamlit did not start in 60 s:\n{log_path.read_text()}"
                    raise RuntimeError(msg)
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


ARTIFACTS = ROOT / "artifacts" / "browser"
"""Where the browser tests keep their screenshots and server logs."""

TIMEOUT_MS = 60_000
"""Playwright's default timeout for the browser tests."""


@contextmanager
def app_in_browser(db_path: Path | str, *, log_name: str, last_shot: str,
                   accept_downloads: bool = False,
                   extra_env: Mapping[str, str] | None = None) -> Iterator[Any]:
    """The real app on a temporary database, open in headless Chromium; yields the page.

    A screenshot of the last state is saved as ``artifacts/browser/<last_shot>.png``.
    ``extra_env`` goes to the server (`streamlit_server`).
    """
    from playwright.sync_api import sync_playwright

    browser_path = chromium_path()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (streamlit_server(db_path, ARTIFACTS / log_name, extra_env) as url,
          sync_playwright() as pw):
        browser = pw.chromium.launch(executable_path=browser_path, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000},
                                      accept_downloads=accept_downloads)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.rubric_log_path = ARTIFACTS / log_name  # for `page_state` at a failure
        try:
            yield page
        except Exception:
            # Raised in a test's own `with` block (a fixture's test reports through conftest).
            print(f"--- the page at the failure:\n{page_state(page)}")
            raise
        finally:
            page.screenshot(path=str(ARTIFACTS / f"{last_shot}.png"), full_page=True)
            context.close()
            browser.close()


def page_state(page: Any) -> str:
    """What the page shows and the end of its server's log, for a failing test's report.

    CI keeps only the test output: this is what tells a failure on a loaded machine apart.
    """
    try:
        text = page.locator("body").inner_text(timeout=5_000)
    except Exception as exc:  # a diagnostic must not hide the failure
        text = f"(the page's text could not be read: {exc})"
    log_path = getattr(page, "rubric_log_path", None)
    log = log_path.read_text(errors="replace") if log_path and log_path.exists() else "(no log)"
    return f"{page.url}\n{text[-4000:]}\n--- the end of the server's log:\n{log[-4000:]}"


def shot(page: Any, name: str) -> None:
    """Save a full-page screenshot as ``artifacts/browser/<name>.png``."""
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def wait_idle(page: Any) -> None:
    """Wait until Streamlit has finished the current script run.

    The toolbar's running sign shows only a moment after a run starts; the elements a run has
    not redrawn yet are marked ``data-stale`` at once, so both are waited for.
    """
    page.wait_for_function(
        "() => !document.querySelector("
        "'[data-testid=\"stStatusWidget\"], [data-stale=\"true\"]')", timeout=TIMEOUT_MS
    )


def click_until_shown(page: Any, button: Any, shown: Any, *, attempts: int = 3,
                      done: Any = None) -> None:
    """Click ``button`` until ``shown`` is visible, at most ``attempts`` times.

    A click sent while Streamlit redraws the page can be lost on a loaded machine (seen once
    in 40 loaded runs of the demo dataset's button, and after a file upload's rerun). Clicked
    again only while neither ``shown`` nor ``done`` (what a click that did land leaves, when it
    is not ``shown``) is on the page, so a click is never taken twice.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for attempt in range(attempts):
        button.click()
        try:
            shown.wait_for(timeout=20_000)
            break
        except PlaywrightTimeoutError:
            wait_idle(page)  # a slow run may still show it
            if shown.count():
                break
            if attempt == attempts - 1 or (done is not None and done.count()):
                raise
    wait_idle(page)


def open_experiments_with_the_demo_dataset(page: Any) -> None:
    """From the Author page: open Experiments and store the bundled demo dataset."""
    page.get_by_role("link", name="Experiments").click()
    page.get_by_role("heading", name="Experiments").wait_for()
    wait_idle(page)
    click_until_shown(
        page, page.locator(".st-key-load_demo_dataset button"),
        page.get_by_text("Bundled dataset 'bundled-demo' is stored as version 1"),
        done=page.get_by_text("Datasets (1 stored)"))


def choose(page: Any, key: str, label: str) -> None:
    """Pick `label` in the selectbox with widget key `key`."""
    from playwright.sync_api import expect

    box = page.locator(f".st-key-{key} [role='combobox']")
    box.click()
    page.get_by_role("option", name=label).click()
    expect(box).to_have_value(label)


def open_tab(page: Any, name: str) -> Any:
    """Select the tab called `name` and return its panel.

    A click sent while Streamlit re-draws the page can be lost on a loaded machine, so the click
    is repeated until the tab says it is selected. Look for text through the returned panel: the
    same text can stand, hidden, in another tab's panel too.
    """
    from playwright.sync_api import expect

    tab = page.get_by_role("tab", name=name, exact=True)
    for attempt in range(5):
        wait_idle(page)
        tab.click()
        try:
            expect(tab).to_have_attribute("aria-selected", "true", timeout=5_000)
            break
        except AssertionError:
            if attempt == 4:
                raise
    return page.get_by_role("tabpanel", name=name, exact=True)
