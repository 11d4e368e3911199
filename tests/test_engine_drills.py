"""Drills of ``rubric-studio eval --workers N`` on PostgreSQL, with real processes.

- Ctrl-C (SIGINT to the process group, as a terminal sends it) at each of three moments, each
  round resuming the last, on one experiment: exit 130 every time, no process left, every cell
  stopped cleanly and resumable, no cell queued twice; then a Resume ends every cell exactly
  once. (`scripts/soak.sh` repeats the drills many times, for rarer races.)
- Three workers, one killed with SIGKILL mid-cell: its supervisor restarts it under its
  executor ID, DBOS's launch-time recovery for that ID hands its cells back long before any
  heartbeat could (`RUBRIC_STUDIO_STALE_AFTER_S` is 60 here), every cell ends exactly once, and
  the experiment's ``--concurrency`` holds over the three (counted in flight at the server).

The loopback server (`GatedServer`) counts requests in flight, from arrival to answer, and can
hold every call at a gate, so a test acts while cells are surely mid-call.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from openai_server import DelayedServer, Reply, verdict
from test_experiments import runs_per_thread

from rubric_core.engine.launch import SYSTEM_SCHEMA
from rubric_core.engine.queues import ACTIVE, id_prefix
from rubric_core.engine.recovery import thread_of
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRITERION = "answers the question"


class GatedServer(DelayedServer):
    """A `DelayedServer` whose calls wait at a gate while it is closed.

    ``flying`` counts the requests in flight from their arrival to their answer (the wait at
    the gate included) and ``top`` is the most at once; ``at_gate`` the calls waiting now.
    """

    def __init__(self, delay_s: float, *, passes: int = 1) -> None:
        super().__init__(delay_s=delay_s, grader_reply=verdict("satisfied", (), (CRITERION,)),
                         passes=passes)
        self.gate = threading.Event()
        self.gate.set()
        self.flying = self.top = self.at_gate = 0
        self._counts = threading.Lock()

    def respond(self, body: dict[str, Any]) -> Reply:
        """Wait while the gate is closed, then answer as `DelayedServer`."""
        with self._counts:
            self.flying += 1
            self.top = max(self.top, self.flying)
            self.at_gate += 1
        try:
            self.gate.wait()
        finally:
            with self._counts:
                self.at_gate -= 1
        try:
            return super().respond(body)
        finally:
            with self._counts:
                self.flying -= 1


class Eval:
    """``python -m rubric_core eval`` in a process group of its own (its workers join it),
    started with SIGINT's default action as a terminal's foreground job is (pytest run as a
    background job inherits SIGINT ignored), its output read as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        def default_sigint() -> None:
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, preexec_fn=default_sigint)
        self.lines: list[str] = []
        self.ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        """Wait until ``ready()`` (or fail naming ``what``, with the output so far)."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert self.proc.poll() is None, f"eval exited before {what}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {what} in {timeout_s} s:\n{self.output}"
            time.sleep(0.02)

    def worker_pids(self) -> list[int]:
        return [int(m) for m in re.findall(r"^worker \d+: pid (\d+)$", self.output, re.M)]

    def finish(self, timeout_s: float = 120.0) -> int:
        """Wait for the process and for every process of its group to end; its exit status."""
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        deadline = time.monotonic() + 30
        while _group_alive(self.proc.pid):
            assert time.monotonic() < deadline, f"a worker outlived eval:\n{self.output}"
            time.sleep(0.05)
        self.ended = True
        return code

    def kill_group(self) -> None:
        """SIGKILL whatever of the group is still running (clean-up after a failure)."""
        if self.ended:
            return  # every process of the group ended: its id may belong to another by now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _experiment_files(tmp_path: Path, rows: int, server: GatedServer) -> list[str]:
    data = tmp_path / "q.csv"
    data.write_text("prompt\n" + "".join(f"question {i}\n" for i in range(rows)),
                    encoding="utf-8")
    return ["--dataset", str(data), "--rubric", f"- {CRITERION}", "--config",
            "worker=openai-compatible:w,grader=openai-compatible:g,"
            f"base_url={server.fake.base_url}"]


def _argv(*flags: str) -> list[str]:
    """``eval`` and ``flags``; the database comes in the environment (`_env`),
    as the workers get it: a URL is never on a command line."""
    return [sys.executable, "-m", "rubric_core", "eval", *flags]


def _env(db: str, **extra: str) -> dict[str, str]:
    """The processes' environment; heartbeats four times a second, so that a live process is
    taken for gone only when starved of the CPU for almost its whole staleness."""
    return {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key",
            "RUBRIC_STUDIO_DB": db, "RUBRIC_STUDIO_HEARTBEAT_S": "0.25", **extra}


def _workflows(db: str, experiment_id: str) -> list[tuple[str, str, str | None]]:
    """``(workflow id, status, executor id)`` of the experiment's cell workflows in DBOS."""
    return [(w, s, e) for w, s, e, _ in _dequeues(db, experiment_id)]


