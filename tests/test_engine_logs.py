"""DBOS's log records reach the ``sys.stderr`` of the moment, not the one of the first launch.

DBOS 3.4.0's console handler kept the stream that was ``sys.stderr`` when the engine was first
launched in the process, and DBOS flushes its handlers at each launch: with that stream closed
(pytest's captured stderr of an earlier test, an app that redirected its output) the next
launch failed with "I/O operation on closed file" (``test_engine_status``'s exit statuses,
``[postgres]`` after ``[sqlite]``). `rubric_core.engine.launch` puts a handler that follows
``sys.stderr`` in its place; a CLI user still sees DBOS's warnings on the terminal.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from conftest import ROOT

from rubric_core.engine import launch_engine, shutdown_engine
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ALREADY = "DBOS was already launched"  # a real DBOS warning, logged by a second DBOS.launch()


@pytest.fixture(autouse=True)
def engine_stopped() -> Iterator[None]:
    yield
    shutdown_engine()


def test_a_relaunch_after_the_first_stderr_closed_logs_to_the_current_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dbos import DBOS

    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    with Store(tmp_path / "a.sqlite3") as store:
        launch_engine(store)
        DBOS.launch()
        shutdown_engine()
    assert ALREADY in first.getvalue()
    first.close()  # as pytest closes a test's captured stderr

    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    with Store(tmp_path / "b.sqlite3") as store:
        launch_engine(store)  # failed here: DBOS flushed the closed stream
        DBOS.launch()
        shutdown_engine()
    logged = second.getvalue()
    assert ALREADY in logged and "Logging error" not in logged, logged
    assert "Initializing DBOS" not in logged  # INFO stays quiet


def test_a_cli_process_shows_dbos_warnings_on_its_stderr(tmp_path: Path) -> None:
    script = ("import sys\n"
              "from dbos import DBOS\n"
              "from rubric_core.engine import launch_engine, shutdown_engine\n"
              "from rubric_core.store import Store\n"
              "with Store(sys.argv[1]) as store:\n"
              "    launch_engine(store)\n"
              "    DBOS.launch()\n"
              "    shutdown_engine()\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "c.sqlite3")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert ALREADY in done.stderr and "WARNING" in done.stderr, done.stderr
    assert done.stdout == ""
