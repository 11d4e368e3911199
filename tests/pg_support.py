"""A throwaway PostgreSQL server for the tests: a fresh cluster on a free 127.0.0.1 port.

Uses Debian's ``postgresql`` package (``scripts/test.sh`` installs it when root, as it does
Chromium). The cluster lives in a temporary directory, runs as an unprivileged user (the
``postgres`` account when the tests run as root, else the current user), trusts local
connections only, and is stopped and deleted afterwards. A missing PostgreSQL fails loudly:
these tests are never skipped.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
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


def _free_port() -> int:
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


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a fresh cluster; yields its URL (``postgresql://postgres@127.0.0.1:PORT/postgres``)."""
    binaries = pg_bin()
    prefix, owner = _as_user()
    root = Path(tempfile.mkdtemp(prefix="rubric_pg_"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if owner is not None:
        for path in (root, sockets):
            os.chown(path, owner, -1)
    port = _free_port()
    log = root / "server.log"
    try:
        subprocess.run([*prefix, str(binaries / "initdb"), "-D", str(data), "-U", "postgres",
                        "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
                       check=True, capture_output=True, timeout=120)
        options = (f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60")
        subprocess.run([*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log),
                        "-o", options, "-w", "-t", "60", "start"],
                       check=True, capture_output=True, timeout=120)
        _wait_ready(port)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)


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
