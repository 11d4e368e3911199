"""Leases: several workers, in any processes sharing the database, share an experiment's cells.

A worker claims one cell at a time (`LeaseStore.claim_cell`) for a number of seconds, renews
its lease while the cell's run goes on, and releases it when the run ends; a dead worker's
cells are claimed again once their leases expire. Leases are judged by the database's clock and
kept in ``experiment_cells`` (``lease_owner``, ``lease_expires_at``); while any is live, the
experiment cannot be deleted. A known weakness: a lease carries no fencing token, so a worker
that lost its lease (paused past its expiry) can still write to the cell's run until its next
renewal tells it. Leases are to be replaced by a queue engine; this module then goes whole.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rubric_core.store._core import CHUNK, check_seconds
from rubric_core.store._experiments import ExperimentStore
from rubric_core.types import CELL_PENDING

if TYPE_CHECKING:
    from collections.abc import Collection

    from rubric_core.store._records import CellRecord
    from rubric_core.store._schema import Tx

_CLAIM_TRIES = 200
_CLAIM_RETRY_S = 0.01


class LeaseStore(ExperimentStore):
    """Experiments whose cells are leased to workers; a part of `rubric_core.store.Store`."""

    def claim_cell(
        self, experiment_id: str, owner: str, *, lease_s: float, done: Collection[str],
        keys: Collection[tuple[str, int, int]] | None = None,
    ) -> CellRecord | None:
        """Lease one cell that still needs a run to ``owner``, for ``lease_s`` seconds.

        A cell can be claimed when its status (its run's, or ``pending``) is not in ``done``
        and nobody holds a live lease on it (none, released, or expired: a worker that died
        loses its cells when their leases run out). Cells are claimed in run order. Two
        workers claiming at once never get the same cell: on PostgreSQL the claim reads with
        ``SELECT … FOR UPDATE SKIP LOCKED`` (a concurrent claim skips a row being claimed
        instead of waiting for it), on SQLite under the file's one write lock
        (``BEGIN IMMEDIATE``). Leases are judged by the database's clock, so workers on
        several machines need no agreement on time.

        Args:
            experiment_id: The experiment.
            owner: Who claims (unique per worker, e.g. ``host:pid:uuid``); a cell it already
                holds is not handed to it again.
            lease_s: Seconds until the lease expires unless renewed (`renew_lease`).
            done: Cell statuses that need no run (the experiment driver's ended statuses,
                less the error statuses when errors are retried).
            keys: Claim only among these cells (``(row_id, config_index, repeat_index)``),
                e.g. those a worker found unfinished when it started, so that a cell that
                ends in an error is not claimed again at once; None for any cell.

        Returns:
            The claimed cell (with ``lease_owner`` and ``lease_expires_at`` set), or None when
            no cell can be claimed now (every remaining one done or leased).

        Raises:
            ValueError: An empty owner or a lease that is not a positive number of seconds.

        """
        if not isinstance(owner, str) or not owner.strip():
            msg = "a lease needs an owner: a non-empty string naming the worker"
            raise ValueError(msg)
        check_seconds(lease_s, "lease_s")
        chunks: list[list[tuple[str, int, int]] | None] = [None]
        if keys is not None:
            wanted = list(dict.fromkeys((str(r), int(c), int(i)) for r, c, i in keys))
            chunks = [wanted[i : i + CHUNK // 3] for i in range(0, len(wanted), CHUNK // 3)]
        with self._connect(write=True) as conn:
            for chunk in chunks:
                key = self._claim(conn, experiment_id, owner, lease_s, done, chunk)
                if key is not None:
                    return self._cells(conn, experiment_id, key)[0]
        return None

    def _claim(self, conn: Tx, experiment_id: str, owner: str, lease_s: float,
               done: Collection[str], keys: list[tuple[str, int, int]] | None,
               ) -> tuple[str, int, int] | None:
        dialect = conn.dialect
        where = ("c.experiment_id = ? AND (c.lease_owner IS NULL OR "
                 f"c.lease_expires_at <= {dialect.epoch_now})")
        params: list[Any] = [experiment_id]
        if done:
            where += (" AND COALESCE((SELECT status FROM runs WHERE thread_id = c.thread_id "
                      "ORDER BY created_at DESC, rowid DESC LIMIT 1), ?) "
                      f"NOT IN ({', '.join('?' * len(done))})")
            params += [CELL_PENDING, *sorted(done)]
        if keys is not None:
            where += (" AND (c.row_id, c.config_index, c.repeat_index) IN (VALUES "
                      + ", ".join(["(?, ?, ?)"] * len(keys)) + ")")
            params += [v for k in keys for v in k]
        claim = (f"SELECT c.row_id, c.config_index, c.repeat_index FROM experiment_cells c "
                 f"WHERE {where} ORDER BY c.seq LIMIT 1{dialect.skip_locked}")
        for _ in range(_CLAIM_TRIES):
            row = conn.execute(claim, params).fetchone()
            if row is not None:
                key = (str(row["row_id"]), int(row["config_index"]), int(row["repeat_index"]))
                conn.execute(
                    f"UPDATE experiment_cells SET lease_owner = ?, lease_expires_at = "
                    f"{dialect.epoch_now} + ? WHERE experiment_id = ? AND row_id = ? AND "
                    "config_index = ? AND repeat_index = ?",
                    (owner, float(lease_s), experiment_id, *key))
                return key
            # PostgreSQL's LIMIT with a row lock can come back empty when the row it found was
            # claimed meanwhile, though others are free: look again without locking.
            free = conn.execute(
                f"SELECT 1 FROM experiment_cells c WHERE {where} LIMIT 1", params).fetchone()
            if free is None:
                return None
            time.sleep(_CLAIM_RETRY_S)  # another claim holds that row; it commits in a moment
        return None

    def renew_lease(self, experiment_id: str, key: tuple[str, int, int], owner: str, *,
                    lease_s: float) -> bool:
        """Extend ``owner``'s lease on a cell to ``lease_s`` seconds from now.

        Returns:
            False when ``owner`` no longer holds it (it expired and another worker claimed
            it, or it was released): stop working on the cell.

        """
        check_seconds(lease_s, "lease_s")
        with self._connect(write=True) as conn:
            return bool(conn.execute(
                f"UPDATE experiment_cells SET lease_expires_at = {conn.dialect.epoch_now} + ? "
                "WHERE experiment_id = ? AND row_id = ? AND config_index = ? AND "
                "repeat_index = ? AND lease_owner = ?",
                (float(lease_s), experiment_id, *key, owner)).rowcount)

    def leased_elsewhere(self, experiment_id: str, owner: str) -> int:
        """How many of an experiment's cells other workers hold live leases on now."""
        with self._connect() as conn:
            now = conn.dialect.epoch_now
            row = conn.execute(
                f"SELECT COUNT(*) AS held FROM experiment_cells WHERE experiment_id = ? "
                f"AND lease_owner IS NOT NULL AND lease_owner <> ? AND lease_expires_at > {now}",
                (experiment_id, owner)).fetchone()
        return int(row["held"])

    def release_cell(self, experiment_id: str, key: tuple[str, int, int], owner: str) -> bool:
        """Give up ``owner``'s lease on a cell (after its run ended, or on Stop).

        Returns:
            False when ``owner`` did not hold it (nothing is changed then).

        """
        with self._connect(write=True) as conn:
            return bool(conn.execute(
                "UPDATE experiment_cells SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE experiment_id = ? AND row_id = ? AND config_index = ? AND "
                "repeat_index = ? AND lease_owner = ?", (experiment_id, *key, owner)).rowcount)

    def _check_deletable(self, conn: Tx, experiment_id: str) -> None:
        """Refuse to delete an experiment while a worker holds a live lease on one of its cells."""
        now = conn.dialect.epoch_now
        row = conn.execute(
            f"SELECT COUNT(*) AS held, MAX(lease_expires_at) - {now} AS seconds_left "
            f"FROM experiment_cells WHERE experiment_id = ? AND lease_owner IS NOT NULL "
            f"AND lease_expires_at > {now}", (experiment_id,)).fetchone()
        if row["held"]:
            msg = (f"experiment {experiment_id} is running: {row['held']} cell(s) are leased by "
                   f"a worker for up to {float(row['seconds_left']):.0f} s more; stop it first "
                   "(a killed worker's leases expire by themselves)")
            raise ValueError(msg)
