"""SIGSTOP drill of ``eval --workers 3`` on PostgreSQL, with real processes.

A supervised worker is paused (SIGSTOP) with one of its cells' model calls in flight. It is
alive, so its supervisor does not restart it, and its executor ID names the supervisor (alive
too): the sweeps must find it by its cells' runs, whose heartbeats go stale
(`rubric_core.engine.recovery`, ``RUBRIC_STUDIO_STALE_AFTER_S=5``). Its cells are taken over
and finished by the other workers; then it is continued (SIGCONT), its held call is answered,
and it writes nothing: the database rows of the runs it lost (run, checkpoints, writes,
evaluations) and the DBOS outcome of every cell it held are the same after it woke as when
they were finished by their new owner, each thread keeps one checkpoint lineage, and every
cell ended once. (A run it had ended itself a moment before the pause stays its own: its
workflow is recovered and ends at once elsewhere, and the paused worker may write that run's
last checkpoint when continued; nobody else writes to it.)

Every wait is on a condition, with generous bounds (CI machines are shared and slow); no sleep
is an assertion.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
from openai_server import FakeOpenAI, Reply, text, verdict
from test_engine_drills import Eval, _argv, _env, _experiment_id
from test_experiments import runs_per_thread
from test_fenced_takeover import _assert_one_lineage, _state

from rubric_core.engine.launch import SYSTEM_SCHEMA
from rubric_core.engine.queues import id_prefix
from rubric_core.engine.recovery import thread_of
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

ROWS = 6
WORKERS = 3
STALE_AFTER_S = 5  # sweeps every 1.7 s; a paused worker's runs are stale after 5 s
HELD_PROMPT = "question 0"
WAIT_S = 180.0
"""Bound on every wait for a condition (a loaded machine is slow; a passing run is not)."""


class HoldOneServer:
    """Worker and grader on one loopback server; one cell's second worker call is held.

    The worker's answer is ``draft k`` (k: the user messages it was sent); the grader fails
    ``draft 1`` and passes any later draft, so each cell takes two passes (four calls). The
    first second-pass call of the cell asking `HELD_PROMPT` sets `held` and waits for
    `release` (the test pauses the worker that made it meanwhile); its repetition by the
    worker that takes the cell over is answered at once.
    """

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        self.answered_held = threading.Event()
        self.fake = FakeOpenAI(default=self.respond)

    def respond(self, body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        messages = body.get("messages") or []
        if "GraderResponse" in names:
            latest = json.dumps(messages[-1])
            return verdict("needs_revision", ("c2",)) if "draft 1" in latest else verdict(
                "satisfied")
        k = sum(m.get("role") == "user" for m in messages)
        if k == 2 and HELD_PROMPT in json.dumps(messages) and not self.held.is_set():
            self.held.set()
            self.release.wait(WAIT_S)
            self.answered_held.set()
        return text(f"draft {k}")


def _wait(condition: Any, what: str, *, run: Eval | None = None,
          explain: Any = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        said = (f":\n{run.output}" if run is not None else "") + (
            f"\n{explain()}" if explain is not None else "")
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s{said}"
        if run is not None:
            assert run.proc.poll() is None, f"eval exited before {what}{said}"
        time.sleep(0.05)


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state T in /proc), i.e. the SIGSTOP took effect."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _cell_workflows(db: str, experiment_id: str) -> dict[str, tuple[Any, ...]]:
    """Per thread, its cell workflow's ``(status, executor, output, recovery attempts)``."""
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid, status, executor_id, output, recovery_attempts "
            f"FROM {SYSTEM_SCHEMA}.workflow_status WHERE workflow_uuid LIKE %s",
            (id_prefix(experiment_id) + "%",)).fetchall()
    found: dict[str, tuple[Any, ...]] = {}
    for workflow_id, *rest in rows:
        assert thread_of(workflow_id) not in found, f"two workflows of one cell: {rows}"
        found[thread_of(workflow_id)] = tuple(rest)
    return found


def _sessions(db: str) -> list[str]:
    """The database's other sessions: who waits on what (a paused process may hold a lock)."""
    with psycopg.connect(db) as conn:
        return [" | ".join(str(v)[:160] for v in row) for row in conn.execute(
            "SELECT pid, state, wait_event_type, wait_event, xact_start, pg_blocking_pids(pid), "
            "query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() ORDER BY pid").fetchall()]


