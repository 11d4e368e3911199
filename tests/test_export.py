"""Tests for rubric_core.export: frames, heatmap, formula-safe CSV, JSON and diffs."""

from __future__ import annotations

import io
import itertools
import json
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from rubric_core.export import (
    EXPORT_COLUMNS,
    criteria_changes,
    evaluations_frame,
    export_rows,
    heatmap_frame,
    iteration_diff,
    neutralize_frame,
    restore_cell,
    restore_frame,
    runs_frame,
    to_csv,
    to_json,
    write_csv,
    write_json,
)
from rubric_core.store import RunRecord, Store

if TYPE_CHECKING:
    from pathlib import Path

    from rubric_core.types import RubricEvaluation

TEXT_COLUMNS = [
    "run_id", "run_title", "worker_model", "grader_model", "run_status", "grading_run_id",
    "criterion", "gap", "result", "status", "explanation", "answer",
]


def _ev(
    iteration: int,
    verdicts: dict[str, bool],
    *,
    grading_run_id: str = "g1",
    **extra: Any,
) -> RubricEvaluation:
    criteria = [
        {"name": name, "passed": ok} if ok else {"name": name, "passed": ok, "gap": f"fix {name}"}
        for name, ok in verdicts.items()
    ]
    ev: dict[str, Any] = {
        "grading_run_id": grading_run_id, "iteration": iteration,
        "result": "satisfied" if all(verdicts.values()) else "needs_revision",
        "explanation": "summary", "criteria": criteria,
        "status": "satisfied" if all(verdicts.values()) else "needs_revision",
        "unverified": False, "duration_s": 1.25, "input_tokens": 10, "output_tokens": 5,
        "answer": f"answer {iteration}",
    }
    ev.update(extra)
    return ev  # type: ignore[return-value]


def _grader_error(iteration: int) -> RubricEvaluation:
    return _ev(
        iteration, {}, result="grader_error", status="grader_error",
        explanation="TimeoutError: timed out", input_tokens=None, output_tokens=None,
    )


def _run(run_id: str = "r1", created_at: str = "2025-01-01T00:00:00+00:00") -> RunRecord:
    return RunRecord(
        run_id=run_id, thread_id=run_id, title=f"title {run_id}", prompt="p", rubric="- a",
        worker_model="fake:w", grader_model="fake:g", max_iterations=3, status="satisfied",
        created_at=created_at, updated_at=created_at, duration_s=2.0, iterations=2,
        input_tokens=20, output_tokens=10, error=None,
    )


# -- frames -------------------------------------------------------------------------------------


def test_columns_in_documented_order() -> None:
    df = evaluations_frame([_ev(0, {"a": True})])
    assert tuple(df.columns) == EXPORT_COLUMNS
    assert EXPORT_COLUMNS[:3] == ("run_id", "run_title", "worker_model")
    # Columns are only ever appended: the answer was last until cached tokens came after it,
    # then the costs after those.
    assert EXPORT_COLUMNS[-4:] == ("answer", "cached_input_tokens", "pass_cost_usd",
                                   "criterion_cost_usd")
    assert tuple(evaluations_frame([]).columns) == EXPORT_COLUMNS


def test_columns_documented_in_module_docstring() -> None:
    import rubric_core.export as export

    assert export.__doc__ is not None
    for column in EXPORT_COLUMNS:
        assert f"\n{column} " in export.__doc__


def test_one_row_per_iteration_and_criterion() -> None:
    evs = [_ev(0, {"a": True, "b": False}), _ev(1, {"a": True, "b": True})]
    df = evaluations_frame(evs, run=_run())
    assert len(df) == 4
    assert df["iteration"].tolist() == [0, 0, 1, 1]
    assert df["criterion_index"].tolist() == [0, 1, 0, 1]
    assert df["criterion"].tolist() == ["a", "b", "a", "b"]
    assert df["passed"].tolist() == [True, False, True, True]
    assert df["gap"].isna().tolist() == [True, False, True, True]
    assert df.loc[1, "gap"] == "fix b"
    assert set(df["run_id"]) == {"r1"}
    assert set(df["run_title"]) == {"title r1"}
    assert set(df["run_status"]) == {"satisfied"}


def test_numeric_columns_stay_numeric() -> None:
    df = evaluations_frame([_ev(0, {"a": True}), _grader_error(1)])
    assert pd.api.types.is_integer_dtype(df["iteration"])
    assert pd.api.types.is_integer_dtype(df["criterion_index"])
    assert pd.api.types.is_integer_dtype(df["input_tokens"])
    assert pd.api.types.is_float_dtype(df["duration_s"])
    assert pd.api.types.is_bool_dtype(df["passed"])
    assert pd.api.types.is_bool_dtype(df["unverified"])