def _dequeues(db: str, experiment_id: str) -> list[tuple[str, str, str | None, int]]:
    """`_workflows` with how many times each was dequeued (DBOS counts every start of a queued
    workflow in ``recovery_attempts``)."""
    with psycopg.connect(db) as conn:
        table = f"{SYSTEM_SCHEMA}.workflow_status"
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
            return []  # stopped before any process launched the engine
        return [(str(w), str(s), e, int(n or 0)) for w, s, e, n in conn.execute(
            "SELECT workflow_uuid, status, executor_id, recovery_attempts "
            f"FROM {SYSTEM_SCHEMA}.workflow_status WHERE workflow_uuid LIKE %s",
            (id_prefix(experiment_id) + "%",)).fetchall()]


def _experiment_id(output: str) -> str:
    found = re.search(r"^experiment ([0-9a-f]{32}) ", output, re.M)
    assert found, output
    return found.group(1)


def _evaluations_per_run(store: Store) -> Counter[int]:
    return Counter(len(store.evaluations(run.run_id)) for run in store.list_runs(limit=None))


MOMENTS = ("started", "queued", "mid-call")
ROUNDS = len(MOMENTS)  # each moment, each round a resume of the last: `scripts/soak.sh` repeats
CTRL_C_ROWS = 24  # each round ends at most a step of CTRL_C_CONCURRENCY cells: some are left
CTRL_C_CONCURRENCY = 3


@pytest.mark.timeout(600)  # 4 runs of three processes each
def test_ctrl_c_of_eval_workers_exits_130_every_time_and_resume_ends_each_cell_once(
    pg_url: str, tmp_path: Path
) -> None:
    # A held call is answered 0.1 s after the gate opens: the processes have their SIGINT by
    # then, so each cell stops after the step in progress.
    server = GatedServer(delay_s=0.1)
    env = _env(pg_url)
    flags = ["--workers", "2", "--concurrency", str(CTRL_C_CONCURRENCY)]
    experiment_id = ""
    with server.fake:
        for round_ in range(ROUNDS):
            server.gate.clear()  # no cell can end before the Ctrl-C
            source = (["--resume", experiment_id] if experiment_id
                      else _experiment_files(tmp_path, CTRL_C_ROWS, server))
            run = Eval(_argv(*source, *flags), env)
            try:
                # Ctrl-C at three moments: as the workers start (they are importing and
                # launching the engine), as the driver queues the cells (its first progress
                # line), and with every slot of --concurrency mid-call on the workers.
                moment = MOMENTS[round_ % len(MOMENTS)]
                if moment == "started":
                    run.wait_for(lambda run=run: len(run.worker_pids()) == 2, "workers")
                elif moment == "queued":
                    run.wait_for(lambda run=run: " done, " in run.output, "progress")
                else:
                    run.wait_for(lambda: server.at_gate >= CTRL_C_CONCURRENCY, "calls")
                os.killpg(run.proc.pid, signal.SIGINT)
                server.gate.set()  # a stopped cell ends after its step in progress
                code = run.finish()
            finally:
                run.kill_group()
                server.gate.set()
            assert code == 130, f"round {round_}: exit {code}\n{run.output}"
            assert "interrupted" in run.output
            experiment_id = experiment_id or _experiment_id(run.output)
            with Store(pg_url) as store:
                cells = store.experiment_cells(experiment_id)
                runs = store.list_runs(limit=None)
            # Every cell stopped cleanly, resumable: nothing left 'running'.
            assert {c.status for c in cells} <= {"satisfied", "interrupted", "pending"}, (
                round_, Counter(c.status for c in cells))
            assert not [r for r in runs if r.status == "running"], round_
            assert any(c.status != "satisfied" for c in cells), "the experiment ended"
            # No cell queued twice: at most one workflow of a cell is queued or running (a
            # stopped cell's is cancelled; Resume queues its next attempt).
            open_ = Counter(thread_of(w) for w, status, _ in _workflows(pg_url, experiment_id)
                            if status in ACTIVE)
            assert max(open_.values(), default=0) <= 1, open_

        resumed = Eval(_argv("--resume", experiment_id, *flags), env)
        try:
            code = resumed.finish(timeout_s=180)
        finally:
            resumed.kill_group()
    assert code == 0, resumed.output
    assert f"{CTRL_C_ROWS}/{CTRL_C_ROWS} done, 100% satisfied" in resumed.output
    with Store(pg_url) as store:
        assert {c.status for c in store.experiment_cells(experiment_id)} == {"satisfied"}
        assert runs_per_thread(store, experiment_id) == [1] * CTRL_C_ROWS
        assert _evaluations_per_run(store) == {1: CTRL_C_ROWS}  # no grading recorded twice
    # Nothing left queued or running; a cell whose workflow was cancelled just as it ended
    # (satisfied) keeps that workflow CANCELLED, as Resume has nothing to run for it.
    assert not [w for w, status, _ in _workflows(pg_url, experiment_id)
                if status in ("ENQUEUED", "PENDING")]
    assert server.top <= CTRL_C_CONCURRENCY
    # Every step ran once: a stopped cell ended its call in progress and continued after it.
    assert len(server.fake.requests) == CTRL_C_ROWS * 2


