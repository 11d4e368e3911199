"""The pytest plugin that runs deepagents' RubricMiddleware tests against ours.

Loaded into the child pytest by ``scripts/deepagents_parity.py`` (``-p parity.plugin``); it
acts only on the rewritten upstream copy (`COPY_NAME`). The tables in ``tables.py`` decide, by
test name: `EXCLUDED` tests (private internals of theirs with no counterpart here) are
deselected; `DIFFERS` tests (public behaviour where we differ on purpose) run as
``xfail(strict=True)``, so a change that makes one pass is noticed; every other test must pass.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest

from parity.tables import COPY_NAME, DIFFERS, EXCLUDED, REPORT_ENV


def upstream_name(item: pytest.Item) -> str:
    """``Class::test`` of an upstream test, without its parametrization."""
    return item.nodeid.split("::", 1)[1].split("[", 1)[0]


def _upstream(item: pytest.Item) -> bool:
    return item.path.name == COPY_NAME


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker upstream's asyncio tests carry (we run them in `pytest_pyfunc_call`)."""
    config.addinivalue_line("markers", "asyncio: an upstream async test, run with asyncio.run")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect `EXCLUDED` tests and mark `DIFFERS` tests strict xfail."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        name = upstream_name(item) if _upstream(item) else ""
        if name in EXCLUDED:
            dropped.append(item)
            continue
        if name in DIFFERS:
            item.add_marker(pytest.mark.xfail(strict=True, reason=DIFFERS[name][0]))
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run upstream's ``async def`` tests (upstream runs them with pytest-asyncio's auto mode)."""
    func = pyfuncitem.obj
    if not _upstream(pyfuncitem) or not inspect.iscoroutinefunction(func):
        return None
    args: dict[str, Any] = {n: pyfuncitem.funcargs[n] for n in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(func(**args))
    return True


def _upstream_id(entry: Any) -> str | None:
    nodeid = getattr(entry, "nodeid", "")
    if "::" not in nodeid or not nodeid.split("::", 1)[0].endswith(COPY_NAME):
        return None
    return str(nodeid.split("::", 1)[1])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """With `REPORT_ENV` set, write the upstream tests' outcomes and xfail texts as JSON.

    ``{"outcomes": {outcome: [test ids]}, "xfail_text": {test id: failure text}}``; a test id
    is ``Class::test[params]``.
    """
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    outcomes: dict[str, set[str]] = {}
    xfail_text: dict[str, str] = {}
    for outcome, entries in terminalreporter.stats.items():
        for entry in entries:
            upstream = _upstream_id(entry)
            if upstream is None or (outcome not in ("error", "deselected")
                                    and getattr(entry, "when", "call") != "call"):
                continue
            outcomes.setdefault(outcome, set()).add(upstream)
            if outcome == "xfailed":
                xfail_text[upstream] = entry.longreprtext
    report = {"outcomes": {k: sorted(v) for k, v in outcomes.items()}, "xfail_text": xfail_text}
    Path(path).write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
