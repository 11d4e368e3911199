"""``rubric-studio regrade`` and ``answers``: exit codes 0, 1 (--min-kappa), 2 and 130, and a
real CLI process killed with kill -9 mid re-grade: after --resume no answer is lost or graded
twice (checked in the database and by the server's call count)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
from conftest import ROOT
from holding_server import HoldingServer, sigint
from pg_support import scalar

from rubric_core.cli import main
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv, out)
    return code, out.getvalue(), err.getvalue()


def test_bundled_passes_a_low_bar_and_fails_a_high_one(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite3")
    code, out, _ = _run(["regrade", "--answers", "bundled", "--db", db, "--min-kappa", "0.2",
                         "--csv", str(tmp_path / "out.csv"), "--json", str(tmp_path / "o.json")])
    assert code == 0, out
    assert "The answer mentions sunlight" in out and "never_fails" in out
    assert "disagrees" not in out  # the flag's bar is --min-kappa: 0.236 clears 0.2
    assert "wrote 128 rows" in out
    rows = json.loads((tmp_path / "o.json").read_text(encoding="utf-8"))
    assert len(rows) == 128 and rows[0]["people"] == '{"Ana": "pass", "Ben": "pass"}'
    code, out, _ = _run(["regrade", "--answers", "bundled", "--db", db, "--min-kappa", "0.6"])
    assert code == 1 and "disagrees" in out
    assert out.splitlines()[-1].startswith("below --min-kappa 0.6: [0] The answer mentions "
                                           "sunlight (κ 0.236, n 64)")


def test_no_labels_cannot_pass_a_kappa_gate(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    data.write_text("request,answer\nWrite a haiku,One line only\n", encoding="utf-8")
    argv = ["regrade", "--answers", str(data), "--rubric", "- The poem has three lines",
            "--db", str(tmp_path / "db.sqlite3")]
    assert _run(argv)[0] == 0
    code, out, _ = _run([*argv, "--min-kappa", "0.5"])
    assert code == 1 and "no criterion has people's verdicts" in out


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["regrade"], "give --answers FILE|bundled", id="no_answers"),
    pytest.param(["regrade", "--answers", "bundled", "--min-kappa", "2"], "--min-kappa must be",
                 id="kappa_out_of_range"),
    pytest.param(["regrade", "--answers", "missing.csv", "--rubric", "- c"], "is not a file",
                 id="no_such_file"),
    pytest.param(["regrade", "--answers", "bundled", "--concurrency", "0"],
                 "concurrency must be from 1", id="bad_concurrency"),
    pytest.param(["regrade", "--answers", "bundled", "--grader", "nope:"], "nope", id="bad_model"),
    pytest.param(["regrade", "--answers", "bundled", "--repeats", "10"], "grader_repeats must",
                 id="too_many_repeats"),
    pytest.param(["regrade", "--resume", "deadbeef"], "no re-grade 'deadbeef'", id="bad_resume"),
    pytest.param(["regrade", "--runs", "colour=red"], "is not KEY=VALUE", id="bad_run_filter"),
])
def test_bad_input_exits_2_with_a_message(tmp_path: Path, argv: list[str], message: str) -> None:
    db = tmp_path / "db.sqlite3"
    if "--resume" in argv or "--runs" in argv:
        Store(db).open().close()
    code, _, err = _run([*argv, "--db", str(db)])
    assert code == 2 and message in err, err


def test_a_bad_upload_exits_2_naming_row_and_column_and_stores_nothing(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    data.write_text("request,answer,label:c\nq,a,pass\nq,b,perhaps\n", encoding="utf-8")
    db = tmp_path / "db.sqlite3"
    code, _, err = _run(["regrade", "--answers", str(data), "--rubric", "- c", "--db", str(db)])
    assert code == 2 and "row 3, column 'label:c'" in err
    code, _, err = _run(["answers", "import", str(data), "--db", str(db)])
    assert code == 2 and "row 3" in err
    assert not db.exists() or Store(db).list_answer_sets() == []


def test_answers_import_list_export_round_trip(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite3")
    assert _run(["answers", "import", "bundled", "--db", db])[0] == 0
    code, out, _ = _run(["answers", "list", "--db", db])
    assert code == 0 and "bundled" in out and "32 answers" in out and "256 labels" in out
    exported = tmp_path / "b.jsonl"
    assert _run(["answers", "export", "bundled", "--jsonl", str(exported), "--db", db])[0] == 0
    assert _run(["answers", "import", str(exported), "--name", "again", "--db", db])[0] == 0
    with Store(db) as store:
        assert store.answer_labels("again", 1) == store.answer_labels("bundled", 1)
        assert [i.answer for i in store.answer_items("again", 1)] == [
            i.answer for i in store.answer_items("bundled", 1)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "test-key"}


def _loopback(tmp_path: Path, server: HoldingServer, count: int, db: Path | str) -> list[str]:
    data = tmp_path / "a.csv"
    data.write_text("id,request,answer\n" + "".join(
        f"q{i},question {i},reply {i}\n" for i in range(count)), encoding="utf-8")
    return [sys.executable, "-m", "rubric_core", "regrade", "--answers", str(data),
            "--rubric", "- answers the question", "--grader", "openai-compatible:g",
            "--base-url", server.fake.base_url, "--concurrency", "2", "--db", str(db)]


def _recorded(db: Path | str) -> int:
    return int(str(scalar(db, "SELECT COUNT(*) FROM regrade_results") or 0))


def _held_after(server: HoldingServer, db: Path | str, recorded: int) -> None:
    """Wait until the process's two slots are held and the gradings before them recorded."""
    server.wait_held(2)  # both slots now calling: nothing more can end
    deadline = time.monotonic() + 30
    while _recorded(db) < recorded and time.monotonic() < deadline:
        time.sleep(0.05)