KILL_ROWS = 36
KILL_CONCURRENCY = 6
KILL_STALE_AFTER_S = 60  # no heartbeat goes stale during the test: only the restart recovers


def test_three_workers_one_killed_mid_cell_restarts_under_its_executor_and_ends_cells_once(
    pg_url: str, tmp_path: Path
) -> None:
    server = GatedServer(delay_s=0.3, passes=2)  # 4 calls a cell
    env = _env(pg_url, RUBRIC_STUDIO_STALE_AFTER_S=str(KILL_STALE_AFTER_S))
    argv = _argv(*_experiment_files(tmp_path, KILL_ROWS, server), "--workers", "3",
                 "--concurrency", str(KILL_CONCURRENCY))
    with server.fake:
        run = Eval(argv, env)
        try:
            run.wait_for(lambda: len(run.worker_pids()) == 3, "workers")
            pids = {str(pid) for pid in run.worker_pids()}
            store = Store(pg_url)
            try:
                chosen: list[int] = []

                def a_worker_mid_cell() -> bool:
                    """Once cells ended: the first worker found running one, as the victim."""
                    runs = store.list_runs(limit=None)
                    if sum(r.status == "satisfied" for r in runs) < 2:
                        return False
                    chosen.extend(int(p) for r in runs if r.status == "running"
                                  and (p := (r.owner or "::").split(":")[1]) in pids)
                    return bool(chosen)

                run.wait_for(a_worker_mid_cell, "a cell running on a worker")
                victim = chosen[0]
                tag = f":{victim}:"
                os.kill(victim, signal.SIGKILL)
                killed_at = time.monotonic()
                held = {r.thread_id for r in store.list_runs(limit=None)
                        if r.status == "running" and tag in (r.owner or "")}
                experiment_id = _experiment_id(run.output)
                workflows = _workflows(pg_url, experiment_id)
                executors = {e for w, s, e in workflows
                             if thread_of(w) in held and s == "PENDING"}
                assert len(executors) == 1, executors  # the victim's slot
                # Its cells: those running, and any it had dequeued but not started yet.
                victims = {thread_of(w) for w, s, e in workflows
                           if s == "PENDING" and e in executors}

                def taken_again() -> bool:
                    runs = {r.thread_id: r for r in store.list_runs(limit=None)}
                    return all(tag not in (runs[t].owner or "") or runs[t].status != "running"
                               for t in held)

                run.wait_for(taken_again, "recovery of the killed worker's cells",
                             timeout_s=KILL_STALE_AFTER_S)
                recovered_in = time.monotonic() - killed_at
            finally:
                store.close()
            code = run.finish(timeout_s=120)
        finally:
            run.kill_group()
    assert code == 0, run.output
    restarted = re.search(rf"^worker \d \(pid {victim}\) exited -9: restarted under its executor "
                          r"ID as pid (\d+)$", run.output, re.M)
    assert restarted, run.output
    # Within the documented bound for a supervised worker: its restart, far below the
    # heartbeat's STALE_AFTER_S that any other recovery would have waited for.
    assert recovered_in < KILL_STALE_AFTER_S
    assert f"{KILL_ROWS}/{KILL_ROWS} done, 100% satisfied" in run.output
    with Store(pg_url) as store:
        assert {c.status for c in store.experiment_cells(experiment_id)} == {"satisfied"}
        assert runs_per_thread(store, experiment_id) == [1] * KILL_ROWS
        assert _evaluations_per_run(store) == {2: KILL_ROWS}  # no grading recorded twice
        new_pid = f":{restarted.group(1)}:"
        by_new = {r.thread_id for r in store.list_runs(limit=None) if new_pid in (r.owner or "")}
    workflows = _workflows(pg_url, experiment_id)
    assert {status for _, status, _ in workflows} == {"SUCCESS"}
    # Each of the killed worker's cells was started twice (by it, then once recovered), every
    # other cell once: no sweep took a cell back from a live worker.
    dequeued = {thread_of(w): n for w, _, _, n in _dequeues(pg_url, experiment_id)}
    assert dequeued == {t: 2 if t in victims else 1 for t in dequeued}
    # The restarted worker ran under the killed one's executor ID.
    [executor] = executors
    assert all(e == executor for w, _, e in workflows if thread_of(w) in by_new)
    # The global limit held over the three workers.
    assert server.top <= KILL_CONCURRENCY, server.top
    # Nothing ran twice: at most the calls in flight at the kill were made again.
    assert KILL_ROWS * 4 <= len(server.fake.requests) <= KILL_ROWS * 4 + KILL_CONCURRENCY


