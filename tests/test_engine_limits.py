"""Per-model limits on the queue engine, over every process: a model's cells at once and its
cells started per period hold on PostgreSQL with worker processes; Stop reaches the cells'
levels on model queues; enqueuing again queues nothing twice; kill -9 of a worker loses or
repeats no cell; bad ``--rate-limit`` values are refused.

Real parts only: the throwaway PostgreSQL cluster (`pg_url`), ``rubric-studio worker``
processes, and a loopback OpenAI-compatible server that counts, per model, the cells it is
serving at once (from each cell's first request to its last answer) and when each cell's
first request came.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import DelayedServer, verdict
from test_engine_workers import _worker
from test_experiments import runs_per_thread

from rubric_core.background import work_loop
from rubric_core.datasets import parse_dataset
from rubric_core.engine import launch_engine, shutdown_engine
from rubric_core.engine import queues as engine_queues
from rubric_core.engine.runtime import gate_id
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRITERION = "answers the question"
W, X, G = "openai-compatible:w", "openai-compatible:x", "openai-compatible:g"


class ModelServer(DelayedServer):
    """A `DelayedServer` that keeps, per model and cell (the row's question), when the cell's
    first request came and when its last answer was ready."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s, verdict("satisfied", (), (CRITERION,)), passes=2)
        self.spans: dict[tuple[str, str], list[float]] = {}  # (model, question) -> [first, last]
        self.firsts: dict[str, list[float]] = {}  # model -> its cells' first requests (Unix s)

    def respond(self, body: dict[str, Any]) -> Any:
        """Record the cell's span on the worker model, then answer as `DelayedServer`."""
        messages = body.get("messages") or []
        question = next((m["content"] for m in messages if m.get("role") == "user"), "")
        tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        worker = "GraderResponse" not in tools
        key = (body["model"], str(question))
        now = time.monotonic()
        with self._lock:
            if worker and key not in self.spans:
                self.spans[key] = [now, now]
                self.firsts.setdefault(body["model"], []).append(time.time())
        try:
            return super().respond(body)
        finally:
            with self._lock:
                if worker:
                    self.spans[key][1] = time.monotonic()

    def most_at_once(self, *models: str) -> int:
        """The most cells of these worker models the server was serving at once."""
        edges = sorted(edge for (model, _), (first, last) in self.spans.items()
                       if model in models for edge in ((first, 1), (last, -1)))
        at_once = peak = 0
        for _, change in edges:
            at_once += change
            peak = max(peak, at_once)
        return peak


@pytest.fixture(autouse=True)
def engine_stopped(pg_url: str) -> Iterator[None]:
    """The engine launched on ``pg_url`` is stopped before that database is dropped."""
    yield
    shutdown_engine()


def _on_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, work_loop()).result(timeout=60)


def _experiment(store: Store, server: ModelServer, rows: int, workers: tuple[str, ...]) -> str:
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
    configs = [ExperimentConfig(worker_model=w, grader_model=G, rubric=f"- {CRITERION}",
                                base_url=server.fake.base_url) for w in workers]
    return create_experiment(store, parse_dataset(data, name="q"), configs).experiment_id


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _events(store: Store, experiment_id: str, **kwargs: Any) -> Iterator[Any]:
    backoff = SharedBackoff()
    return run_experiment(store, experiment_id, backoff=backoff,
                          models=experiment_models(backoff, api_key="test-key"), **kwargs)


def _drive(store: Store, experiment_id: str, events: list[Any], failure: list[BaseException],
           **kwargs: Any) -> None:
    try:
        events.extend(_events(store, experiment_id, **kwargs))
    except BaseException as exc:  # raised again on the test's thread
        failure.append(exc)


def _owners_of(store: Store, experiment_id: str, config_index: int) -> set[str]:
    """The processes (pids) whose runs ended the configuration's cells."""
    return {c.run.owner.split(":")[1] for c in store.experiment_cells(experiment_id)
            if c.config_index == config_index and c.run is not None and c.run.owner}


def _workflows(prefix: str) -> list[Any]:
    from dbos import DBOS

    return DBOS.list_workflows(workflow_id_prefix=prefix, load_input=False, load_output=False)


