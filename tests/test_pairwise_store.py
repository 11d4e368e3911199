"""Stored pairwise judgements (`rubric_core.store._pairwise`), on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from typing import TYPE_CHECKING

import pytest

from rubric_core.models import resolve_model
from rubric_core.pairwise import CSV_COLUMNS, JudgementSpec, Pair, StoredJudgement, judge_and_record
from rubric_core.prices import parse_overrides
from rubric_core.redact import register_secret
from rubric_core.store import SCHEMA_VERSION, Store, copy_store

if TYPE_CHECKING:
    from pathlib import Path

RUBRIC = "- The poem has three lines\n- The theme is spring"
GOOD = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"
BAD = "Autumn leaves fall"
SPEC = JudgementSpec("haikus", "cli", "rules", RUBRIC, label_a="draft", label_b="final")


def test_a_judgement_is_stored_listed_read_back_and_deleted(store: Store) -> None:
    pairs = [Pair("1", "Write a haiku about spring.", GOOD, BAD),
             Pair("2", "Write a haiku about spring.", BAD, GOOD),
             Pair("3", "p", GOOD, BAD, rubric="- The theme is spring")]
    record = judge_and_record(store, resolve_model("rules"), pairs, SPEC)
    assert record.pairs == 3 and (record.label_a, record.label_b) == ("draft", "final")
    assert [r.judgement_id for r in store.list_pairwise()] == [record.judgement_id]
    judged = StoredJudgement.read(store, record.judgement_id)
    assert [i.pair_id for i in judged.items] == ["1", "2", "3"]
    assert [c["winner"] for c in judged.items[1].criteria] == ["b", "b"]
    overall = judged.tallies()[-1]
    assert (overall.a_wins, overall.b_wins, overall.flip_rate) == (3, 2, 0.0)
    rows = list(judged.csv_rows())
    assert len(rows) == 5 and len(rows[0]) == len(CSV_COLUMNS)
    assert rows[0][:5] == ("1", "The poem has three lines", "a", "a", "a")
    calls = store.pairwise_calls(record.judgement_id)
    assert [c["iteration"] for c in calls[0]] == [0, 1] and calls[0][0]["content_kept"]
    assert calls[0][0]["messages"][0]["role"] == "system"
    assert len(store.pairwise_call_usage(record.judgement_id)) == 6
    assert judged.cost(store, parse_overrides([])) == Decimal(0)  # rules costs nothing
    assert store.delete_pairwise(record.judgement_id)
    assert store.list_pairwise() == [] and store.pairwise_items(record.judgement_id) == []
    assert store.pairwise_calls(record.judgement_id) == {}


def test_a_pair_is_recorded_once_and_texts_are_scrubbed(store: Store) -> None:
    secret = "sk-pairwise-test-secret-0123456789abcdef"
    register_secret(secret)
    record = store.create_pairwise(name=f"n {secret}", source="cli", grader_model="rules",
                                   rubric=RUBRIC)
    criteria = [{"criterion": "c", "winner_a_first": "a", "winner_b_first": "a",
                 "winner": "a", "reason_a_first": f"see {secret}", "reason_b_first": "",
                 "error": None}]
    kwargs = {"pair_id": "1", "prompt": f"p {secret}", "answer_a": "x", "answer_b": "y",
              "rubric": RUBRIC, "criteria": criteria}
    assert store.add_pairwise_pair(record.judgement_id, 0, **kwargs)  # type: ignore[arg-type]
    assert not store.add_pairwise_pair(record.judgement_id, 0, **kwargs)  # type: ignore[arg-type]
    [item] = store.pairwise_items(record.judgement_id)
    assert secret not in item.prompt and secret not in item.criteria[0]["reason_a_first"]
    assert secret not in (store.get_pairwise(record.judgement_id) or record).name
    with pytest.raises(KeyError):
        store.add_pairwise_pair("nope", 0, **kwargs)  # type: ignore[arg-type]


def test_an_older_database_gains_the_pairwise_tables_and_they_are_copied(
        tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with Store(path) as store:
        store.list_runs()
    with sqlite3.connect(path) as conn:
        for table in ("pairwise_calls", "pairwise_pairs", "pairwise_judgements"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("UPDATE meta SET value = '13' WHERE key = 'schema_version'")
    with Store(path) as store:
        record = judge_and_record(store, resolve_model("rules"), [Pair("1", "p", GOOD, BAD)],
                                  SPEC)
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == str(SCHEMA_VERSION) == "14"
    copied = copy_store(path, tmp_path / "copy.sqlite3")
    assert (copied["pairwise_judgements"], copied["pairwise_pairs"],
            copied["pairwise_calls"]) == (1, 1, 2)
    with Store(tmp_path / "copy.sqlite3") as copy:
        assert copy.pairwise_items(record.judgement_id)[0].criteria[0]["winner"] == "a"
