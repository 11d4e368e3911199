"""The Rubric lab page, driven with AppTest on a real SQLite file: the whole offline loop (bundled
set, labelling, re-grade, health, compare, refine, before/after, downloads), a bad upload
refused whole, and Stop and Resume of a re-grade run in the background, seen and stopped from a
second session, with no answer graded twice."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from holding_server import CRITERION, HoldingServer
from streamlit.testing.v1 import AppTest
from test_app import navigation_routing as navigation_routing

from rubric_core import app_support as sup
from rubric_core.lab import BUNDLED_NAME, GraderConfig, create_regrade, criterion_health
from rubric_core.store import Store

if TYPE_CHECKING:
    import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SUNLIGHT = "The answer mentions sunlight"




@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "db.sqlite3"


def _session(db_path: Path, **state: Any) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    at.switch_page("pages/lab.py").run()
    assert not at.exception, at.exception
    return at


def _run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    return at


def _tab(at: AppTest, label: str) -> AppTest:
    at.session_state["lab_tab"] = label
    return _run(at)


def _texts(elements: Any) -> str:
    return "\n".join(str(e.value) for e in elements)


def _bars(at: AppTest) -> str:
    return "\n".join(p.proto.text for p in at.get("progress"))


def _frame(at: AppTest, column: str) -> pd.DataFrame:
    """The page's table with this column (only the open tab's tables are drawn)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _finish(at: AppTest) -> str:
    """Wait for the page's background re-grade to end (it is a thread of this process)."""
    job_id = at.session_state["lab_job"]
    assert sup.wait_regrade(job_id, timeout_s=60.0), "the re-grade did not end"
    _run(at)
    return str(job_id)


