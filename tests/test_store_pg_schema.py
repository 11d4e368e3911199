"""Which schema our tables and LangGraph's checkpoint tables live in, on a real PostgreSQL.

Both must be in the one schema the store checked is ours (the first of the search_path): a
LangGraph application sharing the database keeps its own checkpoint tables, and a run never
writes (or reads) them (issue #23, hole 9).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, cast

import psycopg
import pytest
from pg_support import scalar

from rubric_core.cli import main
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

_LANGGRAPH_TABLES = ("checkpoint_migrations", "checkpoints", "checkpoint_blobs",
                     "checkpoint_writes")


def _sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _counts(url: str, schema: str) -> dict[str, object]:
    """Rows in each of LangGraph's tables in ``schema`` (None for a table that is not there)."""
    return {t: scalar(url, f"SELECT count(*) FROM {schema}.{t}") for t in _LANGGRAPH_TABLES}


def _another_langgraph_application(url: str) -> None:
    """LangGraph's own saver, in ``public``, with a checkpoint, its blobs and pending writes."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(f"{url}?options=-csearch_path%3Dpublic") as theirs:
        theirs.setup()
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": ["their state"], "plan": {"step": 1}}
        config = theirs.put({"configurable": {"thread_id": "theirs", "checkpoint_ns": ""}},
                            checkpoint, {"source": "input", "step": -1},
                            {"messages": "1", "plan": "1"})
        theirs.put_writes(config, [("messages", "pending"), ("plan", {"step": 2})], "task-1")


@pytest.mark.parametrize(
    "schema",
    [pytest.param('"rubric"', id="plain_name"),
     pytest.param('"Rubric Studio \\ ""β"""', id="name_with_space_backslash_and_quote")],
)
def test_a_langgraph_application_in_public_keeps_its_tables_to_itself(
    pg_url: str, tmp_path: Path, schema: str
) -> None:
    database = pg_url.rsplit("/", 1)[1]
    _another_langgraph_application(pg_url)
    # Our role's search_path starts with an empty schema of ours, then the other's public.
    _sql(pg_url, f"CREATE SCHEMA {schema}",
         f'ALTER ROLE postgres IN DATABASE "{database}" SET search_path = {schema}, public')
    theirs = _counts(pg_url, "public")
    assert all(theirs.values()), theirs  # every one of their tables holds rows

    data = tmp_path / "rows.csv"
    data.write_text("prompt,rubric\nWrite a haiku about spring.,- The poem has three lines\n"
                    "Write a haiku about rain.,- The poem has three lines\n", encoding="utf-8")
    out = io.StringIO()
    assert main(["eval", "--dataset", str(data), "--db", pg_url], out) == 0, out.getvalue()
    assert main(["run", "--example", "haiku", "--db", pg_url, "--thread", "th"], out) == 0

    assert _counts(pg_url, "public") == theirs  # not one row of theirs written
    ours = _counts(pg_url, schema)
    assert all(ours.values()), ours  # our checkpoints went to our schema, beside our tables
    assert scalar(pg_url, f"SELECT count(*) FROM {schema}.runs") == 3
    assert scalar(pg_url, f"SELECT count(DISTINCT thread_id) FROM {schema}.checkpoints") == 3

    # And they are read back from there: a resumed run finds its checkpoints.
    resumed = io.StringIO()
    assert main(["run", "--db", pg_url, "--thread", "th", "--resume"], resumed) == 0
    assert "status: satisfied after" in resumed.getvalue(), resumed.getvalue()
    with Store(pg_url) as store:
        for run in store.list_runs():
            saved = store.saver().get_tuple({"configurable": {"thread_id": run.thread_id}})
            assert saved is not None and saved.checkpoint["channel_values"]
    assert _counts(pg_url, "public") == theirs


def test_the_url_s_other_options_are_kept_beside_the_pinned_search_path(pg_url: str) -> None:
    _sql(pg_url, "CREATE SCHEMA rubric")
    url = f"{pg_url}?options=-cstatement_timeout%3D12345%20-csearch_path%3Drubric%2Cpublic"
    with Store(url) as store:
        pool = cast("Any", store.saver()).conn  # the store's pool, which the saver shares
        with pool.connection() as conn:
            timeout = conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"]
            search_path = conn.execute("SHOW search_path").fetchone()["search_path"]
    assert (timeout, search_path) == ("12345ms", '"rubric"')
    assert _counts(pg_url, "public") == dict.fromkeys(_LANGGRAPH_TABLES)
    assert _counts(pg_url, "rubric")["checkpoint_migrations"]
