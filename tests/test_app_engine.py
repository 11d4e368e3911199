"""The Experiments page on the queue engine (DBOS queues, preview), driven with AppTest: an
experiment run on the engine with its concurrency and rate limit, the queue state shown after
it, Stop (the queued cells are cancelled) and Resume (queued again, every cell once), Stop of an
experiment another driver runs, and a budget kept with an experiment on the engine.

Real parts only: DBOS 3.4.0 on a SQLite file beside the app's database, chat models talking
HTTP to a loopback OpenAI-compatible server (`openai_server.DelayedServer`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import DelayedServer, verdict
from streamlit.testing.v1 import AppTest
from test_app import navigation_routing as navigation_routing
from test_experiments import runs_per_thread

from rubric_core import app_support as sup
from rubric_core.datasets import parse_dataset
from rubric_core.engine import engine_database, shutdown_engine
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from openai_server import Reply

ROOT = Path(__file__).resolve().parents[1]
CRITERION = "answers the question"
ROWS = 6




@pytest.fixture(autouse=True)
def engine_stopped() -> Iterator[None]:
    """The app's engine (launched by the page on the test's database) is stopped afterwards."""
    yield
    shutdown_engine()


def _texts(elements: Any) -> str:
    return "\n".join(str(e.value) for e in elements)


def _app(db: Path, server: DelayedServer, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """The Experiments page with a dataset of `ROWS` questions and one configuration on the
    loopback server, on the DBOS queues: 2 cells at once, at most 1,000 started a second."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    with Store(db) as store:
        store.save_dataset(parse_dataset(
            "prompt\n" + "".join(f"question {i}\n" for i in range(ROWS)), name="q"))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.session_state["db_path"] = str(db)
    at.session_state["base_url"] = server.fake.base_url
    # Typed model names (accept_new_options) arrive through session state, as the browser
    # sends them.
    at.session_state[sup.config_key(0, "worker")] = "openai-compatible:w"
    at.session_state[sup.config_key(0, "grader")] = "openai-compatible:g"
    at.session_state["exp_rubric"] = f"- {CRITERION}"
    at.run()
    at.switch_page("pages/experiments.py").run()
    assert not at.exception, at.exception
    at.number_input(key="exp_concurrency").set_value(2).run()
    at.number_input(key="exp_rate_cells").set_value(1000).run()
    at.selectbox(key="exp_rate_per").set_value("second").run()
    assert not at.exception, at.exception
    return at


def _queue_caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if " queued · " in str(c.value))


def test_the_page_runs_an_experiment_on_the_engine_and_shows_its_queue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = DelayedServer(delay_s=0.05, grader_reply=verdict("satisfied", (), (CRITERION,)))
    db = tmp_path / "app.sqlite3"
    with server.fake:
        at = _app(db, server, monkeypatch)
        # Before any experiment ran on the engine: the engine's tables do not exist yet.
        assert not Path(engine_database(str(db)).removeprefix("sqlite:///")).exists()
        at.button(key="exp_start").click().run()
        assert not at.exception, at.exception
    assert not at.error, _texts(at.error)
    assert "Experiment finished" in _texts(at.success)
    assert _queue_caption(at) == f"0 queued · 0 running · {ROWS} done · 0 cancelled"
    # The table of workers drawn while cells ran is gone with them.
    assert "No cell is running on any worker." in _texts(at.caption)
    assert not [t for t in at.table if "worker" in t.value.columns]
    with Store(db) as store:
        experiment = store.list_experiments()[0]
        assert [c.status for c in store.experiment_cells(experiment.experiment_id)] == [
            "satisfied"] * ROWS
        assert runs_per_thread(store, experiment.experiment_id) == [1] * ROWS
    assert server.peak <= 2  # the experiment's concurrency is the queue's limit
    # The engine ran it: its tables are in the sibling file.
    assert Path(engine_database(str(db)).removeprefix("sqlite:///")).is_file()
    # The rerun of a click (here: picking the Grid tab again) still shows the queue.
    at.run()
    assert _queue_caption(at) == f"0 queued · 0 running · {ROWS} done · 0 cancelled"


