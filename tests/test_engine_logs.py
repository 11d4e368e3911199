"""DBOS's log records reach the ``sys.stderr`` of the moment, not the one of the first launch.

DBOS 3.4.0's console handler kept the stream that was ``sys.stderr`` when the engine was first
launched in the process, and DBOS flushes its handlers at each launch: with that stream closed
(pytest's captured stderr of an earlier test, an app that redirected its output) the next
launch failed with "I/O operation on closed file" (``test_engine_status``'s exit statuses,
``[postgres]`` after ``[sqlite]``). `rubric_core.engine.launch` puts a handler that follows
``sys.stderr`` in its place; a script using the library still sees DBOS's warnings there.

A command of the CLI chooses where they go (`rubric_core.library_logs`, issue 37): nowhere by
default (our own message says what they would), standard error with ``--verbose``, a file with
``--log-file``; DBOS then adds no console handler of its own.
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
from rubric_core.library_logs import send_library_logs
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


@pytest.mark.parametrize(("verbose", "to_file"), [
    pytest.param(False, False, id="nowhere_by_default"),
    pytest.param(True, False, id="verbose_on_stderr"),
    pytest.param(False, True, id="log_file"),
])
def test_a_command_sends_dbos_records_where_it_chose_and_puts_them_back_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verbose: bool, to_file: bool) -> None:
    from dbos import DBOS

    log = tmp_path / "libraries.log"
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    restore = send_library_logs(verbose=verbose, log_file=str(log) if to_file else None)
    try:
        with Store(tmp_path / "a.sqlite3") as store:
            launch_engine(store)
            DBOS.launch()
            shutdown_engine()
    finally:
        restore()
    assert (ALREADY in stderr.getvalue()) is verbose, stderr.getvalue()
    assert (log.exists() and ALREADY in log.read_text(encoding="utf-8")) is to_file
    # Put back: a later launch in the process logs as a script's does (the first test's way).
    after = io.StringIO()
    monkeypatch.setattr(sys, "stderr", after)
    with Store(tmp_path / "b.sqlite3") as store:
        launch_engine(store)
        DBOS.launch()
        shutdown_engine()
    assert ALREADY in after.getvalue(), after.getvalue()


def test_eval_keeps_dbos_records_off_the_terminal_unless_asked(tmp_path: Path) -> None:
    # The program keeps the command's choice to its exit (the engine's threads may still log):
    # a record logged as DBOS and psycopg log theirs reaches the terminal only with --verbose.
    script = ("import logging, sys\n"
              "from rubric_core.cli import main\n"
              "status = main(sys.argv[1:], keep_log_routing=True)\n"
              "logging.getLogger('dbos').warning('a DBOS warning after the command')\n"
              "logging.getLogger('psycopg.pool').warning('discarding closed connection')\n"
              "sys.exit(status)\n")
    args = ["eval", "--dataset", "bundled", "--db", str(tmp_path / "e.sqlite3"),
            "--max-iterations", "1"]
    quiet = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                           text=True, timeout=300, check=False)
    assert quiet.returncode in (0, 1), quiet.stderr
    assert "WARNING" not in quiet.stderr and "discarding" not in quiet.stderr, quiet.stderr
    loud = subprocess.run([sys.executable, "-c", script, *args, "--verbose"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert "a DBOS warning after the command" in loud.stderr, loud.stderr
    assert "discarding closed connection" in loud.stderr, loud.stderr
