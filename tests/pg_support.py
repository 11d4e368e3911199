"""A throwaway PostgreSQL server for the tests: a fresh cluster on a free 127.0.0.1 port.

Uses Debian's ``postgresql`` package (``scripts/test.sh`` installs it when root, as it does
Chromium). The cluster lives in a temporary directory, runs as an unprivileged user (the
``postgres`` account when the tests run as root, else the current user), trusts local
connections only, and is stopped and deleted afterwards — also when the test process is
killed (a watcher process does it then, `_reaper`). A missing PostgreSQL fails loudly: these
tests are never skipped.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

PG_BIN_ENV = "RUBRIC_STUDIO_PG_BIN"
"""Directory holding initdb/pg_ctl, when they are not where Debian puts them."""


def pg_bin() -> Path:
    """The directory of PostgreSQL's server binaries (initdb, pg_ctl, postgres)."""
    configured = os.environ.get(PG_BIN_ENV)
    candidates = [configured] if configured else sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))[::-1]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    msg = ("PostgreSQL's server binaries (initdb, pg_ctl) are missing: install them "
           "('sudo apt-get install postgresql'; scripts/test.sh does so when run as root) or "
           f"set {PG_BIN_ENV} to their directory")
    raise RuntimeError(msg)


def free_port() -> int:
    """A 127.0.0.1 TCP port that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> tuple[list[str], int | None]:
    """Command prefix running a program unprivileged, and the uid that owns the cluster."""
    if os.geteuid() != 0:
        return [], None
    user = pwd.getpwnam("postgres")
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
            "--init-groups", "--"], user.pw_uid


_REAP = """
import shutil, subprocess, sys
sys.stdin.buffer.read()  # end of file: the process that started the cluster is done or gone
subprocess.run(sys.argv[2:], capture_output=True, timeout=60, check=False)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def _reaper(root: Path, stop: list[str]) -> subprocess.Popen[bytes]:
    """A process that stops the cluster (``stop``) and deletes ``root`` once this one is gone.

    It waits for end of file on a pipe only this process writes to (the kernel closes it
    however this process ends, SIGKILL included) and runs in a session of its own, so the
    signal that ends a test run does not end it too. Closing its stdin and waiting for it is
    how the cluster is stopped and deleted on a normal end too.
    """
    return subprocess.Popen([sys.executable, "-c", _REAP, str(root), *stop],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


class Cluster:
    """A running throwaway cluster: its URL, and a stop and a start for outage tests."""

    def __init__(self, binaries: Path, prefix: list[str], data: Path, log: Path,
                 options: str, port: int) -> None:
        self.root = data.parent
        """The directory holding the cluster (deleted with it)."""
        self._pg_ctl = [*prefix, str(binaries / "pg_ctl"), "-D", str(data)]
        self._log, self._options, self.port = log, options, port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def start(self) -> None:
        """Start the server (again) and wait until it accepts connections."""
        subprocess.run([*self._pg_ctl, "-l", str(self._log), "-o", self._options, "-w",
                        "-t", "60", "start"], check=True, capture_output=True, timeout=120)
        _wait_ready(self.port)

    @property
    def stop_command(self) -> list[str]:
        """The command that stops the server at once, as a crash would (``-m immediate``)."""
        return [*self._pg_ctl, "-m", "immediate", "-w", "stop"]

    def stop(self) -> None:
        """Stop the server at once, as a crash would."""
        subprocess.run(self.stop_command, capture_output=True, timeout=60, check=False)

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m MODE``: every session is ended, then the server starts again.

        Returns once it accepts connections again.
        """
        subprocess.run([*self._pg_ctl, "-l", str(self._log), "-o", self._options, "-m", mode,
                        "-w", "-t", "60", "restart"], check=True, capture_output=True,
                       timeout=120)
        _wait_ready(self.port)


@contextmanager
def postgres_cluster() -> Iterator[Cluster]:
    """Start a fresh cluster; yields it (`Cluster.url` is its ``postgres`` database)."""
    binaries = pg_bin()
    prefix, owner = _as_user()
    root = Path(tempfile.mkdtemp(prefix="rubric_pg_"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if owner is not None:
        for path in (root, sockets):
            os.chown(path, owner, -1)
    port = free_port()
    options = (f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
               "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60")
    cluster = Cluster(binaries, prefix, data, root / "server.log", options, port)
    reaper = _reaper(root, cluster.stop_command)
    try:
        subprocess.run([*prefix, str(binaries / "initdb"), "-D", str(data), "-U", "postgres",
                        "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
                       check=True, capture_output=True, timeout=120)
        cluster.start()
        yield cluster
    finally:
        # The watcher does the clean-up, now or when this process is killed: one way for both.
        assert reaper.stdin is not None
        reaper.stdin.close()
        reaper.wait(timeout=70)


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a fresh cluster; yields its URL (``postgresql://postgres@127.0.0.1:PORT/postgres``)."""
    with postgres_cluster() as cluster:
        yield cluster.url


def _wait_ready(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def database_url(server_url: str, name: str) -> str:
    """The URL of database ``name`` on the server at ``server_url``."""
    return server_url.rsplit("/", 1)[0] + "/" + name


def create_database(server_url: str) -> str:
    """Create a fresh, empty database on the server; returns its URL."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(server_url, name)


def drop_database(url: str) -> None:
    """Drop a database made by `create_database`, closing whatever is still connected to it."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def writes_held(url: str, table: str, waiting: int, timeout_s: float = 120.0) -> Iterator[None]:
    """Hold every write to ``table`` until ``waiting`` sessions wait for it; then yield.

    A ``SHARE ROW EXCLUSIVE`` lock lets reads through and makes each INSERT, UPDATE and DELETE
    wait: so a server restart in the block finds that many writes in flight, at once, whatever
    the machine's speed (the outage tests). The lock ends with its session (a restart ends it).

    Raises:
        TimeoutError: Fewer sessions came to wait within ``timeout_s``.

    """
    import psycopg

    holder = psycopg.connect(url)
    try:
        holder.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(url, autocommit=True) as watch:
            while True:
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()").fetchone()
                if row is not None and row[0] >= waiting:
                    break
                if time.monotonic() > deadline:
                    msg = f"{row[0] if row else 0} of {waiting} writes came to wait on {table}"
                    raise TimeoutError(msg)
                time.sleep(0.05)
        yield
    finally:
        with contextlib.suppress(Exception):  # ended by the restart already
            holder.close()


def scalar(location: str | Path, sql: str) -> object:
    """The first column of the first row of ``sql`` on a SQLite file or PostgreSQL URL.

    The tests' own look at a database, past the store; None when a table it names is missing.
    """
    if str(location).startswith("postgresql://"):
        import psycopg

        with psycopg.connect(str(location), autocommit=True) as conn:
            try:
                row = conn.execute(sql).fetchone()
            except psycopg.errors.UndefinedTable:
                return None
    else:
        import sqlite3

        conn2 = sqlite3.connect(location, timeout=5)
        try:
            row = conn2.execute(sql).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        finally:
            conn2.close()
    return None if row is None else row[0]


def database_holds(location: str | Path, secret: str) -> list[str]:
    """Where ``secret`` appears in a database: its files (SQLite) or its tables (PostgreSQL)."""
    if not str(location).startswith("postgresql://"):
        path = Path(location)
        return [p.name for p in path.parent.iterdir()
                if p.name.startswith(path.name) and secret.encode() in p.read_bytes()]
    import psycopg

    found = []
    with psycopg.connect(str(location), autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        for table in tables:
            # bytea (checkpoint blobs) shows as hex in JSON: look for both spellings.
            hit = conn.execute(
                f'SELECT count(*) FROM "{table}" t WHERE strpos(row_to_json(t)::text, %s) > 0 '
                f"OR strpos(row_to_json(t)::text, %s) > 0",
                (secret, secret.encode().hex())).fetchone()
            if hit and hit[0]:
                found.append(table)
    return found