def test_kill_9_mid_regrade_then_resume_loses_and_repeats_nothing(
        tmp_path: Path, db_location: Path | str) -> None:
    server = HoldingServer(free=10, delay_s=0.01)
    db = db_location
    with server.fake:
        proc = subprocess.Popen(_loopback(tmp_path, server, 30, db), cwd=ROOT, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _held_after(server, db, 10)  # ten answered and recorded
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert _recorded(db) == 10
        server.release()
        with Store(db) as store:
            [job] = store.list_regrade_jobs()
            assert job.status == "running"  # killed: it never said otherwise
        calls = server.calls
        code, out, _ = _run(["regrade", "--resume", job.job_id, "--db", str(db)])
        assert code == 0, out
    assert server.calls - calls == 20  # only the twenty that were not recorded
    assert scalar(db, "SELECT COUNT(*) FROM regrade_results") == 30
    assert scalar(db, "SELECT COUNT(DISTINCT item_id) FROM regrade_results") == 30
    assert scalar(db, "SELECT MAX(repeat_index) FROM regrade_results") == 0
    with Store(db) as store:
        assert store.get_regrade_job(job.job_id).status == "finished"  # type: ignore[union-attr]


def test_ctrl_c_exits_130_and_the_regrade_resumes(tmp_path: Path) -> None:
    server = HoldingServer(free=4, delay_s=0.01)
    db = tmp_path / "db.sqlite3"
    with server.fake:
        with sigint(signal.default_int_handler):
            proc = subprocess.Popen(_loopback(tmp_path, server, 12, db), cwd=ROOT, env=_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        server.wait_held(2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, out + err
        assert "stopped: resume with rubric-studio regrade --resume" in out
        assert "interrupted" in err
        with Store(db) as store:
            [job] = store.list_regrade_jobs()
            assert job.status == "stopped" and _recorded(db) == 4
        server.release()
        code, out, _ = _run(["regrade", "--resume", job.job_id, "--db", str(db)])
    assert code == 0, out
    assert _recorded(db) == 12
