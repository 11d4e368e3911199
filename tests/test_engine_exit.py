"""A process whose PostgreSQL database is gone for good exits once it stops its engine.

DBOS 3.4.0 retries a write that lost its database without end, on its pool's threads, which
the interpreter joins at exit: a CI run once hung an hour after its last test, three such
threads retrying against the stopped servers of outage tests. `shutdown_engine` now makes
those writes give up at their next try, and so does the interpreter's exit when the engine was
never stopped (a CLI's last step). Real server (stopped for good mid re-grade), real engine,
real process exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

SCRIPT = r"""
import sys, threading, time
from openai_server import DelayedServer, verdict
from pg_support import create_database, postgres_cluster
from rubric_core.engine import shutdown_engine
from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
from rubric_core.store import Store, _postgres

_postgres._POOL_TIMEOUT_S = 2.0  # a write waits this long for a connection (30 s by default)


def retrying() -> int:
    # DBOS's retry loop sleeping between tries: the innermost Python frame is its wrapper.
    return sum(f.f_code.co_name == "wrapper" and f.f_code.co_filename.endswith("_sys_db.py")
               for f in sys._current_frames().values())


server = DelayedServer(0.3, verdict("satisfied", (), ("answers the question",)))
with postgres_cluster() as cluster, server.fake:
    store = Store(create_database(cluster.url)).open()
    answers = parse_answers("id,request,answer\n" + "".join(
        f"q{i},question {i},reply {i}\n" for i in range(40)), name="qa")
    job_id = create_regrade(store, answers, [GraderConfig(
        rubric="- answers the question", grader_model="openai-compatible:g",
        base_url=server.fake.base_url)]).job_id
    thread = threading.Thread(target=lambda: list(run_regrade(store, job_id, concurrency=4)),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(server.fake.requests) < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    cluster.stop()  # for good
    deadline = time.monotonic() + 60
    while not retrying() and time.monotonic() < deadline:
        time.sleep(0.1)
    print("retrying", retrying(), flush=True)
    thread.join(120)
    if sys.argv[1] == "stop":
        shutdown_engine(settle_s=1.0)
    print("stopped", flush=True)
"""


@pytest.mark.parametrize("how", ["stop", "exit"],
                         ids=["stopping_its_engine", "exiting_with_its_engine_launched"])
def test_a_process_whose_database_is_gone_for_good_exits(how: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, how], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        said = [process.stdout.readline().split() for _ in range(2)]
        stopped = time.monotonic()
        assert said[0][:1] == ["retrying"] and int(said[0][1]) > 0, (
            f"no DBOS write was retrying against the stopped server: {said}")
        assert said[1] == ["stopped"], said
        # A retry sleeps at most a few seconds this early in an outage; forever without the fix.
        code = process.wait(timeout=45)
        print(f"exited {time.monotonic() - stopped:.1f} s after its last step ({how})")
        assert code == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
