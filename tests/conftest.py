"""Shared fixtures and sample texts. `rubric_core` is the installed package (the test command
installs this clone with ``pip install -e .[dev]``); nothing here patches ``sys.path``.

Database fixtures: ``db_location`` is a fresh database on each backend in turn (a SQLite file
path, then the URL of a new database on the session's PostgreSQL server), ``store`` a `Store`
opened on it, ``pg_url`` a fresh PostgreSQL database alone. The server (`pg_support`) starts
once per session, on first use; each test gets its own database (CREATE DATABASE, ~60 ms).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pg_support import create_database, drop_database, postgres_server

from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Generator, Iterator

ROOT = Path(__file__).resolve().parents[1]

BACKENDS = ("sqlite", "postgres")

# Sample answers shared by test_offline_rules.py and test_offline_graders.py, so the phrasing
# table and the grader verdicts are pinned against the same text.
HAIKU_DRAFT = "Soft rain on the hill\ngreen buds open in the warm light\nbirds sing by the pond"
HAIKU_FIXED = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"
SUMMARY = (
    "Photosynthesis is the process by which plants use light energy to turn water and carbon "
    "dioxide into glucose. Oxygen is released as a by-product."
)
CODE_OK = "```python\ndef add(a, b):\n    return a + b\n```"


# Test files whose tests start processes, servers or a browser, longest first. Under
# pytest-xdist (scripts/test.sh schedules one test at a time) they start first, so no worker
# is left running a long test at the end while the others idle; the rest keep their order.
LONG_FIRST = (
    "test_real_llama", "test_real_python_server", "test_engine_drills",
    "test_browser_two_servers", "test_fenced_takeover", "test_browser",
    "test_browser_lab", "test_browser_experiments", "test_browser_engine", "test_app_limits",
    "test_browser_first_run", "test_lab_cli", "test_engine_limits", "test_engine_sigstop",
    "test_engine_fencing", "test_engine_workers", "test_engine_exit", "test_regrade_engine",
    "test_attacks_experiments", "test_calls", "test_cli", "test_pg_outage_experiment",
)


_SHARED_SERVERS: list[Any] = []  # the controller's stop functions (`pytest_unconfigure`)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the controller starts the run's one real model server for every
    worker (`llama_support.start_shared_llama_server`), before the workers start.

    A server that cannot start is left to the ``llama_url`` fixture, which then starts one in
    the worker that needs it and fails the tests there with the reason: never a skip.
    """
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    from llama_support import LLAMA_URL_ENV, start_shared_llama_server

    if os.environ.get(LLAMA_URL_ENV):
        return  # given by whoever runs pytest
    try:
        url, stop = start_shared_llama_server()
    except Exception as exc:  # the fixture says why, in each test that needs the server
        print(f"the shared llama-server did not start: {exc}", file=sys.stderr)
        return
    os.environ[LLAMA_URL_ENV] = url
    _SHARED_SERVERS.append(stop)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop what `pytest_configure` started."""
    while _SHARED_SERVERS:
        _SHARED_SERVERS.pop()()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of `LONG_FIRST` first, in its order (a stable sort: nothing else moves)."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(LONG_FIRST)))


@pytest.fixture(autouse=True)
def own_data_home(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's default database goes under a temporary XDG_DATA_HOME: no test writes the
    user's own (``rubric-studio run`` records there when given no ``--db``)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data-home")))


def _stop_engine() -> None:
    """Stop the queue engine if a test launched it (DBOS: one database per process)."""
    if "rubric_core.engine.launch" in sys.modules:  # never imports DBOS for a test without it
        from rubric_core.engine.launch import current_engine, shutdown_engine

        if current_engine() is not None:
            shutdown_engine(settle_s=1.0)


@pytest.fixture(autouse=True)
def engine_stopped_after_test() -> Iterator[None]:
    """A test that ran a re-grade or an experiment on the engine leaves no engine running:
    the next test's database is another one."""
    yield
    _stop_engine()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One PostgreSQL server for the session (its ``postgres`` database's URL)."""
    with postgres_server() as url:
        yield url
        _stop_engine()  # launched on one of its databases by a test: before the server stops


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """The URL of a new, empty database on the session's server, dropped afterwards."""
    url = create_database(pg_server)
    yield url
    _stop_engine()  # before its database goes
    drop_database(url)


@pytest.fixture(params=BACKENDS)
def db_location(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """A database that does not exist yet: a SQLite file path, or an empty PostgreSQL one."""
    if request.param == "sqlite":
        return tmp_path / "db" / "rubric_studio.sqlite3"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_location: str | Path) -> Iterator[Store]:
    """A `Store` opened on ``db_location`` (on each backend), closed afterwards."""
    with Store(db_location) as opened:
        yield opened


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing browser test's report carries what its page showed (`page_state`)."""
    report: pytest.TestReport = yield
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            page = value[0] if isinstance(value, tuple) and value else value
            if hasattr(page, "rubric_log_path"):
                from browser_support import page_state

                report.sections.append(("the page at the failure", page_state(page)))
    return report


# -- the real model server (llama.cpp with SmolLM2; tests/llama_support.py) -------------------


@pytest.fixture(scope="session")
def llama_url() -> Iterator[str]:
    """The base URL (``…/v1``) of a real ``llama-server`` serving SmolLM2-135M-Instruct.

    The run's shared server when ``RUBRIC_STUDIO_TEST_LLAMA_URL`` names one (the xdist
    controller starts it: `llama_support.start_shared_llama_server`), else one started for this
    process on first use and stopped at its end.
    """
    from llama_support import LLAMA_URL_ENV, llama_server

    shared = os.environ.get(LLAMA_URL_ENV)
    if shared:
        yield shared
        return
    with llama_server() as server:
        yield server.url