def assert_rate_held(started: list[Any], firsts: list[float], rows: int, limit: int,
                     period: float) -> None:
    """At most ``limit`` of ``started`` (workflows) were dequeued per ``period``, by DBOS's
    dequeue times and by the server's first requests of their cells (``firsts``)."""
    starts = sorted((w.dequeued_at or 0) / 1000 for w in started)
    assert len(starts) == rows
    for i in range(len(starts) - limit):
        assert starts[i + limit] - starts[i] >= period - 0.01, starts
    # The server saw it too: the i-th cell it saw came no earlier than the limiter let the
    # i-th through (each cell's first request follows its start; same clock as DBOS's).
    firsts = sorted(firsts)
    assert len(firsts) == rows
    for i, first in enumerate(firsts):
        assert first >= starts[0] + (i // limit) * period - 0.05, (firsts, starts)


@pytest.mark.parametrize("workers", [
    pytest.param((W,), id="one_limited_model_partitions"),
    pytest.param((W, X), id="a_model_queue_beside_an_unlimited_model")])
def test_a_model_limit_holds_over_every_process(pg_url: str, workers: tuple[str, ...]) -> None:
    """Model w at most 2 cells at once over this process and two workers; with model x beside
    it, the experiment's limit (8) lets x's cells run beside w's."""
    rows, limit = 10, 2
    server = ModelServer(delay_s=0.2)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, workers)
        procs = [_worker(pg_url), _worker(pg_url)]
        events: list[Any] = []
        failure: list[BaseException] = []
        try:
            _drive(store, exp_id, events, failure, concurrency=8, per_model={W: limit})
        finally:
            for proc in procs:
                _stop(proc)
        if failure:
            raise failure[0]
        assert events[-1]["status"] == "finished"
        assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
        cells = len(workers) * rows
        assert runs_per_thread(store, exp_id) == [1] * cells
        w_owners = _owners_of(store, exp_id, 0)
        levels = _workflows(engine_queues.gate_prefix(exp_id))
    assert len(w_owners) >= 2, w_owners  # model w's cells ran in several processes
    assert server.most_at_once("w") == limit
    if len(workers) > 1:
        assert len(levels) == rows  # w's cells passed w's queue, x's none
        assert server.most_at_once("w", "x") > limit  # the experiment's own limit is higher
    else:
        assert levels == []  # the experiment's queue's partitions held the limit
    assert len(server.fake.requests) == cells * 4


@pytest.mark.parametrize("workers", [
    pytest.param((W,), id="one_limited_model_partitions"),
    pytest.param((W, X), id="a_model_queue_beside_an_unlimited_model")])
def test_a_model_rate_limit_holds(pg_url: str, workers: tuple[str, ...]) -> None:
    """Model w: at most 2 cells started per 4 s (counted by DBOS and by the server); model x's
    cells are not held back by it."""
    rows, limit, period = 6, 2, 4.0
    server = ModelServer(delay_s=0.05)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, workers)
        events = list(_events(store, exp_id, concurrency=2 * rows,
                              model_rates={W: (limit, period)}))
        assert events[-1]["status"] == "finished"
        assert runs_per_thread(store, exp_id) == [1] * (len(workers) * rows)
        levels = _workflows(engine_queues.gate_prefix(exp_id))
        cells = _workflows(engine_queues.id_prefix(exp_id))
    if len(workers) > 1:
        assert len(levels) == rows  # each cell of w passed its model's queue once; x none
        started = levels
    else:
        assert levels == []
        started = cells
    assert_rate_held(started, server.firsts["w"], rows, limit, period)
    if len(workers) > 1:
        # x's cells all started within w's first period (4 s: twice what a loaded machine
        # took); held back by w's limit, they would span two periods or more.
        xs = sorted(server.firsts["x"])
        assert xs[-1] - xs[0] < period, xs


def test_stop_cancels_cells_and_their_levels_and_resume_twice_queues_nothing_twice(
        pg_url: str) -> None:
    rows = 8
    server = ModelServer(delay_s=0.15)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, (W,))
        # Two limited models with limits of their own: a queue each, a cell passes both.
        events = _events(store, exp_id, concurrency=4, per_model={W: 1, G: 3})
        for event in events:
            if event["type"] == "cell_finished":
                break
        events.close()  # Stop: returns once this process's cells ended their step
        runs, requests = len(store.list_runs(limit=None)), len(server.fake.requests)
        assert store.get_experiment(exp_id).status == "stopped"  # type: ignore[union-attr]
        gates = _workflows(engine_queues.gate_prefix(exp_id))
        assert gates, "the cells passed no model queue"
        deadline = time.monotonic() + 20
        while any(w.status in engine_queues.ACTIVE
                  for w in _workflows(engine_queues.id_prefix(exp_id))
                  + _workflows(engine_queues.gate_prefix(exp_id))):
            assert time.monotonic() < deadline, "a cell or a level still queued after Stop"
            time.sleep(0.05)
        cancelled = [w for w in _workflows(engine_queues.gate_prefix(exp_id))
                     if w.status == "CANCELLED"]
        assert cancelled, "no level on the model queue was cancelled"
        # Nothing queued or running: nothing ran after Stop.
        assert len(store.list_runs(limit=None)) == runs
        assert len(server.fake.requests) == requests
        statuses = [c.status for c in store.experiment_cells(exp_id)]
        assert 1 <= statuses.count("satisfied") < rows and "running" not in statuses
        # A cell stopped after its first step resumes later, beside others: its span from the
        # first attempt to the second would overlap theirs. Spans are counted per session.
        assert server.most_at_once("w") == 1
        server.spans.clear()

        first = list(_events(store, exp_id, concurrency=4, per_model={W: 1, G: 3}))
        assert first[-1]["status"] == "finished"
        second = list(_events(store, exp_id, concurrency=4, per_model={W: 1, G: 3}))
        assert [e for e in second if e["type"] == "cell_finished"] == []
        assert second[-1]["status"] == "finished"
        assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
        assert runs_per_thread(store, exp_id) == [1] * rows
        cells = _workflows(engine_queues.id_prefix(exp_id))
        gates = _workflows(engine_queues.gate_prefix(exp_id))
    # Every cell: one workflow per attempt (a second only for a cell stopped); each level is
    # its cell workflow's own (cells cancelled while queued never reached theirs).
    assert rows <= len(cells) <= 2 * rows
    levels = {g.workflow_id for g in gates}
    assert levels <= {gate_id(w.workflow_id, n) for w in cells for n in (1, 2)}
    assert all({gate_id(w.workflow_id, 1), gate_id(w.workflow_id, 2)} <= levels
               for w in cells if w.status == "SUCCESS")
    assert len(server.fake.requests) == rows * 4  # stopped after a step: no call repeated
    assert server.most_at_once("w") == 1