def test_grader_error_gives_one_row_with_empty_criterion() -> None:
    df = evaluations_frame([_ev(0, {"a": False}), _grader_error(1)])
    assert len(df) == 2
    row = df.iloc[1]
    assert row["result"] == "grader_error"
    assert pd.isna(row["criterion"])
    assert pd.isna(row["criterion_index"])
    assert pd.isna(row["passed"])
    assert pd.isna(row["input_tokens"])
    assert row["explanation"] == "TimeoutError: timed out"


def test_run_given_as_dict() -> None:
    run = {"run_id": "x", "title": "T", "worker_model": "w", "grader_model": "g",
           "status": "failed"}
    df = evaluations_frame([_ev(0, {"a": True})], run=run)
    assert df.loc[0, ["run_id", "run_title", "run_status"]].tolist() == ["x", "T", "failed"]


def test_runs_frame_orders_by_creation() -> None:
    late, early = _run("late", "2025-02-01T00:00:00+00:00"), _run("early")
    df = runs_frame([
        (late, [_ev(0, {"a": False}), _ev(1, {"a": True})]),
        (early, [_ev(0, {"a": True, "b": True})]),
    ])
    assert df["run_id"].tolist() == ["early", "early", "late", "late"]
    assert df["iteration"].tolist() == [0, 0, 0, 1]
    assert df["criterion_index"].tolist() == [0, 1, 0, 0]


def test_runs_frame_from_store(tmp_path: Path) -> None:
    with Store(tmp_path / "db.sqlite3") as store:
        ids = []
        for title in ("first", "second"):
            run = store.create_run(
                title=title, prompt="p", rubric="- a\n- b", worker_model="fake:w",
                grader_model="fake:g", max_iterations=2,
            )
            store.add_evaluation(run.run_id, _ev(0, {"a": True, "b": False}))
            store.add_evaluation(run.run_id, _grader_error(1))
            ids.append(run.run_id)
        df = runs_frame(store)
    assert df["run_id"].tolist() == [ids[0]] * 3 + [ids[1]] * 3
    assert df["run_title"].tolist()[::3] == ["first", "second"]
    assert set(df["run_status"]) == {"grader_error"}


# -- heatmap ------------------------------------------------------------------------------------


def test_heatmap_rows_criteria_columns_iterations() -> None:
    evs = [_ev(0, {"b": False, "a": True}), _grader_error(1), _ev(2, {"b": True, "a": True})]
    hm = heatmap_frame(evs)
    assert hm.index.tolist() == ["b", "a"]
    assert hm.columns.tolist() == [0, 1, 2]
    assert hm.loc["b"].tolist() == [False, None, True]
    assert hm.loc["a"].tolist() == [True, None, True]


def test_heatmap_follows_rubric_and_matches_loosely() -> None:
    evs = [_ev(0, {"Has a title.": True})]
    hm = heatmap_frame(evs, rubric="1. Cites a source\n2. has a title")
    assert hm.index.tolist() == ["Cites a source", "has a title"]
    assert hm[0].tolist() == [None, True]


def test_heatmap_picks_one_grading_run() -> None:
    evs = [_ev(0, {"a": False}, grading_run_id="old"), _ev(0, {"a": True}, grading_run_id="new")]
    assert heatmap_frame(evs).loc["a", 0] is True
    assert heatmap_frame(evs, grading_run_id="old").loc["a", 0] is False
    assert heatmap_frame([]).empty


# -- formula neutralisation and CSV -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("=SUM(A1:A2)", "'=SUM(A1:A2)", id="equals"),
        pytest.param("+1", "'+1", id="plus"),
        pytest.param("-1", "'-1", id="minus_negative_number_as_text"),
        pytest.param("@cmd", "'@cmd", id="at"),
        pytest.param("\t=1", "'\t=1", id="tab"),
        pytest.param("\r=1", "'\r=1", id="carriage_return"),
        pytest.param("=", "'=", id="equals_only"),
        pytest.param("＝1+1", "'＝1+1", id="fullwidth_equals"),
        pytest.param("＋1", "'＋1", id="fullwidth_plus"),
        pytest.param("－1", "'－1", id="fullwidth_minus"),
        pytest.param("＠SUM(1)", "'＠SUM(1)", id="fullwidth_at"),
        pytest.param("'quoted", "''quoted", id="leading_quote_escaped_too"),
        pytest.param("a=b", "a=b", id="equals_inside"),
        pytest.param(" =1", " =1", id="leading_space"),
        pytest.param("", "", id="empty"),
    ],
)
def test_neutralize_text_cells(text: str, expected: str) -> None:
    df = pd.DataFrame({"t": [text], "o": pd.Series([text], dtype=object)})
    out = neutralize_frame(df)
    assert out["t"].tolist() == [expected]
    assert out["o"].tolist() == [expected]
    assert df["t"].tolist() == [text]  # the input frame is not modified
    assert restore_cell(expected) == text


