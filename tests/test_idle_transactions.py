"""A process paused inside a transaction does not keep its run from the process taking it over.

Found by the SIGSTOP drill (`test_engine_sigstop`): a worker paused in the middle of a fenced
checkpoint write holds its run's row ``FOR SHARE``, and the taker's claim (an ``UPDATE`` of
the row) waited for as long as the pause lasted. The server now ends a transaction of ours left
idle for `rubric_core.registry.STALE_AFTER_S` (`rubric_core.store._postgres.
ENDS_IDLE_TRANSACTIONS`). Real PostgreSQL, a real second connection standing in for the paused
process (made with the store's own connection settings).
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from rubric_core.settings import RunSettings
from rubric_core.store import Store, _pg_saver, _postgres

ALWAYS_STALE = "9999-01-01T00:00:00.000000+00:00"
IDLE_S = 2


def test_a_paused_writers_transaction_is_ended_and_the_taker_claims_the_run(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_postgres, "ENDS_IDLE_TRANSACTIONS",
                        f"-c idle_in_transaction_session_timeout={IDLE_S * 1000}")
    with Store(pg_url) as paused, Store(pg_url) as taker:
        run = paused.create_run(RunSettings(prompt="p", rubric="- c"), owner="paused:1:x")
        # The paused process, inside a fenced write: its run's row read FOR SHARE, then nothing.
        writer = psycopg.connect(pg_url, **paused._backend._conninfo_kwargs())  # type: ignore[union-attr]
        writer.execute("BEGIN")
        writer.execute(_pg_saver._FENCE_SQL, (run.run_id,))
        claimed: list[bool] = []
        went = time.monotonic()
        claim = threading.Thread(target=lambda: claimed.append(taker.claim_run(
            run.run_id, owner="taker:2:y", stale_before=ALWAYS_STALE)))
        claim.start()
        claim.join(IDLE_S + 30)  # without the server's timeout: blocked as long as the pause
        assert claimed == [True], "the claim waited on the paused writer's lock"
        print(f"claimed {time.monotonic() - went:.1f} s after the writer paused")
        record = taker.get_run(run.run_id)
        assert record is not None and record.owner == "taker:2:y"
        # The paused process wakes up to a closed connection: its write goes nowhere.
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
            writer.execute("INSERT INTO evaluations (run_id) VALUES (%s)", (run.run_id,))
        writer.close()


def test_every_connection_of_the_store_carries_the_timeout(pg_url: str) -> None:
    with Store(pg_url) as store:
        conn = psycopg.connect(pg_url, **store._backend._conninfo_kwargs())  # type: ignore[union-attr]
        with conn:
            row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert row is not None and row[0] == "30s"  # registry.STALE_AFTER_S, the default