def test_enqueuing_twice_with_model_queues_queues_nothing_twice(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # a cell run by no driver: the env's keys
    rows = 6
    server = ModelServer(delay_s=0.05)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, (W,))
        exp = store.get_experiment(exp_id)
        assert exp is not None
        launch_engine(store)
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]
        limits = {W: engine_queues.ModelLimit(concurrency=1), G: engine_queues.ModelLimit(
            rate=(100, 1.0))}
        route = engine_queues.routes(exp_id, exp.configurations, limits)
        # Two limited models in one cell: a queue each, passed in sorted order.
        assert route.partition is None and route.gates == [sorted(
            [engine_queues.model_queue_name(exp_id, W), engine_queues.model_queue_name(exp_id, G)])]

        async def enqueue_twice() -> list[dict[str, tuple[str, int, int]]]:
            await engine_queues.register_queue(exp_id, concurrency=3, route=route)
            return [await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False,
                                                      route=route)
                    for _ in range(2)]

        first, second = _on_loop(enqueue_twice())
        assert first == second and len(first) == rows
        deadline = time.monotonic() + 30
        while _on_loop(engine_queues.active_workflows(exp_id)):
            assert time.monotonic() < deadline, "the queued cells did not end"
            time.sleep(0.1)
        assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
        events = list(_events(store, exp_id, concurrency=3, per_model={W: 1}))
        assert [e for e in events if e["type"] == "cell_finished"] == []
        assert runs_per_thread(store, exp_id) == [1] * rows
        # Two levels per cell (w's queue, then g's), each once.
        assert len(_workflows(engine_queues.gate_prefix(exp_id))) == 2 * rows
        assert len(_workflows(engine_queues.id_prefix(exp_id))) == rows
    assert len(server.fake.requests) == rows * 4
    assert server.most_at_once("w") == 1


@pytest.mark.parametrize("workers", [
    pytest.param((W,), id="one_limited_model_partitions"),
    pytest.param((W, X), id="a_model_queue_beside_an_unlimited_model")])
def test_a_killed_worker_loses_and_repeats_no_cell_with_model_limits(
        pg_url: str, workers: tuple[str, ...]) -> None:
    """kill -9 of a worker mid-cell: recovery re-queues its cells (and, with a model queue,
    its cells' levels, which re-attach to their children): every cell ends exactly once."""
    rows, limit = 12 // len(workers), 2
    cells = rows * len(workers)
    server = ModelServer(delay_s=0.25)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, workers)
        worker = _worker(pg_url)
        events: list[Any] = []
        failure: list[BaseException] = []
        driver = threading.Thread(target=_drive, args=(store, exp_id, events, failure),
                                  kwargs={"concurrency": 4, "per_model": {W: limit}})
        try:
            driver.start()
            deadline = time.monotonic() + 40
            tag = f":{worker.pid}:"
            while time.monotonic() < deadline:  # until the worker ended a cell and runs one
                assert worker.poll() is None, worker.communicate()[0]
                runs = store.list_runs(limit=None)
                ended = sum(r.status == "satisfied" and tag in (r.owner or "") for r in runs)
                running = sum(r.status == "running" and tag in (r.owner or "") for r in runs)
                if ended >= 1 and running >= 1:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the worker never ran a cell while the driver ran others")
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
            driver.join(timeout=60)  # its sweep re-queues the dead worker's cells and levels
            assert not driver.is_alive(), "the experiment did not end after the worker died"
        finally:
            _stop(worker)
            driver.join(timeout=30)
        if failure:
            raise failure[0]
        assert events[-1]["status"] == "finished"
        assert [c.status for c in store.experiment_cells(exp_id)] == ["satisfied"] * cells
        assert runs_per_thread(store, exp_id) == [1] * cells
        levels = _workflows(engine_queues.gate_prefix(exp_id))
    assert len(levels) == (rows if len(workers) > 1 else 0)  # one level per cell of w, once
    assert server.most_at_once("w") <= limit
    # At most the killed worker's calls in flight were made again.
    assert cells * 4 <= len(server.fake.requests) <= cells * 4 + 4


