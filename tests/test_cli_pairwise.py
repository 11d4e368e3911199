"""``rubric-studio pairwise``: judged in both orders, flip rate printed, CSV written, exit codes."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import FakeOpenAI, ToolCall

from rubric_core.cli import main
from rubric_core.pairwise import CSV_COLUMNS, PAIRWISE_TOOL, parse_pairwise_payload
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

RUBRIC = "- The poem has three lines\n- The theme is spring"
GOOD = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"
BAD = "Autumn leaves fall"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv, out)
    return code, out.getvalue(), err.getvalue()


def _pairs_csv(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "prompt", "a", "b"])
        writer.writerows(rows)
    return path


def test_rules_judges_a_csv_offline_prints_the_table_and_writes_the_csv(tmp_path: Path) -> None:
    pairs = _pairs_csv(tmp_path / "pairs.csv", [("1", "Write a haiku about spring.", GOOD, BAD),
                                                ("2", "Write a haiku about spring.", BAD, GOOD)])
    db, out_csv = tmp_path / "db.sqlite3", tmp_path / "out.csv"
    code, out, err = _run(["pairwise", "--pairs", str(pairs), "--rubric", RUBRIC,
                           "--grader", "rules", "--db", str(db), "--csv", str(out_csv)])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == ["criterion", "A", "wins", "B", "wins", "ties", "inconsistent",
                                "failed", "judged", "flip", "rate"]
    assert lines[2].split()[-7:] == ["1", "1", "0", "0", "0", "2", "0.00"]
    assert "position flip rate 0.00 (0 of 4" in out and "wrote 4 rows" in out
    with out_csv.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [(r["pair_id"], r["winner_a_first"], r["winner_b_first"], r["winner"]) for r in rows] \
        == [("1", "a", "a", "a"), ("1", "a", "a", "a"), ("2", "b", "b", "b"), ("2", "b", "b", "b")]
    with Store(db) as store:
        [record] = store.list_pairwise()
        assert record.pairs == 2 and record.source == "cli" and record.grader_model == "rules"
    code, listed, _ = _run(["pairwise", "--list", "--db", str(db)])
    assert code == 0 and record.judgement_id[:12] in listed
    code, shown, _ = _run(["pairwise", "--show", record.judgement_id[:8], "--db", str(db)])
    assert code == 0 and "position flip rate 0.00" in shown


def prefers_first(body: dict[str, Any]) -> ToolCall:
    """A server whose judge always prefers the answer it is shown first."""
    payload = parse_pairwise_payload(body["messages"][-1]["content"])
    assert payload is not None
    verdicts = {f"criterion_{i}": {"criterion": c, "winner": "a", "reason": "first is better"}
                for i, c in enumerate(payload.criteria, 1)}
    return ToolCall(PAIRWISE_TOOL, {"verdicts": verdicts})


def test_a_judge_that_prefers_the_first_answer_has_flip_rate_one(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "prompt": "p", "a": GOOD, "b": BAD}) + "\n"
                             for i in range(3)), encoding="utf-8")
    out_csv = tmp_path / "out.csv"
    with FakeOpenAI(default=prefers_first) as server:
        code, out, err = _run(["pairwise", "--pairs", str(pairs), "--rubric", RUBRIC,
                               "--grader", "openai-compatible:judge", "--base-url",
                               server.base_url, "--db", str(tmp_path / "db.sqlite3"),
                               "--csv", str(out_csv)])
        sent = len(server.requests)
    assert code == 0, err
    assert sent == 6  # one call per order per pair
    assert "position flip rate 1.00 (6 of 6 criterion judgements changed with the order)" in out
    with out_csv.open(encoding="utf-8", newline="") as handle:
        assert {(r["winner_a_first"], r["winner_b_first"], r["winner"])
                for r in csv.DictReader(handle)} == {("a", "b", "inconsistent")}


@pytest.mark.parametrize(("content", "message"), [
    pytest.param("id,prompt,a\n1,p,x\n", "row 1: no 'b' column", id="missing_column"),
    pytest.param("id,prompt,a,b\n1,p,x,y\n1,p,x,y\n", "row 3, column 'id': '1' is also the id "
                 "of row 2", id="duplicate_id"),
    pytest.param("id,prompt,a,b\n1,,x,y\n", "row 2, column 'prompt': empty", id="empty_prompt"),
    pytest.param("id,prompt,a,b,extra\n1,p,x,y,z\n", "row 1, column 5: unknown column 'extra'",
                 id="unknown_column"),
    pytest.param('id,prompt,a,b\n1,p,"x,y\n', "row 2: not readable as CSV", id="open_quote"),
])
def test_bad_input_exits_2_with_the_row_named(tmp_path: Path, content: str,
                                               message: str) -> None:
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(content, encoding="utf-8")
    db = tmp_path / "db.sqlite3"
    code, out, err = _run(["pairwise", "--pairs", str(pairs), "--rubric", RUBRIC,
                           "--db", str(db)])
    assert code == 2 and message in err and out == ""
    assert not db.exists()  # refused before anything is stored


def test_bad_jsonl_names_its_line(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"id": "1", "prompt": "p", "a": "x", "b": "y"}\n[1, 2]\n',
                     encoding="utf-8")
    code, _, err = _run(["pairwise", "--pairs", str(pairs), "--rubric", RUBRIC,
                         "--db", str(tmp_path / "db.sqlite3")])
    assert code == 2 and "row 2: a JSON list, not an object of columns" in err


def test_a_rubric_is_needed_for_rows_without_their_own(tmp_path: Path) -> None:
    pairs = _pairs_csv(tmp_path / "pairs.csv", [("1", "p", GOOD, BAD)])
    code, _, err = _run(["pairwise", "--pairs", str(pairs), "--db", str(tmp_path / "d.sqlite3")])
    assert code == 2 and "give --rubric" in err


def test_criteria_nobody_could_judge_exit_1_with_the_reason(tmp_path: Path) -> None:
    pairs = _pairs_csv(tmp_path / "pairs.csv", [("1", "p", GOOD, BAD)])
    code, out, _ = _run(["pairwise", "--pairs", str(pairs), "--rubric", "- The poem is lovely",
                         "--db", str(tmp_path / "db.sqlite3")])
    assert code == 1
    assert "position flip rate: none" in out and "rules grader cannot check" in out


def test_the_csv_is_formula_safe(tmp_path: Path) -> None:
    pairs = _pairs_csv(tmp_path / "pairs.csv", [("=1+1", "p", GOOD, BAD)])
    out_csv = tmp_path / "out.csv"
    code, _, err = _run(["pairwise", "--pairs", str(pairs), "--rubric", "- The theme is spring",
                         "--db", str(tmp_path / "db.sqlite3"), "--csv", str(out_csv)])
    assert code == 0, err
    assert out_csv.read_text(encoding="utf-8").splitlines()[1].startswith("'=1+1,")