class StoppingServer(DelayedServer):
    """Presses Stop (what the page's Stop button calls) when the third request arrives."""

    def __init__(self, db: Path) -> None:
        super().__init__(delay_s=0.2, grader_reply=verdict("satisfied", (), (CRITERION,)))
        self.db, self.requests, self.stopped = db, 0, threading.Event()
        self._count = threading.Lock()

    def respond(self, body: dict[str, Any]) -> Reply:
        with self._count:
            self.requests += 1
            press = self.requests == 3
        if press:
            with Store(self.db) as store:
                exp_id = store.list_experiments()[0].experiment_id
            assert sup.stop_experiment(exp_id)
            self.stopped.set()
        return super().respond(body)


def test_stop_cancels_the_queued_cells_and_resume_queues_them_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "app.sqlite3"
    server = StoppingServer(db)
    with server.fake:
        at = _app(db, server, monkeypatch)
        at.button(key="exp_start").click().run()
        assert not at.exception, at.exception
        assert server.stopped.is_set()
        assert "Experiment stopped" in _texts(at.success)
        queued, running, done, cancelled = (
            int(part.split()[0]) for part in _queue_caption(at).split(" · "))
        assert (queued, running) == (0, 0)
        assert cancelled >= ROWS - 2 - done > 0  # the cells not started never start
        with Store(db) as store:
            exp_id = store.list_experiments()[0].experiment_id
            assert store.get_experiment(exp_id).status == "stopped"
        at.run()  # a later click: Resume is offered on the engine
        assert "Resume: " in _texts(at.caption)
        resume = at.button(key="exp_resume")
        assert not resume.disabled
        resume.click().run()
        assert not at.exception, at.exception
    assert "Experiment finished" in _texts(at.success)
    assert _queue_caption(at) == f"0 queued · 0 running · {ROWS} done · 0 cancelled"
    with Store(db) as store:
        assert [c.status for c in store.experiment_cells(exp_id)] == ["satisfied"] * ROWS
        assert runs_per_thread(store, exp_id) == [1] * ROWS  # continued, never run twice


def test_a_budget_is_kept_with_an_experiment_on_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = DelayedServer(delay_s=0.0, grader_reply=verdict("satisfied", (), (CRITERION,)))
    db = tmp_path / "app.sqlite3"
    with server.fake:
        at = _app(db, server, monkeypatch)
        at.session_state["exp_budget"] = 5.0
        at.session_state["exp_allow_unknown"] = True  # the loopback models have no price
        at.run()
        assert not at.error, _texts(at.error)
        at.button(key="exp_start").click().run()
        assert not at.exception, at.exception
        assert "Experiment finished" in _texts(at.success)
        assert at.number_input(key="exp_rate_cells").value == 1000
    assert not at.exception
    with Store(db) as store:
        (experiment,) = store.list_experiments()
        assert experiment.budget is not None and float(experiment.budget["max_usd"]) == 5.0
        assert [c.status for c in store.experiment_cells(experiment.experiment_id)] == [
            "satisfied"] * ROWS


class GatedServer(DelayedServer):
    """Every call waits until `gate` is set; `arrived` is set by the first."""

    def __init__(self) -> None:
        super().__init__(delay_s=0.0, grader_reply=verdict("satisfied", (), (CRITERION,)))
        self.gate, self.arrived = threading.Event(), threading.Event()

    def respond(self, body: dict[str, Any]) -> Reply:
        self.arrived.set()
        self.gate.wait(timeout=120)  # bounded: a failed test leaves no thread waiting for ever
        return super().respond(body)