def test_bad_rate_limits_are_refused(pg_url: str) -> None:
    from rubric_core.cli import main

    db = pg_url
    for argv, message in (
            (["--rate-limit", "unknownmodel=5/min"],
             "'unknownmodel', which no configuration of the experiment uses"),
            (["--rate-limit", "demo=5"], "expected N/PERIOD or MODEL=N/PERIOD"),
            (["--rate-limit", "demo=0/min"], "expected N/PERIOD or MODEL=N/PERIOD"),
            (["--rate-limit", "=5/min"], "a model before '='"),
            (["--rate-limit", "demo=5/fortnight"], "expected N/PERIOD or MODEL=N/PERIOD"),
            (["--rate-limit", "demo=5/min", "--rate-limit", "demo=6/min"],
             "a second rate limit for demo"),
            (["--rate-limit", "5/min", "--rate-limit", "6/min"],
             "a second rate limit for the experiment")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["eval", "--dataset", "bundled", "--db", db, *argv],
                        out=io.StringIO())
        assert code == 2, (argv, err.getvalue())
        assert message in err.getvalue(), err.getvalue()
    with Store(db) as store:
        assert store.list_experiments() == []  # refused before anything was stored
        exp = create_experiment(store, parse_dataset("prompt\nq\n", name="q"),
                                [ExperimentConfig(rubric=f"- {CRITERION}")])
        with pytest.raises(ValueError, match="'nope', which no configuration"):
            list(run_experiment(store, exp.experiment_id,
                                model_rates={"nope": (1, 1.0)}))
        with pytest.raises(ValueError, match="the rate limit of demo is a whole number"):
            list(run_experiment(store, exp.experiment_id,
                                model_rates={"demo": (0, 1.0)}))


def test_eval_takes_model_rate_and_concurrency_limits(tmp_path: Path) -> None:
    """The whole path on SQLite: ``--rate-limit demo=N/s`` and ``--model-limit demo=1``."""
    from rubric_core.cli import main

    db = str(tmp_path / "runs.sqlite3")
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--db", db,
                 "--concurrency", "8", "--model-limit", "demo=2", "--rate-limit", "demo=1000/s",
                 "--rate-limit", "1000/s"], out=out)
    assert code == 0, out.getvalue()
    assert "24/24 done, 100% satisfied" in out.getvalue()


def test_cells_queued_under_other_limits_are_queued_again_under_the_new_ones(
        pg_url: str) -> None:
    """A Resume with other model limits than the cells still queued (a killed driver's): the
    queued ones are cancelled and queued again the new way, once however often it is asked."""
    from dbos import DBOS

    rows = 3
    server = ModelServer(delay_s=0.05)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, (W,))
        exp = store.get_experiment(exp_id)
        assert exp is not None
        launch_engine(store, every_queue=False)  # listens to no queue: the cells stay queued
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]
        old = engine_queues.routes(exp_id, exp.configurations,
                                   {W: engine_queues.ModelLimit(concurrency=1)})
        new = engine_queues.routes(exp_id, exp.configurations, {})
        assert old.keys == [W] and new.keys == [None]

        async def enqueue(route: engine_queues.Routes) -> dict[str, tuple[str, int, int]]:
            await engine_queues.register_queue(exp_id, concurrency=2, route=route)
            return await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False,
                                                     route=route)

        first = _on_loop(enqueue(old))
        assert _on_loop(enqueue(old)) == first
        second = _on_loop(enqueue(new))
        assert set(second.values()) == set(first.values())
        assert not set(second) & set(first)  # each cell's next attempt
        assert _on_loop(enqueue(new)) == second
        statuses = {w.workflow_id: (w.status, w.queue_partition_key) for w in DBOS.list_workflows(
            workflow_id_prefix=engine_queues.id_prefix(exp_id), load_input=False,
            load_output=False)}
    assert {statuses[w] for w in first} == {("CANCELLED", W)}
    assert {statuses[w] for w in second} == {("ENQUEUED", None)}
