"""The PostgreSQL backend on a real server: a database is written only when it is ours, a URL is
never shown with its password, and every failure says what to do next.

The refusals mirror tests/test_store_integrity.py (SQLite files): each checks the database's
tables and rows before and after, and the message.
"""

from __future__ import annotations

import io
import sys
import time
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from pg_support import (
    create_database,
    database_holds,
    drop_database,
    free_port,
    postgres_cluster,
    scalar,
)
from psycopg.rows import dict_row

from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.redact import redact
from rubric_core.settings import ExperimentConfig
from rubric_core.store import (
    DB_ENV_VAR,
    SCHEMA_VERSION,
    Store,
    StoreError,
    _postgres,
    default_db_path,
    mask_url,
    shown_location,
)
from rubric_core.store._postgres import _PgTx

if TYPE_CHECKING:
    from pathlib import Path

_EVALUATION: Any = {
    "grading_run_id": "g", "iteration": 0, "result": "satisfied", "status": "satisfied",
    "explanation": "ok", "criteria": [{"name": "a", "passed": True}], "answer": "x",
}


def _snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of the public schema with all its rows, sorted: what "untouched" compares."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "ORDER BY table_name")]
        return {t: sorted(conn.execute(f'SELECT row_to_json(x)::text FROM "{t}" x').fetchall())
                for t in tables}


def _sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_new_database_becomes_ours_with_checkpoint_tables_on_first_use(pg_url: str) -> None:
    with Store(pg_url) as store:
        assert store.backend == "postgresql"
        assert "checkpoints" not in _snapshot(pg_url)  # the saver's tables wait for first use
        store.saver()
        tables = _snapshot(pg_url)
        meta = dict(psycopg.connect(pg_url).execute("SELECT key, value FROM meta").fetchall())
    assert {"meta", "runs", "evaluations", "labels", "experiment_cells", "checkpoints",
            "checkpoint_blobs", "checkpoint_writes"} <= set(tables)
    assert meta["app"] == "rubric-studio" and meta["schema_version"] == str(SCHEMA_VERSION)


@pytest.mark.parametrize(
    ("statements", "reason"),
    [
        pytest.param(["CREATE TABLE customers (id int PRIMARY KEY, name text)",
                      "INSERT INTO customers VALUES (1, 'Ada')"],
                     "no Rubric Studio meta table and its tables are 'customers'",
                     id="another_application_s_tables"),
        pytest.param(["CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)",
                      "INSERT INTO meta VALUES ('app', 'billing')"],
                     "its 'meta' table was not made by Rubric Studio",
                     id="another_application_s_meta"),
    ],
)
def test_foreign_database_is_refused_untouched(
    pg_url: str, statements: list[str], reason: str
) -> None:
    _sql(pg_url, *statements)
    before = _snapshot(pg_url)
    with pytest.raises(StoreError) as info:
        Store(pg_url).open()
    assert reason in str(info.value)
    assert "is not a Rubric Studio database" in str(info.value)
    assert "left untouched" in str(info.value) and DB_ENV_VAR in str(info.value)
    assert _snapshot(pg_url) == before


