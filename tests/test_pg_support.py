"""The throwaway PostgreSQL server the test command starts: real, and enough for LangGraph."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from pg_support import postgres_server
from psycopg.rows import dict_row

TESTS = Path(__file__).resolve().parent


def test_a_fresh_cluster_serves_sql_and_langgraph_s_saver() -> None:
    with postgres_server() as url:
        assert url.startswith("postgresql://postgres@127.0.0.1:")
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            version = conn.execute("show server_version").fetchone()
            assert version is not None and int(str(version[0]).split(".")[0]) >= 13
        # The saver's documented setup: autocommit and dict rows; setup() creates its tables.
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            saver = PostgresSaver(conn)
            saver.setup()
            tables = {r["tablename"] for r in conn.execute(
                "select tablename from pg_tables where schemaname = 'public'")}
            assert {"checkpoints", "checkpoint_writes"} <= tables
    # stopped: nothing listens on that port any more
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert not _listening(port)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_killed_test_process_leaves_no_server_running_nor_its_files() -> None:
    # A test run killed (SIGKILL, a CI timeout, a SIGTERM) runs no clean-up of its own: the
    # cluster's watcher stops the server and deletes its directory.
    script = ("import sys, time\n"
              f"sys.path.insert(0, {str(TESTS)!r})\n"
              "from pg_support import postgres_cluster\n"
              "with postgres_cluster() as cluster:\n"
              "    print(cluster.port, cluster.root, flush=True)\n"
              "    time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert owner.stdout is not None
        port_text, root_text = owner.stdout.readline().split()
        port, root = int(port_text), Path(root_text)
        assert _listening(port) and root.is_dir()
    finally:
        os.killpg(owner.pid, signal.SIGKILL)  # its whole group, as a terminal's kill would
        owner.wait()
    deadline = time.monotonic() + 60
    while _listening(port) or root.exists():
        assert time.monotonic() < deadline, "the cluster outlived its test process"
        time.sleep(0.1)