LONG_STALE_AFTER_S = 5  # sweeps every 1.7 s (SWEEP_S), heartbeats as often


def test_sweeps_leave_a_supervised_workers_long_cells_alone(pg_url: str, tmp_path: Path) -> None:
    """A supervised worker's executor ID names its supervisor, which runs no cell: the sweeps
    must judge it by its cells' runs (alive: their heartbeats), never take its cells back
    while it works on them, however long a cell takes past `STALE_AFTER_S`."""
    rows = 4
    server = GatedServer(delay_s=0.02)
    server.gate.clear()
    env = _env(pg_url, RUBRIC_STUDIO_STALE_AFTER_S=str(LONG_STALE_AFTER_S))
    argv = _argv(*_experiment_files(tmp_path, rows, server), "--workers", "2",
                 "--concurrency", "2")
    with server.fake:
        run = Eval(argv, env)
        try:
            run.wait_for(lambda: server.at_gate >= 2, "both slots mid-call")
            experiment_id = _experiment_id(run.output)
            # Mid-call for two STALE_AFTER_S: a sweep judging by the pid in the executor ID
            # (the supervisor's, with no run of its own) would have re-queued both cells.
            time.sleep(2 * LONG_STALE_AFTER_S)
            assert server.at_gate == 2
            taken_back = [n for *_, n in _dequeues(pg_url, experiment_id) if n > 1]
            server.gate.set()
            code = run.finish(timeout_s=120)
        finally:
            server.gate.set()
            run.kill_group()
    assert code == 0, run.output
    assert not taken_back
    assert {n for *_, n in _dequeues(pg_url, experiment_id)} == {1}
    assert runs_per_thread(pg_url, experiment_id) == [1] * rows
    assert len(server.fake.requests) == rows * 2


def test_workers_leave_when_eval_is_killed_and_resume_ends_each_cell_once(
    pg_url: str, tmp_path: Path
) -> None:
    """kill -9 of ``eval`` (the supervisor): its workers see their pipe close and leave, their
    cells stopped after their step; a Resume's workers re-queue them at once (the pid their
    executor IDs name is gone) and every cell ends exactly once."""
    rows = 6
    server = GatedServer(delay_s=0.02)
    server.gate.clear()
    env = _env(pg_url)
    flags = ["--workers", "2", "--concurrency", "2"]
    with server.fake:
        run = Eval(_argv(*_experiment_files(tmp_path, rows, server), *flags), env)
        try:
            run.wait_for(lambda: server.at_gate >= 2, "both slots mid-call")
            experiment_id = _experiment_id(run.output)
            os.kill(run.proc.pid, signal.SIGKILL)
            server.gate.set()
            assert run.finish() == -signal.SIGKILL  # and no worker outlived it
        finally:
            server.gate.set()
            run.kill_group()
        with Store(pg_url) as store:
            assert not [r for r in store.list_runs(limit=None) if r.status == "running"]
        assert any(s == "PENDING" for _, s, _ in _workflows(pg_url, experiment_id))
        resumed = Eval(_argv("--resume", experiment_id, *flags), env)
        try:
            code = resumed.finish(timeout_s=120)
        finally:
            resumed.kill_group()
    assert code == 0, resumed.output
    assert runs_per_thread(pg_url, experiment_id) == [1] * rows
    assert len(server.fake.requests) == rows * 2