def test_newer_schema_is_refused_untouched(pg_url: str) -> None:
    with Store(pg_url) as store:
        store.create_run(prompt="p", rubric="- a")
    _sql(pg_url, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    before = _snapshot(pg_url)
    with pytest.raises(StoreError, match=rf"newer Rubric Studio \(schema 99; this version "
                                         rf"reads up to {SCHEMA_VERSION}\)"):
        Store(pg_url).open()
    assert _snapshot(pg_url) == before


def test_schema_5_database_is_upgraded_in_place(pg_url: str) -> None:
    with Store(pg_url) as store:
        run = store.create_run(title="Straße", prompt="p", rubric="- a")
    _sql(pg_url, "ALTER TABLE runs DROP COLUMN search_text",
         "UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    with Store(pg_url) as store:
        assert [r.run_id for r in store.list_runs(text="STRASSE")] == [run.run_id]
    snapshot = _snapshot(pg_url)
    assert '{"key":"schema_version","value":"' + str(SCHEMA_VERSION) + '"}' in str(
        snapshot["meta"])


def test_two_first_opens_at_once_both_succeed(pg_server: str) -> None:
    # Concurrent first uses once deadlocked in the saver's CREATE INDEX CONCURRENTLY (about one
    # round in six with four threads); several rounds on fresh databases make that visible.
    import threading

    for _ in range(5):
        url = create_database(pg_server)
        errors: list[BaseException] = []
        barrier = threading.Barrier(6)

        def open_one(url: str = url, errors: list[BaseException] = errors,
                     barrier: threading.Barrier = barrier) -> None:
            try:
                barrier.wait(timeout=10)
                with Store(url) as store:
                    store.saver()
            except BaseException as exc:  # collected: pytest does not see thread exceptions
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        try:
            assert errors == []
            assert not any(t.is_alive() for t in threads)
        finally:
            drop_database(url)


def test_a_saver_whose_tables_are_current_takes_no_lock(pg_url: str) -> None:
    # Behind PgBouncer in transaction mode a session advisory lock can outlive its client
    # (it stays on the server connection): once the tables exist, nobody may wait for it.
    with Store(pg_url) as store:
        store.saver()  # the first use creates LangGraph's tables
    with psycopg.connect(pg_url, autocommit=True) as stuck:
        stuck.execute("SELECT pg_advisory_lock(hashtextextended('rubric-studio:saver-setup', 0))")
        started = time.monotonic()
        with Store(pg_url) as store:
            store.saver().get_tuple({"configurable": {"thread_id": "t"}})
        assert time.monotonic() - started < 60  # waiting for the lock: 120 s, then an error


def test_password_is_masked_in_repr_location_and_errors() -> None:
    password = "pw-Do-Not-Show-7f3a"
    dead_port = free_port()  # nothing listens there
    url = f"postgresql://rubric:{password}@127.0.0.1:{dead_port}/rubric"
    store = Store(url)
    assert password not in repr(store) and password not in store.location
    assert store.location == f"postgresql://rubric:***@127.0.0.1:{dead_port}/rubric"
    assert str(store.path) == store.location
    with pytest.raises(StoreError) as info:
        store.open()
    message = str(info.value)
    assert password not in message and "rubric:***@" in message
    assert f"127.0.0.1:{dead_port}" in message and DB_ENV_VAR in message
    assert "Check that the server is running" in message
    assert redact(f"echoed {password}") == "echoed [redacted]"  # registered as a secret


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("postgresql://u:p%40ss@h:5/d", "postgresql://u:***@h:5/d", id="user_part"),
        pytest.param("postgres://u@h/d?password=secret&sslmode=require",
                     "postgres://u@h/d?password=***&sslmode=require", id="query_parameter"),
        pytest.param("postgresql://h/d", "postgresql://h/d", id="no_password"),
        # libpq ends the password at the first @ before any /: ? and # may stand in it.
        pytest.param("postgresql://u:pa?ss@h/d", "postgresql://u:***@h/d", id="raw_question"),
        pytest.param("postgresql://u:pa#ss@h/d", "postgresql://u:***@h/d", id="raw_hash"),
        pytest.param("postgresql://u:p@ss@h/d", "postgresql://u:***@h/d", id="raw_at"),
        pytest.param("postgresql://u@h/d?pass%77ord=s3cret", "postgresql://u@h/d?pass%77ord=***",
                     id="percent_encoded_key"),
        pytest.param("postgresql://u@h/d?sslpassword=keypass&sslmode=verify-full",
                     "postgresql://u@h/d?sslpassword=***&sslmode=verify-full",
                     id="ssl_key_password"),
        pytest.param("postgresql://u@h/d?password=a%26b&password=c",
                     "postgresql://u@h/d?password=***&password=***", id="twice_and_encoded"),
        pytest.param("postgresql://u@h/d?options=-c%20app.api_key%3DK3y-1",
                     "postgresql://u@h/d?options=***", id="secret_setting_in_options"),
        pytest.param("postgresql://u@h/d?options=-csearch_path%3Drubric",
                     "postgresql://u@h/d?options=-csearch_path%3Drubric", id="plain_options"),
        pytest.param("POSTGRESQL://u:pw@h/d", "postgresql://u:***@h/d", id="upper_case_scheme"),
        pytest.param("postgresql://u:pw@h1:5,h2:6/d", "postgresql://u:***@h1:5,h2:6/d",
                     id="several_hosts"),
        pytest.param("postgresql://u:pw@[::1]:5/d", "postgresql://u:***@[::1]:5/d", id="ipv6"),
        pytest.param("postgresql:///d?host=/run/pg&user=a@b&password=pw",
                     "postgresql:///d?host=/run/pg&user=a@b&password=***", id="socket_and_at"),
        # A raw / (or an @ past it) leaves no telling where the password ends: hide it all.
        pytest.param("postgresql://u:pa/ss@h/d", "postgresql://***", id="raw_slash"),
        pytest.param("postgresql://u:pa#s/s@h/d", "postgresql://***", id="raw_hash_then_slash"),
    ],
)
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("postgresql://rubric:pw/Secret-9z@127.0.0.1:1/d", id="raw_slash"),
        pytest.param("postgresql://rubric:pw#x/Secret-9z@127.0.0.1:1/d", id="raw_hash_slash"),
    ],
)
def test_a_url_whose_password_cannot_be_told_apart_is_refused_and_never_shown(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # libpq would read "pw" as a port and echo it; nothing of the URL may be shown.
    with pytest.raises(StoreError, match="must be percent-encoded") as info:
        Store(url)
    assert "Secret-9z" not in str(info.value) and "pw" not in str(info.value)
    assert shown_location(url) == "postgresql://***"
    from rubric_core.cli import main

    code = main(["analytics", "--db", url], io.StringIO())
    out = capsys.readouterr()
    assert code == 2 and "percent-encoded" in out.err
    assert "Secret-9z" not in out.out + out.err and "pw" not in out.out + out.err


def test_every_spelling_of_the_password_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "from-the-ENV-3e1f")  # not a *_PASSWORD name
    raw = "p@ss/W%C3%B6rd-8c2d"
    store = Store(f"postgresql://rubric:{raw.replace('@', '%40').replace('/', '%2F')}"
                  f"@127.0.0.1:1/d?sslpassword=ssl-Key-Pass-77&sslmode=require")
    assert store.location == "postgresql://rubric:***@127.0.0.1:1/d?sslpassword=***&sslmode=require"
    text = ("p@ss/Wörd-8c2d p%40ss%2FW%C3%B6rd-8c2d ssl-Key-Pass-77 from-the-ENV-3e1f")
    assert redact(text) == " ".join(["[redacted]"] * 4)