def test_numbers_and_missing_values_are_not_neutralised() -> None:
    df = pd.DataFrame({
        "n": [-1, 2], "f": [-1.5, 0.0], "none": [None, None],
        "mixed": pd.Series([-3, "=x"], dtype=object),
    })
    out = neutralize_frame(df)
    assert out["n"].tolist() == [-1, 2]
    assert out["f"].tolist() == [-1.5, 0.0]
    assert out["none"].isna().all()
    assert out["mixed"].tolist() == [-3, "'=x"]
    assert to_csv(df).splitlines()[1].startswith("-1,-1.5,")


def test_restore_cell_leaves_other_values() -> None:
    assert restore_cell("plain") == "plain"
    assert restore_cell(-1) == -1
    assert restore_cell(None) is None


TRICKY = [
    pytest.param("plain text", id="plain"),
    pytest.param("ünïcödé — 漢字 🙂", id="unicode"),
    pytest.param('she said "hi"', id="double_quotes"),
    pytest.param("a, b, c", id="commas"),
    pytest.param("line one\nline two", id="newline"),
    pytest.param("crlf\r\ninside", id="crlf"),
    pytest.param("lone\rcr", id="lone_cr"),
    pytest.param("=HYPERLINK(\"http://x\",\"y\")", id="formula"),
    pytest.param("+33 1 23", id="plus"),
    pytest.param("-42", id="negative_number_as_text"),
    pytest.param("-1.5e3", id="negative_float_as_text"),
    pytest.param("@SUM(1)", id="at"),
    pytest.param("\tindented", id="tab"),
    pytest.param("\rcarriage", id="carriage_return"),
    pytest.param("=", id="equals_only"),
    pytest.param("'", id="quote_only"),
    pytest.param("''=x", id="quotes_then_equals"),
    pytest.param("'=already escaped?", id="quote_equals"),
    pytest.param("  spaced  ", id="surrounding_spaces"),
    pytest.param("NaN", id="nan_word"),
    pytest.param("null", id="null_word"),
    pytest.param("0042", id="leading_zeros"),
    pytest.param("TRUE", id="true_word"),
    pytest.param(",", id="comma_only"),
    pytest.param('"', id="double_quote_only"),
]


@pytest.mark.parametrize("text", TRICKY)
def test_csv_round_trip_gives_back_the_text(text: str) -> None:
    ev = _ev(0, {text: False}, explanation=text, answer=text, grading_run_id=text)
    ev["criteria"][0]["gap"] = text
    df = evaluations_frame([ev], run={"run_id": text, "title": text})
    csv = to_csv(df)
    back = restore_frame(
        pd.read_csv(io.StringIO(csv), dtype=dict.fromkeys(TEXT_COLUMNS, str),
                    keep_default_na=False)
    )
    for column in ("run_id", "run_title", "grading_run_id", "criterion", "gap", "explanation",
                   "answer"):
        assert back.loc[0, column] == text, column
    assert back.loc[0, "duration_s"] == 1.25
    assert back.loc[0, "iteration"] == 0


def test_csv_round_trip_all_tricky_strings_in_one_frame() -> None:
    texts = [p.values[0] for p in TRICKY]
    df = evaluations_frame([_ev(0, dict.fromkeys(texts, True))])
    back = pd.read_csv(io.StringIO(to_csv(df)), dtype={"criterion": str},
                       keep_default_na=False)
    assert [restore_cell(v) for v in back["criterion"]] == texts
    assert back["criterion_index"].tolist() == list(range(len(texts)))


def test_csv_cells_cannot_start_a_formula() -> None:
    texts = [p.values[0] for p in TRICKY]
    df = pd.DataFrame({"t": texts})
    parsed = pd.read_csv(io.StringIO(to_csv(df)), dtype=str, keep_default_na=False)
    for cell in parsed["t"]:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))