def test_stop_reaches_an_experiment_another_driver_runs_on_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "app.sqlite3"
    server = GatedServer()
    events: list[Any] = []
    with server.fake:
        at = _app(db, server, monkeypatch)
        with Store(db) as store:
            config = ExperimentConfig(worker_model="openai-compatible:w",
                                      grader_model="openai-compatible:g",
                                      rubric=f"- {CRITERION}", base_url=server.fake.base_url)
            dataset, _ = store.load_dataset("q")
            exp_id = create_experiment(store, dataset, [config]).experiment_id

        def drive() -> None:  # as `eval` would, outside the page's registry
            backoff = SharedBackoff()
            with Store(db) as own:
                events.extend(run_experiment(
                    own, exp_id, concurrency=2, backoff=backoff,
                    models=experiment_models(backoff, api_key="test-key")))

        driver = threading.Thread(target=drive)
        driver.start()
        try:
            assert server.arrived.wait(timeout=60), "no cell started"
            at.run()
            assert not at.exception, at.exception
            assert not [b for b in at.button if b.key == "exp_stop"]
            assert at.button(key="exp_resume").disabled  # it runs: Stop it first
            at.button(key="exp_stop_engine").click().run()
            assert not at.exception, at.exception
            assert (f"Stopped on the DBOS queues: {ROWS} queued or running cell(s) cancelled"
                    in _texts(at.success))
        finally:
            server.gate.set()
            driver.join(timeout=60)
        assert not driver.is_alive(), "the driver did not end after its cells were cancelled"
        assert events[-1]["type"] == "experiment_finished"
        assert events[-1]["status"] == "stopped"
        at.run()
        queued, running, done, cancelled = (
            int(part.split()[0]) for part in _queue_caption(at).split(" · "))
        with Store(db) as store:
            ended = [c for c in store.experiment_cells(exp_id) if c.status == "satisfied"]
        # At most the two running cells ended anyway (their step ended them before their
        # process saw the cancellation): they count done, the others cancelled.
        assert (queued, running, done, cancelled) == (0, 0, len(ended), ROWS - len(ended))
        assert len(ended) <= 2
        resume = at.button(key="exp_resume")
        assert not resume.disabled
        resume.click().run()
        assert not at.exception, at.exception
    assert _queue_caption(at) == f"0 queued · 0 running · {ROWS} done · 0 cancelled"
    with Store(db) as store:
        assert [c.status for c in store.experiment_cells(exp_id)] == ["satisfied"] * ROWS
        assert runs_per_thread(store, exp_id) == [1] * ROWS


def test_a_database_restart_mid_experiment_is_said_once_on_the_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 37, 2: what `eval` says of a lost database, the page says too, once; Resume ends
    # every cell once the database is back.
    from pg_support import create_database, postgres_cluster, writes_held

    server = DelayedServer(delay_s=0.2, passes=2,
                           grader_reply=verdict("satisfied", (), (CRITERION,)))
    with postgres_cluster() as cluster, server.fake:
        url = create_database(cluster.url)
        at = _app(url, server, monkeypatch)  # type: ignore[arg-type]  # a URL, as the sidebar's
        at.number_input(key="exp_concurrency").set_value(4).run()
        restarted: list[BaseException | None] = []

        def restart() -> None:  # with four cells writing, as the page runs them
            try:
                deadline = time.monotonic() + 120
                while server.in_flight < 4 and time.monotonic() < deadline:
                    time.sleep(0.02)
                with writes_held(url, "runs", waiting=4):
                    cluster.restart("fast")
                restarted.append(None)
            except BaseException as exc:  # raised again on the test's thread
                restarted.append(exc)

        outage = threading.Thread(target=restart)
        outage.start()
        try:
            at.button(key="exp_start").click().run(timeout=240)
        finally:
            outage.join(timeout=240)
        assert restarted == [None], restarted
        assert not at.exception, at.exception
        assert not at.error, _texts(at.error)
        said = [w for w in _texts(at.warning).splitlines() if "The database went away" in w]
        assert len(said) == 1, _texts(at.warning)
        assert "nothing was half-written" in said[0] and "press Resume" in said[0]
        assert "Experiment stopped" not in _texts(at.success)
        with Store(url) as store:
            exp_id = store.list_experiments()[0].experiment_id
        at.run()  # the page as drawn once the experiment stopped
        assert not at.exception, at.exception
        at.button(key="exp_resume").click().run(timeout=240)
        assert not at.exception, at.exception
        assert "Experiment finished" in _texts(at.success)
        with Store(url) as store:
            assert [c.status for c in store.experiment_cells(exp_id)] == ["satisfied"] * ROWS
            assert runs_per_thread(store, exp_id) == [1] * ROWS