def test_an_unreachable_server_with_several_hosts_is_named(pg_server: str) -> None:
    ports = free_port(), free_port()
    url = f"postgresql://u:Several-Hosts-pw@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/d"
    with pytest.raises(StoreError) as info:
        Store(url).open()
    message = str(info.value)
    assert f"127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}" in message
    assert "Several-Hosts-pw" not in message and "Check that the server is running" in message


def test_another_role_s_tables_make_a_database_foreign(pg_url: str) -> None:
    # information_schema lists only what this user may touch: the check must not go by it.
    _sql(pg_url, "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'studio') "
                 "THEN CREATE ROLE studio LOGIN; END IF; END$$",
         "GRANT CREATE, USAGE ON SCHEMA public TO studio",
         "CREATE TABLE payroll (id int PRIMARY KEY, salary int)",
         "INSERT INTO payroll VALUES (1, 100)")
    before = _snapshot(pg_url)
    with pytest.raises(StoreError, match=r"not a Rubric Studio database .*'payroll'"):
        Store(pg_url.replace("postgres@", "studio@")).open()
    assert _snapshot(pg_url) == before


@pytest.mark.parametrize(
    ("search_path", "reason"),
    [
        pytest.param("pg_temp", "temporary schema pg_temp_", id="temporary_schema_first"),
        pytest.param("pg_temp%2Cpublic", "temporary schema pg_temp_", id="temporary_then_public"),
        pytest.param("no_such_schema", "names no schema that exists", id="missing_schema"),
    ],
)
def test_a_search_path_that_cannot_keep_tables_is_refused(
    pg_url: str, search_path: str, reason: str
) -> None:
    with pytest.raises(StoreError, match="cannot hold Rubric Studio's tables") as info:
        Store(f"{pg_url}?options=-csearch_path%3D{search_path}").open()
    assert reason in str(info.value) and "Nothing was written" in str(info.value)
    assert _snapshot(pg_url) == {}