def test_to_json_is_raw_records() -> None:
    df = evaluations_frame([_ev(0, {"=a": False}), _grader_error(1)], run=_run())
    records = json.loads(to_json(df))
    assert len(records) == 2
    assert list(records[0]) == list(EXPORT_COLUMNS)
    assert records[0]["criterion"] == "=a"
    assert records[0]["passed"] is False
    assert records[0]["duration_s"] == 1.25
    assert records[1]["criterion"] is None
    assert records[1]["input_tokens"] is None
    assert "ünï" in to_json(pd.DataFrame({"t": ["ünï"]}))


# -- diffs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "ops"),
    [
        pytest.param("same text", "same text", [("equal", "same text")], id="identical"),
        pytest.param(
            "the cat sat", "the dog sat",
            [("equal", "the "), ("delete", "cat"), ("insert", "dog"), ("equal", " sat")],
            id="replace_word",
        ),
        pytest.param(
            "a b", "a new b", [("equal", "a "), ("insert", "new "), ("equal", "b")],
            id="insert_word",
        ),
        pytest.param("", "hello", [("insert", "hello")], id="from_empty"),
        pytest.param("hello", "", [("delete", "hello")], id="to_empty"),
        pytest.param("", "", [], id="both_empty"),
        pytest.param(
            "a b", "a\n\nb", [("equal", "a"), ("delete", " "), ("insert", "\n\n"), ("equal", "b")],
            id="whitespace_kept",
        ),
    ],
)
def test_iteration_diff_ops(a: str, b: str, ops: list[tuple[str, str]]) -> None:
    assert iteration_diff(a, b) == ops


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("One two three.\nFour five.", "One 2 three.\n\nFour five six.", id="prose"),
        pytest.param("  lead and trail  ", "lead\tand trail", id="edge_whitespace"),
        pytest.param("x " * 300, "x " * 150 + "y " + "x " * 150, id="long_repetitive"),
    ],
)
def test_iteration_diff_rebuilds_both_texts(a: str, b: str) -> None:
    ops = iteration_diff(a, b)
    assert "".join(t for op, t in ops if op != "insert") == a
    assert "".join(t for op, t in ops if op != "delete") == b
    assert all(x[0] != y[0] for x, y in itertools.pairwise(ops))


def test_criteria_changes() -> None:
    a = _ev(0, {"fixed": False, "regressed": True, "failing": False, "passing": True,
                "dropped": False})
    b = _ev(1, {"Passing.": True, "Failing": False, "Regressed": False, "Fixed": True,
                "added": True})
    assert criteria_changes(a, b) == {
        "fixed": ["Fixed"], "regressed": ["Regressed"],
        "still_failing": ["Failing"], "still_passing": ["Passing."],
    }


def test_criteria_changes_with_grader_error() -> None:
    empty = {"fixed": [], "regressed": [], "still_failing": [], "still_passing": []}
    assert criteria_changes(_grader_error(0), _ev(1, {"a": True})) == empty


# --------------------------------------------------------------------------- streaming export


def _evaluations() -> list[RubricEvaluation]:
    return [_ev(0, {"c1": True, "c2": False}, answer="=first draft", explanation="＋x"),
            _ev(1, {"c1": True, "c2": True}, answer="second\ndraft")]


def test_the_answer_is_written_once_per_iteration() -> None:
    frame = evaluations_frame(_evaluations())
    answers = [a if isinstance(a, str) else None for a in frame["answer"]]
    assert answers == ["=first draft", None, "second\ndraft", None]
    error = evaluations_frame([_ev(0, {}, result="grader_error", answer="a")])
    assert error["answer"].tolist() == ["a"]  # the lone row of a pass with no criteria


def test_write_csv_streams_the_same_text_as_to_csv() -> None:
    run = {"run_id": "r1", "title": "@title", "worker_model": "w", "grader_model": "g",
           "status": "satisfied"}
    out = io.StringIO()
    count = write_csv(export_rows([(run, _evaluations())]), out)
    assert count == 4
    assert out.getvalue() == to_csv(evaluations_frame(_evaluations(), run=run))
    back = restore_frame(pd.read_csv(io.StringIO(out.getvalue()), dtype=str,
                                     keep_default_na=False))
    assert back["answer"].tolist() == ["=first draft", "", "second\ndraft", ""]
    assert back["run_title"].tolist() == ["@title"] * 4


def test_write_json_streams_records() -> None:
    out = io.StringIO()
    assert write_json(export_rows([({"run_id": "r"}, _evaluations())]), out) == 4
    records = json.loads(out.getvalue())
    assert [r["criterion"] for r in records] == ["c1", "c2", "c1", "c2"]
    assert records[0]["answer"] == "=first draft" and records[1]["answer"] is None
    assert json.loads(to_json(evaluations_frame(_evaluations())))[0]["answer"] == "=first draft"