def test_the_whole_offline_loop(db_path: Path) -> None:
    at = _session(db_path, labeller="Cy")
    at.button(key="lab_load_bundled").click()
    _run(at)
    assert "bundled-plants" in _texts(at.success)

    # label: a verdict is stored with the set, and the cursor moves to the next criterion
    assert at.radio(key="lab_crit").value == "The answer is one sentence"
    assert at.button(key="lab_pass").proto.shortcut.upper() == "P"
    at.button(key="lab_fail").click()
    _run(at)
    assert at.radio(key="lab_crit").value == SUNLIGHT
    with Store(db_path) as store:
        mine = [lb for lb in store.answer_labels(BUNDLED_NAME, 1) if lb.labeller == "Cy"]
    assert [(lb.item_id, lb.criterion, lb.passed) for lb in mine] == [
        ("a01", "The answer is one sentence", False)]

    # re-grade with the saved rubric v1 and the offline grader
    _tab(at, "Re-grade")
    assert at.selectbox(key=sup.lab_config_key(0, "rubric")).value == "bundled-plants"
    at.button(key="lab_start").click()
    _run(at)
    job_id = _finish(at)
    assert "32/32 gradings" in _bars(at)
    assert "Re-grade finished" in _texts(at.success)

    # health flags the weak criterion, with κ, its interval and n, people vs people beside it
    health = _frame(_tab(at, "Health"), "κ with people").set_index("criterion")
    assert health.loc[SUNLIGHT, "flags"] == "disagrees"
    assert health.loc["The answer is at most 60 words", "flags"] == "never_fails"
    assert health.loc[SUNLIGHT, "κ with people"] == "0.24"
    assert health.loc[SUNLIGHT, "κ 95% interval"].startswith("[")
    assert health.loc[SUNLIGHT, "n"] == 64 and health.loc[SUNLIGHT, "people vs people κ"] != "—"
    # and what the gradings cost: the offline grader is free and reports no tokens
    cost = _frame(at, "priced as uncached")
    assert list(cost["configuration"]) == ["1. rules · bundled-plants v1"]
    assert list(cost["cost"]) == ["$0"] and cost["tokens in"].isna().all()

    # labelling shows the disagreements with the grader in one click
    _tab(at, "Label")
    at.segmented_control(key="lab_show").set_value("disagreeing with the grader")
    _run(at)
    captions = list(at.radio(key="lab_crit").proto.captions)
    assert captions[0] == "you: fail · Ana: pass, Ben: pass · grader: pass"  # my verdict on a01
    at.button(key="lab_next").click()
    _run(at)
    captions = list(at.radio(key="lab_crit").proto.captions)
    assert any("Ana: pass" in c and "grader: fail — " in c for c in captions), captions
    with Store(db_path) as store:  # the answers where someone's verdict is not the grader's
        labels = {(lb.item_id, lb.criterion, lb.passed)
                  for lb in store.answer_labels(BUNDLED_NAME, 1)}
        differ = {r.item_id for r in store.regrade_results(job_id) for c in r.criteria
                  if (r.item_id, c["name"], not c["passed"]) in labels}
    assert 10 < len(differ) < 32
    assert f"Answer 2 of {len(differ)}**" in _texts(at.markdown)

    # refine: the demo refiner's suggestions, edited and accepted, then graded at once
    _tab(at, "Refine")
    assert at.selectbox(key="lab_ref_crit").value == SUNLIGHT
    at.button(key="lab_suggest").click()
    _run(at)
    first = at.text_area(key="lab_rewrite_0").value
    assert "sunlight, light, sun" in first
    at.text_area(key="lab_rewrite_0").input(first.replace("sunshine", "sunshine, sunny"))
    at.button(key="lab_accept_0").click()
    _run(at)
    assert "added as configuration 2" in _texts(at.success)
    _finish(at)
    before_after = _frame(_tab(at, "Refine"), "κ B").set_index("criterion (A)")
    row = before_after.loc[SUNLIGHT]
    assert "sunny" in row["criterion (B)"]
    assert float(row["κ B"]) > float(row["κ A"]) + 0.5
    assert "κ with people 0.24 →" in _texts(at.markdown)
    with Store(db_path) as store:
        assert [r["version"] for r in store.rubric_versions("bundled-plants")] == [1, 2]
        assert store.regrade_counts(job_id) == {0: (32, 0), 1: (32, 0)}  # graded once each
        assert not criterion_health(store, job_id).for_config(1)[1].flags

    # compare: the flipped verdicts of that criterion, with both gaps side by side
    _tab(at, "Compare")
    assert at.selectbox(key="lab_cmp_criterion").value == SUNLIGHT
    flips = _frame(at, "A's gap")
    assert len(flips) >= 10 and set(flips["A"]) == {"fail"} and set(flips["B"]) == {"pass"}
    assert flips["A's gap"].str.len().min() > 0 and "Ana:" in flips["people"].iloc[0]
    assert "κ with people 0.24" in _texts(at.caption)

    # downloads: every grading as rows, people's verdicts beside them
    _tab(at, "Export")
    assert at.get("download_button")
    rows = list(csv.DictReader(io.StringIO(
        sup.regrade_download(Store(db_path), job_id, "csv")().decode())))
    assert len(rows) == 2 * 32 * 4 and json.loads(rows[1]["people"]) == {"Ana": "pass",
                                                                         "Ben": "pass"}
    assert len(json.loads(sup.regrade_download(Store(db_path), job_id, "json")())) == len(rows)


def test_a_bad_upload_is_refused_whole_and_nothing_is_stored(db_path: Path) -> None:
    at = _session(db_path)
    bad = b"id,request,answer,label:fine\n1,q,a,pass\n2,q,b,maybe\n"
    at.file_uploader(key="lab_upload").set_value(("answers.csv", bad, "text/csv"))
    _run(at)
    at.button(key="lab_store_upload").click()
    _run(at)
    error = _texts(at.error)
    assert "Nothing was stored" in error and "row 3" in error and "label:fine" in error
    with Store(db_path) as store:
        assert store.list_answer_sets() == []
    good = bad.replace(b"maybe", b"fail")
    at.file_uploader(key="lab_upload").set_value(("answers.csv", good, "text/csv"))
    _run(at)
    at.button(key="lab_store_upload").click()
    _run(at)
    assert "Stored answer set 'answers' version 1 (2 answers, 2 people's verdicts" in _texts(
        at.success)
    assert at.selectbox(key="lab_set").value == "answers"