def test_a_search_path_keeps_our_tables_in_their_own_schema(pg_url: str) -> None:
    _sql(pg_url, "CREATE SCHEMA rubric", "CREATE TABLE public.customers (id int)")
    with Store(f"{pg_url}?options=-csearch_path%3Drubric") as store:
        store.create_run(prompt="p", rubric="- a")
        store.saver()
    assert set(_snapshot(pg_url)) == {"customers"}
    assert scalar(pg_url, "SELECT count(*) FROM rubric.runs") == 1


def test_a_connection_lost_mid_write_leaves_nothing_half_written(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "Lost-Mid-Write-4b"
    url = pg_url.replace("postgres@", f"postgres:{password}@")
    with Store(url) as store:
        version = store.save_dataset(demo_dataset())
        real = _PgTx.executemany

        def die_first(tx: _PgTx, sql: str, rows: Any) -> None:
            # The experiment row is in; the server drops the connection before its cells.
            tx.conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            real(tx, sql, rows)

        monkeypatch.setattr(_PgTx, "executemany", die_first)
        with pytest.raises(StoreError) as info:
            store.create_experiment(name="e", dataset_name=demo_dataset().name,
                                    dataset_version=version,
                                    configurations=[ExperimentConfig()], repeats=1,
                                    row_ids=["r1", "r2"])
        monkeypatch.undo()
        message = str(info.value)
        assert "Lost the connection to the PostgreSQL server" in message
        assert "none was half-written" in message and password not in message
        assert store.list_experiments() == []  # the same store goes on, with nothing stored
    assert scalar(pg_url, "SELECT count(*) FROM experiment_cells") == 0


def test_a_server_that_dies_and_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own cluster: it is stopped (as a crash would) and started again. The first failure
    # waits the pool's timeout for a connection (30 s; 20 s here), later ones only the
    # down-timeout (3 s, which the first request after the restart may wait too, for a
    # connection to the server that is back): bounded at 12 s, between the two.
    monkeypatch.setattr(_postgres, "_POOL_TIMEOUT_S", 20.0)
    password = "Outage-pw-91c2"
    with postgres_cluster() as cluster:
        plain = create_database(cluster.url)
        # Durable commits here (the test cluster's default is off): the run must survive.
        _sql(cluster.url, f'ALTER DATABASE "{plain.rsplit("/", 1)[1]}" '
                          "SET synchronous_commit = on")
        url = plain.replace("postgres@", f"postgres:{password}@")
        store = Store(url).open()
        saver = store.saver()
        run = store.create_run(prompt="p", rubric="- a")
        config: Any = {"configurable": {"thread_id": run.thread_id}}
        cluster.stop()
        # Every operation, ours or the saver's, fails with the store's message, soon; once a
        # failure is seen, the next ones do not wait the pool's whole timeout.
        attempts = (lambda: store.get_run(run.run_id), lambda: saver.get_tuple(config),
                    lambda: store.add_evaluation(run.run_id, _EVALUATION))
        for limit, attempt in zip((60.0, 12.0, 12.0), attempts, strict=True):
            started = time.monotonic()
            with pytest.raises(StoreError) as info:
                attempt()
            message = str(info.value)
            assert password not in message and f"127.0.0.1:{cluster.port}" in message
            assert "server" in message and DB_ENV_VAR in message
            assert time.monotonic() - started < limit
        cluster.start()
        # Back at once: the broken pooled connections are replaced, not handed out.
        started = time.monotonic()
        assert store.get_run(run.run_id) == run
        assert saver.get_tuple(config) is None
        assert time.monotonic() - started < 60
        store.close()


def test_missing_database_says_create_it(pg_server: str) -> None:
    url = pg_server.rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(StoreError, match=r"does not exist.*createdb.*RUBRIC_STUDIO_DB"):
        Store(url).open()


def test_missing_psycopg_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    with pytest.raises(StoreError, match=r"pip install 'rubric-studio\[postgres\]'") as info:
        Store("postgresql://u:hidden-password@h/d")
    assert "hidden-password" not in str(info.value)


def test_pool_size_and_prepare_threshold_come_from_the_environment(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUBRIC_STUDIO_PG_POOL_SIZE", "2")
    monkeypatch.setenv("RUBRIC_STUDIO_PG_PREPARE_THRESHOLD", "none")
    with Store(pg_url) as store:
        pool: Any = store.saver().conn
        assert pool.max_size == 2
        assert pool.kwargs["prepare_threshold"] is None
        with pool.connection() as conn:
            assert conn.prepare_threshold is None
            # What PostgresSaver needs of every connection it is handed.
            assert conn.autocommit and conn.row_factory is dict_row
        store.create_run(prompt="p", rubric="- a")
    monkeypatch.setenv("RUBRIC_STUDIO_PG_POOL_SIZE", "0")
    with pytest.raises(StoreError, match="RUBRIC_STUDIO_PG_POOL_SIZE='0'"):
        Store(pg_url)


def test_the_database_password_is_stored_nowhere_and_printed_nowhere(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The test server trusts local connections, so any password in the URL is accepted.
    password = "Db-Password-Never-Stored-5e"
    url = pg_url.replace("postgres@", f"postgres:{password}@")
    from rubric_core.cli import main

    data = tmp_path / "rows.csv"
    data.write_text("prompt,rubric\nWrite a haiku about spring.,- The poem has three lines\n",
                    encoding="utf-8")
    out = io.StringIO()
    assert main(["run", "--example", "haiku", "--db", url], out) == 0
    assert main(["eval", "--dataset", str(data), "--db", url], out) == 0
    assert main(["analytics", "--db", url], out) == 0
    assert main(["datasets", "--db", url], out) == 0
    copy = tmp_path / "copy.sqlite3"
    assert main(["db", "copy", "--from", url, "--to", str(copy)], out) == 0
    printed = out.getvalue() + "".join(capsys.readouterr())
    assert password not in printed and "postgres:***@" in printed
    assert database_holds(pg_url, password) == [] and database_holds(copy, password) == []
    assert database_holds(pg_url, "three lines") != []  # the search does find stored text


def test_the_environment_variable_selects_postgresql(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_url.replace("postgres@", "postgres:Env-Selected-pw-0d@")
    monkeypatch.setenv(DB_ENV_VAR, f"  {url}  ")
    assert default_db_path() == url  # kept as text: a Path would fold the URL's //
    with Store(default_db_path()) as store:
        assert store.backend == "postgresql"
    from rubric_core.app_support import resolve_db_path
    from rubric_core.cli import main

    assert resolve_db_path(None, {}) == url
    data = tmp_path / "rows.csv"
    data.write_text("prompt,rubric\nWrite a haiku about spring.,- The poem has three lines\n",
                    encoding="utf-8")
    out = io.StringIO()
    assert main(["eval", "--dataset", str(data)], out) == 0, out.getvalue()  # no --db
    assert "--db postgresql://postgres:***@" in out.getvalue()
    assert "Env-Selected-pw-0d" not in out.getvalue()
    assert scalar(pg_url, "SELECT count(*) FROM experiments") == 1
