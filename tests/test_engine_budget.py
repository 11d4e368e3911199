"""Budgets on the queue engine (`rubric_core.engine.holds`): held over every process.

The loopback server (`MeteredServer`) reports, for every call, the usage the budget's first
estimate assumes (`TYPICAL_WORKER_CALL`, `TYPICAL_GRADER_CALL`), so a cell (one pass, one
grading) costs exactly its estimate at the test's prices and how many cells a budget lets in is
known exactly. Worker calls can be held at the server (``gate``), keeping cells in flight while
the test looks. Prices are given as ``--price MODEL=IN,CACHED,OUT`` overrides, as in
``tests/test_costs.py``; every dollar figure is checked against the recorded calls priced by
hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import threading
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import FakeOpenAI, Reply, text, verdict
from test_costs import G_PRICE, RUBRIC, W_PRICE, G, W, by_hand
from test_engine_workers import _worker
from test_experiments import runs_per_thread

from rubric_core.background import work_loop
from rubric_core.datasets import parse_dataset
from rubric_core.engine import launch_engine, shutdown_engine
from rubric_core.engine import queues as engine_queues
from rubric_core.engine.holds import REFUSED
from rubric_core.experiments import (
    Budget,
    BudgetError,
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.experiments.budget import (
    LOCK_PREFIX,
    TYPICAL_GRADER_CALL,
    TYPICAL_WORKER_CALL,
    first_estimate,
)
from rubric_core.prices import PriceOverride, Prices
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

    from openai_server import Text, ToolCall

OVERRIDES = (PriceOverride.parse(W_PRICE), PriceOverride.parse(G_PRICE))
DEADLINE_S = 60.0


class MeteredServer(FakeOpenAI):
    """Worker and grader whose every call reports the budget's typical usage (no cache).

    While ``gate`` is clear, worker calls wait at the server (``waiting`` counts them,
    ``peak_waiting`` is the most at once).
    """

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = self.peak_waiting = 0
        self._count = threading.Lock()
        super().__init__(default=self.respond)

    def respond(self, body: dict[str, Any]) -> Reply:
        if _is_grader(body):
            return verdict("satisfied")
        with self._count:
            self.waiting += 1
            self.peak_waiting = max(self.peak_waiting, self.waiting)
        try:
            self.gate.wait(DEADLINE_S)
        finally:
            with self._count:
                self.waiting -= 1
        return text("answer")

    def _completion(self, body: dict[str, Any], reply: Text | ToolCall) -> dict[str, Any]:
        out = super()._completion(body, reply)
        usage = TYPICAL_GRADER_CALL if _is_grader(body) else TYPICAL_WORKER_CALL
        out["usage"] = {"prompt_tokens": usage.input_tokens,
                        "completion_tokens": usage.output_tokens,
                        "total_tokens": usage.input_tokens + usage.output_tokens}
        return out


def _is_grader(body: dict[str, Any]) -> bool:
    return "GraderResponse" in [t.get("function", {}).get("name")
                                for t in body.get("tools") or []]


@pytest.fixture
def server() -> Iterator[MeteredServer]:
    with MeteredServer() as s:
        yield s


@pytest.fixture
def engine_store(store: Store) -> Iterator[Store]:
    """``store`` (each backend); the engine launched on it is stopped before it is dropped."""
    yield store
    shutdown_engine()


def _on_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, work_loop()).result(timeout=60)


def _experiment(store: Store, server: MeteredServer, rows: int) -> str:
    data = "prompt\n" + "".join(f"write note {i}\n" for i in range(rows))
    config = ExperimentConfig(worker_model=W, grader_model=G, rubric=RUBRIC, max_iterations=1,
                              base_url=server.base_url)
    return create_experiment(store, parse_dataset(data, name="rows"), [config]).experiment_id


def _cell_cost() -> Decimal:
    """What one cell costs at the test's prices: exactly the budget's first estimate."""
    cost = first_estimate(ExperimentConfig(worker_model=W, grader_model=G, max_iterations=1),
                          Prices(OVERRIDES))
    assert cost is not None and cost > 0
    return cost


def _spent(store: Store) -> Decimal:
    """Every call recorded in the database, priced by hand."""
    return by_hand([c for r in store.list_runs(limit=None) for c in store.calls(r.run_id)])


def _run(store: Store, experiment_id: str, **kwargs: Any) -> list[Any]:
    backoff = SharedBackoff()
    return list(run_experiment(store, experiment_id, backoff=backoff,
                               models=experiment_models(backoff, api_key="test-key"), **kwargs))


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            msg = f"gave up after {DEADLINE_S:.0f} s waiting for {what}"
            raise AssertionError(msg)
        time.sleep(0.05)


def _workflows(experiment_id: str) -> list[Any]:
    from dbos import DBOS

    return DBOS.list_workflows(workflow_id_prefix=engine_queues.id_prefix(experiment_id),
                               load_input=False, load_output=False)


def test_a_budget_holds_on_the_engine_and_resume_with_a_larger_one_finishes(
        engine_store: Store, server: MeteredServer) -> None:
    store, rows, cell = engine_store, 6, _cell_cost()
    exp_id = _experiment(store, server, rows)
    limit = 2 * cell + Decimal("0.01")  # two cells fit, a third never does
    # Three cells at once: the first two hold their estimates while they run, so the third is
    # refused before either ended, and no further cell starts.
    events = _run(store, exp_id, concurrency=3, budget=Budget(limit, OVERRIDES))
    finished = events[-1]
    assert finished["type"] == "experiment_finished" and finished["status"] == "stopped"
    assert finished.get("budget_reached") is True
    ran = [c for c in store.cell_outcomes(exp_id) if c.run_id is not None]
    assert [c.status for c in ran] == ["satisfied"] * 2
    assert _spent(store) == 2 * cell == Decimal(finished["spent_usd"]) <= limit
    assert store.get_experiment(exp_id).status == "stopped"  # type: ignore[union-attr]
    assert _on_loop(engine_queues.active_workflows(exp_id)) == []
    assert sum(bool((w.attributes or {}).get(REFUSED)) for w in _workflows(exp_id)) >= 1
    # The admissions were not recorded as the cells' steps: a recovered cell asks again.
    from dbos import DBOS

    assert all(DBOS.list_workflow_steps(w.workflow_id) == [] for w in _workflows(exp_id))
    # A Resume without a budget continues under the kept one: nothing more fits.
    again = _run(store, exp_id, concurrency=3)
    assert again[-1]["status"] == "stopped" and again[-1].get("budget_reached") is True
    assert len([c for c in store.cell_outcomes(exp_id) if c.run_id]) == 2
    # A larger budget at Resume runs the rest, each cell once.
    done = _run(store, exp_id, concurrency=3, budget=Budget(Decimal(1000), OVERRIDES))
    assert done[-1]["status"] == "finished" and done[-1].get("budget_reached") is False
    assert {c.status for c in store.cell_outcomes(exp_id)} == {"satisfied"}
    assert runs_per_thread(store, exp_id) == [1] * rows
    assert _spent(store) == rows * cell == Decimal(done[-1]["spent_usd"])


class RevisingServer(MeteredServer):
    """The first grading asks for a revision; every worker call after the first waits at
    ``gate``, so the first cell stays in flight on its second pass with its first one spent."""

    def __init__(self) -> None:
        self.worker_calls = self.grader_calls = 0
        super().__init__()

    def respond(self, body: dict[str, Any]) -> Reply:
        with self._count:
            grader = _is_grader(body)
            if grader:
                self.grader_calls += 1
            else:
                self.worker_calls += 1
            first = self.grader_calls == 1 if grader else self.worker_calls == 1
        if grader:
            return verdict("needs_revision", ("c1",)) if first else verdict("satisfied")
        if first:
            return text("draft")
        return super().respond(body)


def test_a_cell_in_flight_holds_only_what_it_has_not_spent_yet(engine_store: Store) -> None:
    """A cell's finished pass is both spent and part of its hold: counted twice, the next cell
    would be refused on a budget that affords it (3 passes' worth counted as 5)."""
    store, rows = engine_store, 2
    with RevisingServer() as server:
        data = "prompt\n" + "".join(f"write note {i}\n" for i in range(rows))
        config = ExperimentConfig(worker_model=W, grader_model=G, rubric=RUBRIC,
                                  max_iterations=2, base_url=server.base_url)
        exp_id = create_experiment(store, parse_dataset(data, name="rows"),
                                   [config]).experiment_id
        each = first_estimate(config, Prices(OVERRIDES))  # two passes
        assert each is not None
        limit = 2 * each + Decimal("0.01")  # both cells fit, whatever they cost
        server.gate.clear()
        events: list[Any] = []
        driver = threading.Thread(target=lambda: events.extend(
            _run(store, exp_id, concurrency=1, budget=Budget(limit, OVERRIDES))))
        driver.start()
        try:
            # The first cell: its first pass graded and recorded, its second at the server.
            _wait_for(lambda: server.waiting == 1, "the first cell's second pass")
            _wait_for(lambda: _spent(store) > 0, "the first pass's calls recorded")
            _on_loop(engine_queues.register_queue(exp_id, concurrency=2))

            def second_decided() -> bool:
                return server.waiting > 1 or any(
                    (w.attributes or {}).get(REFUSED) for w in _workflows(exp_id))

            _wait_for(second_decided, "the second cell to start or be refused")
        finally:
            server.gate.set()
            driver.join(DEADLINE_S)
        assert not driver.is_alive()
        assert not any((w.attributes or {}).get(REFUSED) for w in _workflows(exp_id)), (
            "the second cell was refused while the budget afforded it")
        assert events[-1]["status"] == "finished" and events[-1].get("budget_reached") is False
        assert {c.status for c in store.cell_outcomes(exp_id)} == {"satisfied"}
        assert _spent(store) == Decimal(events[-1]["spent_usd"]) <= limit


def test_an_unknown_price_is_refused_before_anything_is_queued(
        engine_store: Store, server: MeteredServer) -> None:
    store = engine_store
    exp_id = _experiment(store, server, 2)
    with pytest.raises(BudgetError, match="no known price for openai-compatible:w"):
        _run(store, exp_id, budget=Budget(Decimal(5)))
    assert all(c.run_id is None for c in store.cell_outcomes(exp_id))
    assert server.requests == []


def test_eval_max_cost_on_the_engine_stops_and_resumes(tmp_path: Path, server: MeteredServer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rubric_core.cli import main

    rows, cell = 5, _cell_cost()
    data = tmp_path / "rows.csv"
    data.write_text("id,prompt\n" + "".join(f"r{i},write note {i}\n" for i in range(rows)),
                    encoding="utf-8")
    db = str(tmp_path / "runs.sqlite3")
    config = f"worker={W},grader={G},cap=1,base_url={server.base_url}"
    base = ["eval", "--dataset", str(data), "--rubric", RUBRIC, "--db", db, "--config", config,
            "--concurrency", "2"]
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main([*base, "--max-cost", "5"], out=io.StringIO()) == 2
        assert "no known price for openai-compatible:w" in err.getvalue()
        out = io.StringIO()
        code = main([*base, "--price", W_PRICE, "--price", G_PRICE, "--max-cost",
                     str(2 * cell + Decimal("0.01"))], out=out)
        assert code == 1, out.getvalue()  # not every cell ended
        assert "budget reached:" in out.getvalue()
        with Store(db) as store:
            [experiment] = store.list_experiments()
            assert _spent(store) == 2 * cell
        shutdown_engine()
        out = io.StringIO()
        code = main(["eval", "--resume", experiment.experiment_id, "--db", db,
                     "--price", W_PRICE, "--price", G_PRICE, "--max-cost", "1000"], out=out)
        assert code == 0, out.getvalue()
        with Store(db) as store:
            assert {c.status for c in store.cell_outcomes(experiment.experiment_id)} == {
                "satisfied"}
            assert _spent(store) == rows * cell
    finally:
        shutdown_engine()


def test_two_workers_hold_back_each_others_cells_in_flight(pg_url: str,
                                                           server: MeteredServer) -> None:
    """Worker A holds the one cell the budget affords, in flight at the server; worker B then
    dequeues another. Counting only its own cells in flight (the old lease queue's way), B would
    start it and the experiment would spend two cells on a budget of one."""
    rows, cell = 4, _cell_cost()
    limit = cell + Decimal("0.01")
    workers: list[Any] = []
    try:
        with Store(pg_url) as store:
            exp_id = _experiment(store, server, rows)
            store.set_experiment_budget(exp_id, Budget(limit, OVERRIDES).to_dict())
            launch_engine(store, every_queue=False)  # this process queues cells, runs none
            cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]

            async def queue_cells(concurrency: int) -> None:
                await engine_queues.register_queue(exp_id, concurrency=concurrency)
                await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)

            server.gate.clear()
            _on_loop(queue_cells(1))
            workers.append(a := _worker(pg_url))
            _wait_for(lambda: server.waiting == 1, "worker A's cell at the server")
            os.kill(a.pid, signal.SIGSTOP)  # A takes nothing more; its cell stays in flight
            try:
                _on_loop(queue_cells(2))  # room for a second cell: only B can take it
                workers.append(_worker(pg_url))

                def b_decided() -> bool:
                    return server.waiting > 1 or any(
                        (w.attributes or {}).get(REFUSED) for w in _workflows(exp_id))

                _wait_for(b_decided, "worker B to start or refuse a second cell")
            finally:
                os.kill(a.pid, signal.SIGCONT)
                server.gate.set()
            assert server.peak_waiting == 1, "a second cell started while the first ran"
            _wait_for(lambda: not _on_loop(engine_queues.active_workflows(exp_id)),
                      "every cell to end or be cancelled")
            ran = [c for c in store.cell_outcomes(exp_id) if c.run_id is not None]
            assert [c.status for c in ran] == ["satisfied"]
            assert _spent(store) == cell <= limit
            statuses = sorted(w.status for w in _workflows(exp_id))
            # A's cell ended, B's was refused unstarted, the rest were cancelled in the queue.
            assert statuses == ["CANCELLED"] * (rows - 2) + ["SUCCESS"] * 2

            # A Resume with a larger budget, the two workers still running: every cell once.
            events = _run(store, exp_id, concurrency=3, budget=Budget(Decimal(1000), OVERRIDES))
            assert events[-1]["status"] == "finished"
            assert events[-1].get("budget_reached") is False
            assert {c.status for c in store.cell_outcomes(exp_id)} == {"satisfied"}
            assert runs_per_thread(store, exp_id) == [1] * rows
            assert _spent(store) == rows * cell
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        shutdown_engine()