def test_stop_and_resume_through_the_page_grade_each_answer_once(db_path: Path) -> None:
    server = HoldingServer(free=5, delay_s=0.01)
    rows = "".join(f"q{i},question {i},reply-{i}-end\n" for i in range(12))
    with server.fake:
        at = _session(db_path, base_url=server.fake.base_url,
                      **{sup.lab_config_key(0, "grader"): "openai-compatible:g"})
        at.file_uploader(key="lab_upload").set_value(
            ("qa.csv", f"id,request,answer\n{rows}".encode(), "text/csv"))
        _run(at)
        at.button(key="lab_store_upload").click()
        _run(_tab(at, "Re-grade"))
        at.text_area(key=sup.lab_config_key(0, "text")).input(f"- {CRITERION}")
        at.number_input(key="lab_concurrency").set_value(2)
        _run(at)
        at.button(key="lab_start").click()
        _run(at)  # returns while the re-grade runs on in its thread
        job_id = at.session_state["lab_job"]
        server.wait_held(2)  # five graded, both slots held: nothing more can end
        assert sup.regrade_active(job_id)

        # a second browser session sees it running, and its Stop stops it
        other = _session(db_path, base_url=server.fake.base_url)
        assert other.selectbox(key="lab_job").value == job_id
        assert "5/12 gradings" in _bars(other)
        assert not other.button(key="lab_stop").disabled
        assert other.button(key="lab_resume").disabled
        other.button(key="lab_stop").click()
        _run(other)
        assert not sup.regrade_active(job_id)
        assert "Re-grade stopped" in _texts(other.info)
        with Store(db_path) as store:
            assert store.get_regrade_job(job_id).status == "stopped"  # type: ignore[union-attr]
            recorded = {r.item_id for r in store.regrade_results(job_id)}
        assert len(recorded) == 5  # the held gradings were cancelled, not recorded

        # Resume (in the first session) grades only what was not recorded
        server.release()
        graded_before = server.calls
        _run(at)
        assert not at.button(key="lab_resume").disabled
        at.button(key="lab_resume").click()
        _run(at)
        _finish(at)
        asked = [json.dumps(body) for body in server.fake.requests[graded_before:]]
    assert server.calls - graded_before == 12 - 5
    assert not any(f"reply-{i.removeprefix('q')}-end" in body for body in asked
                   for i in recorded)
    with Store(db_path) as store:
        keys = [r.key for r in store.regrade_results(job_id)]
        assert sorted(keys) == sorted((0, f"q{i}", 0) for i in range(12))  # each once
        assert store.get_regrade_job(job_id).status == "finished"  # type: ignore[union-attr]
    assert "12/12 gradings" in _bars(at)
    assert at.button(key="lab_resume").disabled and at.button(key="lab_stop").disabled


def test_a_regrade_another_process_grades_is_followed_not_resumed(db_path: Path) -> None:
    """A real ``rubric-studio worker`` grades the re-grade's items (queued by another driver):
    the page follows it; once the worker has stopped, the page offers Resume."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys

    from rubric_core.background import work_loop
    from rubric_core.engine import launch_engine
    from rubric_core.engine import queues as rq

    server = HoldingServer(free=0, delay_s=0.01)
    at = _session(db_path)
    at.button(key="lab_load_bundled").click()
    _run(_tab(at, "Re-grade"))
    with server.fake:
        with Store(db_path) as store:
            job = create_regrade(store, BUNDLED_NAME, [GraderConfig(
                rubric=f"- {CRITERION}", grader_model="openai-compatible:g",
                base_url=server.fake.base_url)], set_version=1)
            launch_engine(store, every_queue=False)  # queues; grades nothing here

            async def enqueue() -> None:
                await rq.register_regrade_queue(job.job_id, concurrency=2)
                latest = await rq.latest_items(job.job_id)
                await rq.enqueue_items(job.job_id, [(0, f"a{i:02d}") for i in range(1, 33)],
                                       latest)

            asyncio.run_coroutine_threadsafe(enqueue(), work_loop()).result(timeout=30)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "test-key"}
        worker = subprocess.Popen(
            [sys.executable, "-m", "rubric_core", "worker", "--db", str(db_path)], cwd=ROOT,
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            server.wait_held(2)  # the worker grades two answers now
            at.session_state["lab_job"] = job.job_id
            _run(at)
            assert (f"Another process is grading this re-grade now (pid {worker.pid} on "
                    in _texts(at.info))
            assert at.button(key="lab_resume").disabled and at.button(key="lab_stop").disabled
            worker.send_signal(signal.SIGTERM)  # it ends there: its items wait for recovery
            server.release()
            worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            server.release()
    _run(at)
    assert "it was interrupted" in _texts(at.info)
    assert not at.button(key="lab_resume").disabled