def test_exported_cells_are_scrubbed_of_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPORT_TEST_API_KEY", "configured-secret-value")
    ev = _ev(0, {"c1": False}, explanation="echo: Bearer abcdefgh123456",
             answer="my key is configured-secret-value")
    ev["criteria"][0]["gap"] = "sk-" + "q" * 24
    out = io.StringIO()
    write_csv(export_rows([({"run_id": "r"}, [ev])]), out)
    text = out.getvalue()
    assert "configured-secret-value" not in text and "abcdefgh123456" not in text
    assert "q" * 24 not in text and text.count("[redacted]") == 3


def test_export_rows_from_a_store_reads_runs_in_creation_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite3").open()
    try:
        ids = []
        for n in range(3):
            record = store.create_run(title=f"t{n}", prompt="p", rubric="- c1",
                                      worker_model="demo", grader_model="rules",
                                      max_iterations=3)
            store.add_evaluation(record.run_id, _ev(0, {"c1": True}, answer=f"a{n}"))
            ids.append(record.run_id)
        rows = list(export_rows(store))
    finally:
        store.close()
    assert [row[0] for row in rows] == ids
    assert [row[EXPORT_COLUMNS.index("answer")] for row in rows] == ["a0", "a1", "a2"]


def test_criterion_rows_is_the_one_flattening() -> None:
    from rubric_core.export import criterion_rows, pass_number

    flags = {"agreement": None, "unstable": False, "regressed": False}
    ev = _ev(2, {"c1": True, "c2": False})
    assert criterion_rows(ev) == [
        {"index": 0, "criterion": "c1", "passed": True, "gap": None, **flags},
        {"index": 1, "criterion": "c2", "passed": False, "gap": "fix c2", **flags},
    ]
    assert pass_number(ev) == 3  # people count passes from 1; the seed's iteration is 0-based
    assert criterion_rows(_ev(0, {})) == [
        {"index": None, "criterion": None, "passed": None, "gap": None, **flags}]
    agreements = (1.0, 0.6)
    repeated = {**ev, "unstable": ["c2"], "regressed": ["c2"], "criteria": [
        {**c, "agreement": a} for c, a in zip(ev["criteria"], agreements, strict=True)]}
    flat = [(r["agreement"], r["unstable"], r["regressed"]) for r in criterion_rows(repeated)]
    assert flat == [(1.0, False, False), (0.6, True, True)]


def test_cached_tokens_column_and_json_calls_per_pass(tmp_path: Path) -> None:
    from rubric_core.export import JSON_COLUMNS

    evs = [{**_ev(0, {"a": False, "b": True}), "cached_input_tokens": 0},
           {**_ev(1, {"a": True, "b": True}), "cached_input_tokens": 900}]
    grading_run = evs[0]["grading_run_id"]
    calls = [{"role": "worker", "iteration": 0, "grading_run_id": None, "model": "w"},
             {"role": "grader", "iteration": 0, "grading_run_id": grading_run, "model": "g"},
             {"role": "worker", "iteration": 1, "grading_run_id": grading_run, "model": "w"},
             {"role": "grader", "iteration": 1, "grading_run_id": grading_run, "model": "g"},
             {"role": "worker", "iteration": 2, "grading_run_id": grading_run, "model": "w",
              "error": "Bearer sk-abcdefghijklmnopqrstuvwxyz123456 refused"}]
    plain = list(export_rows([(_run(), evs)]))
    cached_at = EXPORT_COLUMNS.index("cached_input_tokens")
    assert [row[cached_at] for row in plain] == [0, 0, 900, 900]
    assert evaluations_frame(evs)["cached_input_tokens"].tolist() == [0, 0, 900, 900]
    traced = list(export_rows([(_run(), evs)], calls={"r1": calls}))
    assert [row[:-1] for row in traced] == plain  # the same rows, one field more
    shown = [[(c["role"], c["iteration"]) for c in row[-1]] if row[-1] else None
             for row in traced]
    assert shown == [[("worker", 0), ("grader", 0)], None,
                     [("worker", 1), ("grader", 1)], [("worker", 2)]]
    assert "sk-abcdefghijklmnop" not in json.dumps(traced[-1][-1])  # scrubbed again on export
    out = io.StringIO()
    write_json(traced, out, JSON_COLUMNS)
    assert [r["calls"] is not None for r in json.loads(out.getvalue())] == [True, False, True,
                                                                           True]