BLOCKED_S = 30
"""A claim of a run waiting this long on another session's lock is stuck (a healthy writer's
transaction lasts milliseconds; only a paused one's lasts)."""


def _claims_blocked(db: str) -> list[str]:
    """The claims of a run (`RunStore.claim_run`'s UPDATE) waiting on a lock for `BLOCKED_S`."""
    with psycopg.connect(db) as conn:
        return [f"claim by backend {pid} blocked by {blockers} for {waited:.0f} s"
                for pid, blockers, waited in conn.execute(
                    "SELECT pid, pg_blocking_pids(pid), "
                    "extract(epoch FROM now() - query_start) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND query LIKE 'UPDATE runs SET status = ''running''%%' "
                    "AND now() - query_start > make_interval(secs => %s)",
                    (BLOCKED_S,)).fetchall()]


def _differences(taken: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    """Per thread and table, what the paused worker changed after it woke."""
    lines = []
    for thread, before in taken.items():
        for table, rows in before.items():
            now = after[thread][table]
            if now == rows:
                continue
            if table == "run":
                lines.append(f"{thread} run: {rows} -> {now}")
            else:
                gone = [r for r in rows if r not in now]
                new = [r for r in now if r not in rows]
                lines.append(f"{thread} {table}: added {new}, removed {gone}")
    return "\n".join(lines)


def test_a_paused_supervised_worker_writes_nothing_after_its_cells_were_taken_over(
        pg_url: str, tmp_path: Path) -> None:
    server = HoldOneServer()
    data = tmp_path / "q.csv"
    data.write_text("prompt\n" + "".join(f"question {i}\n" for i in range(ROWS)),
                    encoding="utf-8")
    argv = _argv("--dataset", str(data), "--rubric", "- c1\n- c2", "--config",
                 "worker=openai-compatible:w,grader=openai-compatible:g,"
                 f"base_url={server.fake.base_url}",
                 "--workers", str(WORKERS), "--concurrency", str(WORKERS))
    env = _env(pg_url, RUBRIC_STUDIO_STALE_AFTER_S=str(STALE_AFTER_S))
    victim: int | None = None
    with server.fake, Store(pg_url) as store:
        run = Eval(argv, env)
        try:
            _wait(lambda: server.held.is_set(), "the held call", run=run)
            workers = run.worker_pids()
            held_runs = [r for r in store.list_runs(limit=None)
                         if r.settings.prompt == HELD_PROMPT]
            assert len(held_runs) == 1, "the held cell was started twice: " + "; ".join(
                f"{r.run_id} {r.thread_id} {r.status} {r.owner} {r.created_at}"
                for r in held_runs) + f"\n{run.output}"
            [held_run] = held_runs
            assert held_run.status == "running" and held_run.owner, held_run
            victim = int(held_run.owner.split(":")[1])
            assert victim in workers, (victim, workers, run.output)
            tag = f":{victim}:"
            experiment_id = _experiment_id(run.output)
            # Its slot's executor ID (it runs the held cell's workflow, held at the server).
            status, executor, *_ = _cell_workflows(pg_url, experiment_id)[held_run.thread_id]
            assert status == "PENDING", status
            os.kill(victim, signal.SIGSTOP)
            _wait(lambda: _stopped(victim), "the worker stopped")
            # The cells it holds: those it runs (their runs are its: they must change owner),
            # and those whose workflows it holds but does not run (dequeued and not started
            # yet, or ended a moment before its pause, their outcome not recorded by DBOS yet).
            running = {r.thread_id for r in store.list_runs(limit=None)
                       if r.status == "running" and tag in (r.owner or "")}
            assert held_run.thread_id in running
            lost = running | {t for t, (status, e, *_) in
                              _cell_workflows(pg_url, experiment_id).items()
                              if status == "PENDING" and e == executor}
            # Its call answers now, into a paused process: it reads the answer when continued.
            server.release.set()
            _wait(server.answered_held.is_set, "the held call's answer")

            def taken_over_and_finished() -> bool:
                blocked = _claims_blocked(pg_url)
                assert not blocked, ("the takeover waits on a lock the paused worker holds:\n"
                                     + "\n".join([*blocked, *_sessions(pg_url)]))
                runs = {r.thread_id: r for r in store.list_runs(limit=None)}
                flows = _cell_workflows(pg_url, experiment_id)
                return all(t in runs and runs[t].status == "satisfied"
                           and flows[t][0] == "SUCCESS" for t in lost) and all(
                    tag not in (runs[t].owner or "") for t in running)

            def explain() -> str:
                runs = {r.thread_id: r for r in store.list_runs(limit=None)}
                flows = _cell_workflows(pg_url, experiment_id)
                return "\n".join([*(f"{t}: {runs[t].status if t in runs else None} "
                                    f"{runs[t].owner if t in runs else None} {flows.get(t)}"
                                    for t in lost), f"victim {victim}, executor {executor}",
                                  *_sessions(pg_url)])

            _wait(taken_over_and_finished, "the paused worker's cells finished elsewhere",
                  run=run, explain=explain)
            assert _stopped(victim)
            runs = {r.thread_id: r for r in store.list_runs(limit=None)}
            run_ids = {t: r.run_id for t, r in runs.items()}
            # The runs it lost: every other owner's now. A run it had ended just before its
            # pause (status written, the graph's last checkpoint not yet) stays its own: it
            # may finish writing that one when continued, and nobody else writes it.
            taken_over = {t for t in lost if tag not in (runs[t].owner or "")}
            assert running <= taken_over
            kept = {t: runs[t] for t in lost - taken_over}
            taken = {t: _state(store, run_ids[t], t) for t in lost}
            flows = {t: w for t, w in _cell_workflows(pg_url, experiment_id).items() if t in lost}
            for state in taken.values():
                _assert_one_lineage(state["checkpoints"])
                assert [e[2:] for e in state["evaluations"]] == [(0, "needs_revision"),
                                                                 (1, "satisfied")]

            os.kill(victim, signal.SIGCONT)  # it reads its answer; its writes are refused
            code = run.finish(timeout_s=WAIT_S)
        finally:
            if victim is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGCONT)
            server.release.set()
            run.kill_group()
        assert code == 0, run.output + "\n" + "\n".join(
            f"{c.thread_id}: cell {c.status}, run "
            f"{(c.run.run_id, c.run.status, c.run.owner) if c.run else None}"
            for c in store.experiment_cells(_experiment_id(run.output))) + (
            f"\nvictim {victim}, lost {lost}, running {running}")
        assert f"{ROWS}/{ROWS} done, 100% satisfied" in run.output
        # Not restarted: a paused worker is alive, and it left when asked (no failure).
        assert f"(pid {victim}) exited" not in run.output, run.output
        # Not one row from the former owner after it woke, in our tables (the runs it lost)
        # or in DBOS's (the outcome of every cell's workflow it held).
        assert {t: w for t, w in _cell_workflows(pg_url, experiment_id).items()
                if t in lost} == flows
        after = {t: _state(store, run_ids[t], t) for t in lost}
        assert {t: after[t] for t in taken_over} == {t: taken[t] for t in taken_over}, (
            _differences({t: taken[t] for t in taken_over}, after))
        for thread, record in kept.items():  # its own run: ended as it was, and by it
            assert after[thread]["run"][:2] == ("satisfied", record.owner)
            assert after[thread]["evaluations"] == taken[thread]["evaluations"]
        # Every cell ended once: one run per thread, two gradings per run, one workflow per
        # cell that succeeded, each thread one checkpoint lineage.
        assert runs_per_thread(store, experiment_id) == [1] * ROWS
        assert Counter(len(store.evaluations(r.run_id))
                       for r in store.list_runs(limit=None)) == {2: ROWS}
        cells = store.experiment_cells(experiment_id)
        assert [c.status for c in cells] == ["satisfied"] * ROWS
        for cell in cells:
            assert cell.run is not None
            _assert_one_lineage(_state(store, cell.run.run_id, cell.thread_id)["checkpoints"])
        workflows = _cell_workflows(pg_url, experiment_id)
        assert len(workflows) == ROWS
        assert {status for status, *_ in workflows.values()} == {"SUCCESS"}
        # The lost cells were started again elsewhere (recovered while their worker was alive).
        assert all(workflows[t][3] >= 2 for t in lost), workflows
