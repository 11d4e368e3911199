"""Re-grading: each grading recorded once, Stop and Resume, retried errors, bounded requests
in flight, and few-shot examples that never show an answer its own label."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
from holding_server import HoldingServer
from openai_server import DelayedServer, FakeOpenAI, error, verdict

from rubric_core.lab import (
    GraderConfig,
    create_regrade,
    parse_answers,
    read_job,
    retry_errors,
    run_regrade,
)
from rubric_core.lab.regrade import few_shot_examples
from rubric_core.store import ItemLabel, RegradeResult

if TYPE_CHECKING:
    from rubric_core.store import Store

CRITERION = "answers the question"


def _answers(count: int, name: str = "qa") -> Any:
    rows = "".join(f"q{i},question {i},reply {i}\n" for i in range(count))
    return parse_answers("id,request,answer\n" + rows, name=name)


def _config(base_url: str, **changes: Any) -> GraderConfig:
    return GraderConfig(rubric=f"- {CRITERION}", grader_model="openai-compatible:g",
                        base_url=base_url, **changes)


def _rows(store: Store, job_id: str) -> list[tuple[int, str, int]]:
    return [r.key for r in store.regrade_results(job_id)]


def test_a_result_is_recorded_once_per_key(store: Store) -> None:
    job = create_regrade(store, _answers(2), [GraderConfig(rubric="- c")])
    first = RegradeResult(0, "q0", 0, "satisfied", "ok", [{"name": "c", "passed": True}], [],
                          None, 1, 2, 0.1)
    second = first._replace(result="needs_revision")
    assert store.record_regrade_result(job.job_id, first) is True
    assert store.record_regrade_result(job.job_id, second) is False  # a second resumer
    [kept] = store.regrade_results(job.job_id)
    assert kept.result == "satisfied" and store.graded_keys(job.job_id, ["q0", "q1"]) == {
        (0, "q0", 0)}


def test_every_answer_is_graded_under_every_configuration(store: Store) -> None:
    server = DelayedServer(0.01, verdict("satisfied", (), (CRITERION,)))
    with server.fake:
        job = create_regrade(store, _answers(6), [
            _config(server.fake.base_url), _config(server.fake.base_url, grader_repeats=2)])
        events = list(run_regrade(store, job.job_id, concurrency=3))
    assert events[-1]["type"] == "regrade_finished" and events[-1]["status"] == "finished"
    assert len(_rows(store, job.job_id)) == 6 + 12 == len(server.fake.request_times)
    view = read_job(store, job.job_id)
    assert {v.result for cfg in view.verdicts for v in cfg.values()} == {"satisfied"}
    assert all(v.repeats == 2 for v in view.verdicts[1].values())
    assert store.get_regrade_job(job.job_id).status == "finished"  # type: ignore[union-attr]
    assert server.peak <= 3


def test_stop_then_resume_grades_each_answer_exactly_once(store: Store) -> None:
    server = HoldingServer(free=5, delay_s=0.01)
    stop = threading.Event()
    with server.fake:
        job = create_regrade(store, _answers(12), [_config(server.fake.base_url)])
        events = run_regrade(store, job.job_id, concurrency=2, stop=stop)
        for event in events:
            if event["type"] == "regrade_progress" and event["done"] == 5:
                server.wait_held(2)  # both slots are calling, held: nothing more can end
                stop.set()
        assert event["type"] == "regrade_finished" and event["status"] == "stopped"
        assert len(_rows(store, job.job_id)) == 5  # the held gradings were not recorded
        assert store.get_regrade_job(job.job_id).status == "stopped"  # type: ignore[union-attr]
        server.release()
        calls = server.calls
        resumed = list(run_regrade(store, job.job_id, concurrency=2))
    assert resumed[-1]["status"] == "finished"  # type: ignore[typeddict-item]
    assert sorted(_rows(store, job.job_id)) == sorted((0, f"q{i}", 0) for i in range(12))
    assert server.calls - calls == 12 - 5  # the resume graded only what was not recorded


def test_a_failed_grading_is_recorded_then_retried(store: Store) -> None:
    with FakeOpenAI(default=verdict("satisfied", (), (CRITERION,))) as server:
        server.enqueue(error(400, "bad request"))  # not transient: the grading fails
        job = create_regrade(store, _answers(3), [_config(server.base_url)])
        events = list(run_regrade(store, job.job_id, concurrency=1))
        graded = [e for e in events if e["type"] == "item_graded"]
        assert [e["result"] for e in graded].count("grader_error") == 1
        assert "bad request" in str([e["error"] for e in graded])
        assert store.regrade_counts(job.job_id) == {0: (3, 1)}
        assert list(run_regrade(store, job.job_id))[-1]["status"] == "finished"  # type: ignore[typeddict-item]
        assert store.regrade_counts(job.job_id) == {0: (3, 1)}  # not retried unless asked
        assert retry_errors(store, job.job_id) == 1
        list(run_regrade(store, job.job_id))
    assert store.regrade_counts(job.job_id) == {0: (3, 0)}


def test_concurrency_bounds_the_requests_in_flight(tmp_path: Any) -> None:
    from rubric_core.store import Store

    server = DelayedServer(0.05, verdict("satisfied", (), (CRITERION,)))
    with server.fake, Store(tmp_path / "db.sqlite3") as store:
        job = create_regrade(store, _answers(24), [_config(server.fake.base_url,
                                                           grader_repeats=2)])
        list(run_regrade(store, job.job_id, concurrency=4))
    assert server.peak == 4


def test_few_shot_examples_never_show_an_answer_its_own_label() -> None:
    config = GraderConfig(rubric="- c\n- d", few_shot=True)
    labels = [ItemLabel(f"q{i}", name, who, i % 2 == 0)
              for i in range(12) for name in ("c", "d") for who in ("Ana", "Ben")]
    labels.append(ItemLabel("q0", "c", "Cy", False))  # people disagree on q0 / c: not shown
    answers = {f"q{i}": f"reply {i}" for i in range(12)}
    examples = few_shot_examples(config, labels, answers)
    assert len(examples) == 9  # MAX_EXAMPLES + 1: one left out still leaves eight
    assert ("q0", "c") not in {(e.key[0], e.criterion) for e in examples}
    assert {e.criterion for e in examples} == {"c", "d"}
    assert not examples[0].passed  # failing verdicts first: they teach the most


def test_a_few_shot_grading_is_sent_other_answers_labels_only(tmp_path: Any) -> None:
    from rubric_core.store import Store

    prompts: list[str] = []

    def grade(body: dict[str, Any]) -> Any:
        prompts.append(body["messages"][0]["content"])
        return verdict("satisfied", (), (CRITERION,))

    text = "id,request,answer,label:" + CRITERION + "\n" + "".join(
        f"q{i},question {i},reply-{i}-text,{'pass' if i % 2 else 'fail'}\n" for i in range(4))
    with FakeOpenAI(default=grade) as server, Store(tmp_path / "db.sqlite3") as store:
        job = create_regrade(store, parse_answers(text, name="fs"),
                             [_config(server.base_url, few_shot=True)])
        list(run_regrade(store, job.job_id, concurrency=1))
    assert len(prompts) == 4
    for index, prompt in enumerate(prompts):
        assert "<labelled_examples>" in prompt
        assert f"reply-{index}-text" not in prompt  # its own answer is never an example
        assert all(f"reply-{other}-text" in prompt for other in range(4) if other != index)


@pytest.mark.parametrize("concurrency", [0, 65])
def test_a_bad_concurrency_is_refused(store: Store, concurrency: int) -> None:
    job = create_regrade(store, _answers(1), [GraderConfig(rubric="- c")])
    with pytest.raises(ValueError, match="concurrency must be from 1 to 64"):
        list(run_regrade(store, job.job_id, concurrency=concurrency))
