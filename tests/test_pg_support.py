"""The throwaway PostgreSQL server the test command starts: real, and enough for LangGraph."""

from __future__ import annotations

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from pg_support import postgres_server
from psycopg.rows import dict_row


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
    import socket

    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
