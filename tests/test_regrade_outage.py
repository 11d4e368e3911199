"""A PostgreSQL server stopped mid re-grade stops the re-grade with the error (what was
recorded stays), and a plain Resume once it is back grades the rest, each grading recorded
once. Real server, real engine (DBOS on the same database), loopback model server."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from openai_server import DelayedServer, verdict
from pg_support import create_database, postgres_cluster

from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
from rubric_core.store import Store, _postgres

if TYPE_CHECKING:
    import pytest

CRITERION = "answers the question"
COUNT = 40
CONCURRENCY = 4


def test_a_lost_database_stops_the_regrade_and_a_resume_finishes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rubric_core.engine import shutdown_engine

    # A write waits this long for a connection while the server is down (30 s by default).
    monkeypatch.setattr(_postgres, "_POOL_TIMEOUT_S", 2.0)
    server = DelayedServer(0.2, verdict("satisfied", (), (CRITERION,)))
    with postgres_cluster() as cluster, server.fake:
        url = create_database(cluster.url)
        store = Store(url).open()
        answers = parse_answers("id,request,answer\n" + "".join(
            f"q{i},question {i},reply {i}\n" for i in range(COUNT)), name="qa")
        job_id = create_regrade(store, answers, [GraderConfig(
            rubric=f"- {CRITERION}", grader_model="openai-compatible:g",
            base_url=server.fake.base_url)]).job_id
        events: list[Any] = []
        raised: list[BaseException] = []

        def run() -> None:
            try:
                events.extend(run_regrade(store, job_id, concurrency=CONCURRENCY))
            except Exception as exc:  # the lost database, said to the caller
                raised.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 60
        while len(server.fake.requests) < 2 * CONCURRENCY and time.monotonic() < deadline:
            time.sleep(0.02)
        cluster.stop()  # as a crash would
        went = time.monotonic()
        thread.join(timeout=120)
        print(f"the re-grade stopped {time.monotonic() - went:.1f} s after its database went")
        assert not thread.is_alive(), "the re-grade did not stop when its database went"
        assert raised or events[-1]["status"] == "stopped", events[-3:]
        cluster.start()
        store.close()
        with Store(url) as again:
            recorded = sum(n for n, _ in again.regrade_counts(job_id).values())
            assert recorded < COUNT  # the outage cut the re-grade
            calls = len(server.fake.requests)
            resumed = list(run_regrade(again, job_id, concurrency=CONCURRENCY))
            assert resumed[-1]["status"] == "finished"  # type: ignore[typeddict-item]
            assert again.regrade_counts(job_id) == {0: (COUNT, 0)}
            keys = {r.key for r in again.regrade_results(job_id)}
        # DBOS may still be retrying writes the outage cut (an item's end), sleeping between
        # tries: stopping the engine makes them give up (test_engine_exit).
        shutdown_engine()
    assert keys == {(0, f"q{i}", 0) for i in range(COUNT)}
    # The resume graded what was not recorded (a few graded while it went were lost).
    assert COUNT - recorded <= len(server.fake.requests) - calls <= COUNT - recorded + CONCURRENCY
