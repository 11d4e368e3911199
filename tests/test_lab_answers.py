"""Answer sets: uploads checked whole (row and column named), secrets scrubbed, versions kept,
and sets made from stored runs and experiments with people's labels."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from rubric_core.datasets import MAX_CELL_CHARS, MAX_DATASET_BYTES
from rubric_core.lab import (
    AnswerSetError,
    answers_from_experiment,
    answers_from_runs,
    bundled_answer_set,
    parse_answers,
    read_answers_file,
)
from rubric_core.redact import REDACTED, register_secret
from rubric_core.store import AnswerItem, ItemLabel, Store

if TYPE_CHECKING:
    from pathlib import Path

GOOD_CSV = (
    "id,request,answer,label:The answer is short,label@Ana:mentions spring\n"
    'q1,Write a haiku,"Spring rain, soft",pass,yes\n'
    "q2,Write a haiku,Autumn leaves,fail,\n"
)


def test_a_csv_with_labels_is_read_in_order() -> None:
    answers = parse_answers(GOOD_CSV, name="haiku", labeller="Bo")
    assert answers.items == (
        AnswerItem("q1", "Write a haiku", "Spring rain, soft", None, "upload"),
        AnswerItem("q2", "Write a haiku", "Autumn leaves", None, "upload"),
    )
    assert answers.labels == (
        ItemLabel("q1", "The answer is short", "Bo", True),
        ItemLabel("q1", "mentions spring", "Ana", True),
        ItemLabel("q2", "The answer is short", "Bo", False),
    )
    assert answers.labellers() == ["Bo", "Ana"]


def test_jsonl_bom_and_default_ids() -> None:
    text = "\ufeff" + "\n".join(json.dumps(r) for r in (
        {"request": "r", "answer": "a", "label:c": True},
        {"request": "r", "answer": "b", "label:c": 0},
    )) + "\n"
    answers = parse_answers(text.encode("utf-8"))
    assert [i.id for i in answers.items] == ["1", "2"]
    assert [lb.passed for lb in answers.labels] == [True, False]


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    with big.open("wb") as handle:
        handle.truncate(MAX_DATASET_BYTES + 1)  # sparse: nothing written, nothing read
    with pytest.raises(AnswerSetError, match="limit is 20 MB"):
        read_answers_file(big)


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("request,answer\nr,a\nr,\n", "row 3, column 'answer': empty",
                 id="empty_answer"),
    pytest.param("answer\na\n", "row 1: there is no 'request' column", id="no_request_column"),
    pytest.param("request,answer,model\nr,a,gpt\n", "row 1, column 3: unknown column 'model'",
                 id="unknown_column_refused_not_dropped"),
    pytest.param("request,answer,label:c\nr,a,ok\nr,b,pass\n",
                 "row 2, column 'label:c': 'ok' is not a verdict", id="bad_verdict"),
    pytest.param("id,request,answer\nx,r,a\nx,r,b\n", "row 3, column 'id': 'x' is used by",
                 id="duplicate_id"),
    pytest.param("id,request,answer\nsk-abcdefghijklmnopqrstuvwx,r,a\n",
                 "row 2, column 'id': the id holds an API key", id="key_shaped_id"),
    pytest.param('request,answer\nr,"never closed\n', "row 2: not readable as CSV",
                 id="open_quote"),
    pytest.param("request,answer\nr,a,extra\n", "row 2: 3 cells but the header has 2",
                 id="too_many_cells"),
    pytest.param("request,answer,label:a\x1bb\nr,a,pass\n", "row 1, column 3: the column name "
                 "holds a control character", id="control_char_in_column"),
    pytest.param("request,answer,label:sk-abcdefghijklmnopqrstuvwx\nr,a,pass\n",
                 "row 1, column 3: the column name holds an API key", id="key_in_column"),
    pytest.param('{"request": "r", "answer": "a"}\n[1]\n', "row 2: a JSON list",
                 id="jsonl_not_object"),
    pytest.param('{"request": "r", "answer": {"x": 1}}\n', "row 1, column 'answer': nested",
                 id="jsonl_nested"),
    pytest.param("request,answer\nr," + "x" * (MAX_CELL_CHARS + 1) + "\n",
                 "row 2, column 'answer': 100,001 characters", id="cell_too_long"),
    pytest.param(b"request,answer\nr,\xff\n", "row 2: the file is not UTF-8", id="not_utf8"),
    pytest.param("", "the answer file is empty", id="empty_file"),
    pytest.param("request,answer\n", "the answer file has no rows", id="header_only"),
])
def test_bad_uploads_are_refused_whole_naming_row_and_column(text: str | bytes,
                                                              message: str) -> None:
    with pytest.raises(AnswerSetError) as caught:
        parse_answers(text)
    assert message in str(caught.value)


def test_an_upload_is_stored_scrubbed_and_versioned(store: Store) -> None:
    secret = "s3cr3t-value-for-the-lab-0123456789"
    register_secret(secret)
    text = ("id,request,answer,label@Ana:c\n"
            f"q1,use {secret},my key is sk-abcdefghijklmnopqrstuvwx and {secret},pass\n")
    answers = parse_answers(text, name="leaky")
    assert store.save_answer_set(answers) == 1
    assert store.save_answer_set(parse_answers(text, name="leaky")) == 1  # unchanged: kept
    [item] = store.answer_items("leaky", 1)
    assert secret not in item.request + item.answer and "sk-abcdef" not in item.answer
    assert REDACTED in item.answer and REDACTED in item.request
    assert store.answer_labels("leaky", 1) == [ItemLabel("q1", "c", "Ana", True)]
    changed = parse_answers(text.replace("pass", "fail"), name="leaky")
    assert store.save_answer_set(changed) == 2
    assert [v.version for v in store.answer_set_versions("leaky")] == [1, 2]
    assert store.answer_set_info("leaky").label_count == 1


def test_the_bundled_set_has_two_people_on_every_answer() -> None:
    answers = bundled_answer_set()
    assert len(answers.items) == 32 and answers.labellers() == ["Ana", "Ben"]
    assert len(answers.labels) == 32 * 2 * 4


def _graded_run(store: Store, prompt: str, answers: list[str], rubric: str = "- c") -> str:
    run = store.create_run(title=prompt, prompt=prompt, rubric=rubric, worker_model="demo",
                           grader_model="rules", max_iterations=3)
    for i, answer in enumerate(answers):
        store.add_evaluation(run.run_id, {
            "grading_run_id": "g", "iteration": i, "result": "needs_revision",
            "explanation": "", "criteria": [{"name": "c", "passed": False, "gap": "x"}],
            "status": "needs_revision", "unverified": False, "duration_s": 0.1,
            "input_tokens": None, "output_tokens": None, "answer": answer})
    store.finish_run(run.run_id, status="max_iterations_reached")
    return run.run_id


def test_final_answers_of_runs_with_their_labels(store: Store) -> None:
    first = _graded_run(store, "p1", ["draft", "final"])
    second = _graded_run(store, "p2", ["only"], rubric="- other")
    store.set_label(first, 1, "c", "Ana", agree=False)  # on the final answer: the person passes
    store.set_label(first, 0, "c", "Ana", agree=True)  # on a draft: not in the set
    answers = answers_from_runs(store, name="all")
    assert [(i.id, i.answer) for i in answers.items] == [(first, "final"), (second, "only")]
    assert answers.labels == (ItemLabel(first, "c", "Ana", True),)
    only = answers_from_runs(store, name="r", rubric="- other")
    assert [i.id for i in only.items] == [second]
    with pytest.raises(AnswerSetError, match="no stored run"):
        answers_from_runs(store, name="none", text="nothing like it")


def test_an_experiments_answers_final_or_every_pass(store: Store) -> None:
    from rubric_core.datasets import parse_dataset
    from rubric_core.experiments import create_experiment, run_experiment
    from rubric_core.settings import ExperimentConfig

    rows = parse_dataset("id,prompt,rubric\nh,Write a haiku about spring.,- The poem has "
                         "three lines\n", name="tiny")
    exp = create_experiment(store, rows, [ExperimentConfig()])
    list(run_experiment(store, exp.experiment_id))
    final = answers_from_experiment(store, exp.experiment_id)
    every = answers_from_experiment(store, exp.experiment_id, every_pass=True)
    assert [i.id for i in final.items] == ["h/0/0"]
    assert len(every.items) >= 1 and all(i.id.startswith("h/0/0/p") for i in every.items)
    assert every.items[-1].answer == final.items[0].answer
    with pytest.raises(KeyError):
        answers_from_experiment(store, "nope")