def test_workers_on_the_engine_refuse_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rubric_core.cli import main

    db = tmp_path / "runs.sqlite3"
    assert main(["eval", "--dataset", "bundled", "--workers", "2",
                 "--db", str(db)]) == 2
    assert "needs a PostgreSQL --db" in capsys.readouterr().err
    assert not db.exists()  # refused before anything was stored


def test_a_worker_that_keeps_dying_is_given_up_with_its_error(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that cannot start (no database there) is restarted under its executor ID, then
    given up after `RESTART_LIMIT` restarts, its standard error's tail kept as the failure."""
    from rubric_core.engine import supervisor

    monkeypatch.setattr(supervisor, "RESTART_LIMIT", 1)
    messages: list[str] = []
    with supervisor.Supervisor("postgresql://nobody@127.0.0.1:1/none", "0" * 32, 1,
                               on_message=messages.append) as workers:
        [slot] = workers.slots
        deadline = time.monotonic() + 120
        while not workers.failures:
            assert time.monotonic() < deadline, messages
            time.sleep(0.05)
    assert slot.restarts == 1
    first, second = (int(m) for m in re.findall(r"^worker 1: pid (\d+)$", "\n".join(messages),
                                                re.M))
    assert (f"worker 1 (pid {first}) exited 2: restarted under its executor ID as pid {second}"
            in messages)
    [failure] = workers.failures
    assert failure.startswith("worker 1 (pid ") and "exited 2 2 times, not restarted" in failure
    assert "Cannot connect to the PostgreSQL server at 127.0.0.1:1" in failure


def test_a_ctrl_c_while_the_supervisor_starts_its_watcher_stays_a_ctrl_c(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as ``eval --workers`` starts (the drill's "started" moment) can land while the
    supervisor's watcher thread is being started: the workers are stopped and the
    KeyboardInterrupt goes on to ``eval`` (exit 130); joining the watcher that never began
    raised in its place before (exit 1, found by the drill)."""
    from rubric_core.engine import supervisor

    start = threading.Thread.start

    def interrupted_start(thread: threading.Thread) -> None:
        if thread.name == "rubric-supervisor":
            raise KeyboardInterrupt  # as the wait for the new thread to begin is interrupted
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    workers = supervisor.Supervisor("postgresql://nobody@127.0.0.1:1/none", "0" * 32, 2)
    with pytest.raises(KeyboardInterrupt):
        workers.__enter__()
    assert all(slot.done and slot.proc is not None and slot.proc.poll() is not None
               for slot in workers.slots)


def test_a_worker_stopped_alone_hands_its_cells_to_the_others_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    """SIGTERM to one worker (not Ctrl-C): it is not restarted, its cells stop after their step
    and its supervisor re-queues them at once for the other worker, long before a heartbeat
    could go stale (`RUBRIC_STUDIO_STALE_AFTER_S` is 60 here)."""
    rows = 6
    # A call answered a second after the gate opens: the worker has its SIGTERM long before,
    # so its cell stops after that call instead of ending.
    server = GatedServer(delay_s=1.0)
    server.gate.clear()
    env = _env(pg_url, RUBRIC_STUDIO_STALE_AFTER_S=str(KILL_STALE_AFTER_S))
    argv = _argv(*_experiment_files(tmp_path, rows, server), "--workers", "2",
                 "--concurrency", "2")
    with server.fake, Store(pg_url) as store:
        run = Eval(argv, env)
        try:
            run.wait_for(lambda: server.at_gate >= 2, "both slots mid-call")
            running = {r.owner.split(":")[1] for r in store.list_runs(limit=None)
                       if r.status == "running" and r.owner}
            stopped = next(pid for pid in run.worker_pids() if str(pid) in running)
            os.kill(stopped, signal.SIGTERM)
            server.gate.set()  # its cells end their step, then stop
            run.wait_for(lambda: f"(pid {stopped}) was stopped" in run.output,
                         "the stopped worker's end")
            stopped_at = time.monotonic()
            code = run.finish(timeout_s=KILL_STALE_AFTER_S)
            took = time.monotonic() - stopped_at
        finally:
            server.gate.set()
            run.kill_group()
    assert code == 0, run.output
    assert "restarted" not in run.output
    assert took < KILL_STALE_AFTER_S
    experiment_id = _experiment_id(run.output)
    assert runs_per_thread(pg_url, experiment_id) == [1] * rows
    # Its cells were started again elsewhere, at once (not after STALE_AFTER_S).
    assert 2 in {n for *_, n in _dequeues(pg_url, experiment_id)}
    assert len(server.fake.requests) == rows * 2