def test_two_workers_asking_at_once_admit_the_last_affordable_cell_once(
        pg_url: str, server: MeteredServer) -> None:
    """Both workers dequeue a cell while the experiment's admission lock is held (here, by the
    test), so both ask at the same moment once it is released: one cell is admitted, the
    other sees its hold and is refused."""
    rows, cell = 3, _cell_cost()
    limit = cell + Decimal("0.01")
    workers: list[Any] = []
    release = threading.Event()
    try:
        with Store(pg_url) as store:
            exp_id = _experiment(store, server, rows)
            store.set_experiment_budget(exp_id, Budget(limit, OVERRIDES).to_dict())
            store.saver()  # the checkpoint tables exist: their creation waits for open locks
            launch_engine(store, every_queue=False)  # this process queues cells, runs none
            cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]
            holding = threading.Event()

            def hold_the_lock() -> None:
                with store._connect(write=True) as tx:
                    tx.lock(LOCK_PREFIX + exp_id)
                    holding.set()
                    release.wait(DEADLINE_S)

            holder = threading.Thread(target=hold_the_lock)
            holder.start()
            assert holding.wait(DEADLINE_S)

            async def queue_cells() -> None:
                from dbos import DBOS

                # One cell per worker at a time: each of the two takes one of the two slots.
                await DBOS.register_queue_async(
                    engine_queues.queue_name(exp_id), global_concurrency=2,
                    worker_concurrency=1, polling_interval_sec=engine_queues.POLL_S,
                    on_conflict="always_update")
                await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)

            server.gate.clear()
            _on_loop(queue_cells())
            workers.extend([_worker(pg_url), _worker(pg_url)])

            def waiting_for_the_lock() -> int:
                with store._connect() as conn:
                    return int(conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted").fetchone()["count"])

            _wait_for(lambda: waiting_for_the_lock() == 2, "both workers to ask at once")
            release.set()
            holder.join(timeout=DEADLINE_S)
            _wait_for(lambda: server.waiting == 1 and any(
                (w.attributes or {}).get(REFUSED) for w in _workflows(exp_id)),
                "one cell admitted and the other refused")
            server.gate.set()
            _wait_for(lambda: not _on_loop(engine_queues.active_workflows(exp_id)),
                      "every cell to end or be cancelled")
            assert server.peak_waiting == 1
            assert [c.status for c in store.cell_outcomes(exp_id) if c.run_id] == ["satisfied"]
            assert _spent(store) == cell <= limit
            statuses = sorted(w.status for w in _workflows(exp_id))
            assert statuses == ["CANCELLED"] * (rows - 2) + ["SUCCESS"] * 2
    finally:
        release.set()
        server.gate.set()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        shutdown_engine()
