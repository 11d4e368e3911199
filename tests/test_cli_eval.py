"""`rubric-studio eval` and `rubric-studio datasets`: exit codes, progress, export, and resume
after a kill -9 of a real CLI process."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
from openai_server import DelayedServer, FakeOpenAI, error, verdict
from pg_support import scalar
from test_experiments import runs_per_thread

from rubric_core import session
from rubric_core.cli import main
from rubric_core.store import DB_ENV_VAR, Store

if TYPE_CHECKING:
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def test_bundled_dataset_satisfied_exit_0_with_export(tmp_path: Path) -> None:
    db, out_csv, summary = tmp_path / "db.sqlite3", tmp_path / "o.csv", tmp_path / "s.csv"
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--db", str(db), "--config",
                 "worker=demo,grader=rules", "--concurrency", "3", "--csv", str(out_csv),
                 "--summary-csv", str(summary)], out)
    text = out.getvalue()
    assert code == 0, text
    assert "24/24 done, 100% satisfied" in text and "resume with: rubric-studio eval" in text
    with out_csv.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["run_status"] for r in rows} == {"satisfied"}
    assert len({r["row_id"] for r in rows}) == 24
    with summary.open(newline="", encoding="utf-8") as handle:
        [row] = list(csv.DictReader(handle))
    assert row["satisfied_pct"] == "100.0" and row["cells"] == "24"


def test_a_configuration_below_the_pass_rate_exits_1(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--db", str(tmp_path / "db.sqlite3"),
                 "--config", "worker=demo,grader=rules,cap=1,label=one pass",
                 "--min-pass-rate", "0.5"], out)
    assert code == 1 and "0% satisfied" in out.getvalue()
    assert "below --min-pass-rate 0.5: one pass: exit 1" in out.getvalue()


def test_model_grader_and_cap_flags_make_one_configuration_per_model(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--model", "demo", "--model", "demo",
                 "--grader", "rules", "--max-iterations", "1", "--db", str(db)], out)
    # No --min-pass-rate: every cell ended without an error, so 0 % satisfied still exits 0.
    assert code == 0, out.getvalue()
    with Store(db) as store:
        [exp] = store.list_experiments()
        cells = store.experiment_cells(exp.experiment_id)
    assert [(c.worker_model, c.grader_model, c.max_iterations) for c in exp.configurations] \
        == [("demo", "rules", 1)] * 2
    assert {c.status for c in cells} == {"max_iterations_reached"} and len(cells) == 48
    code = main(["eval", "--dataset", "bundled", "--model", "demo", "--db", str(db),
                 "--min-pass-rate", "1"], io.StringIO())
    assert code == 0  # the default cap (3) satisfies every bundled row


def test_without_a_pass_rate_an_error_cell_exits_1_and_names_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "q.csv"
    data.write_text("prompt\nquestion one\nquestion two\n", encoding="utf-8")
    with FakeOpenAI(default=error(400, "this model is not served here")) as fake:
        monkeypatch.setenv("RUBRIC_STUDIO_BASE_URL", fake.base_url)  # as for `run`
        out = io.StringIO()
        code = main(["eval", "--dataset", str(data), "--rubric", "- answers",
                     "--model", "openai-compatible:w", "--grader", "openai-compatible:g",
                     "--db", str(tmp_path / "db.sqlite3")], out)
    text = out.getvalue()
    assert code == 1, text
    assert "2 cell(s) ended in an error (retry them with --resume" in text
    assert "--retry-errors): exit 1" in text


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--model-limit", "demo"], "--model-limit 'demo': expected MODEL=N",
                 id="limit_without_number"),
    pytest.param(["--model-limit", "demo=0"], "model limit demo=0 must be from 1 to 64",
                 id="limit_zero"),
    pytest.param(["--min-pass-rate", "80"], "--min-pass-rate must be a share between 0 and 1",
                 id="percent_not_share"),
    pytest.param(["--max-iterations", "0"], "max_iterations must be between 1 and 50",
                 id="cap_0"),
    pytest.param(["--max-iterations", "51"], "max_iterations must be between 1 and 50",
                 id="cap_51"),
    pytest.param(["--model-limit", "demo=65"], "model limit demo=65 must be from 1 to 64",
                 id="limit_over_max"),
    pytest.param(["--model-limit", "demo=x"], "expected MODEL=N with N a whole number from 1 to 64",
                 id="limit_not_a_number"),
    pytest.param(["--concurrency", "1000"], "concurrency must be from 1 to 64, got 1000",
                 id="concurrency_over_max"),
    pytest.param(["--concurrency", "0"], "concurrency must be from 1 to 64, got 0",
                 id="concurrency_0"),
    pytest.param(["--repeats", "21"], "repeats must be a whole number from 1 to 20",
                 id="repeats_over_max"),
    pytest.param(["--repeats", "0"], "repeats must be a whole number from 1 to 20",
                 id="repeats_0"),
    pytest.param(["--workers", "5"], "workers must be from 1 to the concurrency (4), got 5",
                 id="more_workers_than_cells_at_once"),
    pytest.param(["--workers", "2"], "--workers N needs a PostgreSQL --db",
                 id="workers_on_sqlite"),
    pytest.param(["--workers", "-3"], "workers must be from 1 to the concurrency (4), got -3",
                 id="negative_workers"),
    pytest.param(["--workers", "100000", "--concurrency", "64",
                  "--db", "postgresql://u:secret@127.0.0.1:1/x"],
                 "workers must be from 1 to the concurrency (64), got 100000",
                 id="a_fork_bomb_of_workers"),
])
def test_bad_eval_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = tmp_path / "db.sqlite3"
    code = main(["eval", "--dataset", "bundled", "--db", str(db), *args], io.StringIO())
    assert code == 2 and message in capsys.readouterr().err
    assert not db.exists() or _count(db, "experiments") == 0


def test_model_limit_is_passed_to_the_experiment(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--model-limit", "demo=1", "--concurrency",
                 "4", "--db", str(tmp_path / "db.sqlite3")], out)
    assert code == 0, out.getvalue()


def test_eval_without_db_uses_the_apps_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "app.sqlite3"
    monkeypatch.setenv("RUBRIC_STUDIO_DB", str(db))
    out = io.StringIO()
    assert main(["eval", "--dataset", "bundled"], out) == 0, out.getvalue()
    assert f"--db {db}" in out.getvalue() and _count(db, "experiments") == 1


@pytest.mark.parametrize(("content", "where"), [
    pytest.param("id,prompt\na,hello\nb,\n", "row 3, column 'prompt'", id="empty_prompt"),
    pytest.param("id,text\na,hello\n", "no 'prompt' column", id="missing_prompt"),
    pytest.param("prompt\nabout {topic}\n", "row 2, column 'prompt' uses {topic}",
                 id="unknown_variable"),
])
def test_bad_dataset_exits_2_naming_row_and_column_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, where: str
) -> None:
    data, db = tmp_path / "d.csv", tmp_path / "db.sqlite3"
    data.write_text(content, encoding="utf-8")
    code = main(["eval", "--dataset", str(data), "--rubric", "- short", "--db", str(db)],
                io.StringIO())
    assert code == 2 and where in capsys.readouterr().err
    if db.exists() and db.stat().st_size:
        assert _count(db, "datasets") == 0 and _count(db, "experiments") == 0


def test_datasets_list_show_delete(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    data = tmp_path / "pets.csv"
    data.write_text("prompt,rubric\nWrite about cats,- mentions cats\n", encoding="utf-8")
    assert main(["eval", "--dataset", str(data), "--db", str(db)], io.StringIO()) in (0, 1)
    out = io.StringIO()
    assert main(["datasets", "--db", str(db)], out) == 0 and "pets" in out.getvalue()
    out = io.StringIO()
    assert main(["datasets", "--db", str(db), "show", "pets"], out) == 0
    assert "1 rows, columns prompt, rubric" in out.getvalue()
    # Used by an experiment: refused with a message, exit 2.
    assert main(["datasets", "--db", str(db), "delete", "pets"], io.StringIO()) == 2
    with Store(db) as store:
        store.delete_experiment(store.list_experiments()[0].experiment_id)
    out = io.StringIO()
    assert main(["datasets", "--db", str(db), "delete", "pets"], out) == 0
    assert main(["datasets", "--db", str(db), "show", "pets"], io.StringIO()) == 2


def test_datasets_and_analytics_default_to_the_apps_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DB_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    default = tmp_path / "xdg" / "rubric-studio" / "rubric_studio.sqlite3"
    out, err = io.StringIO(), io.StringIO()
    assert main(["datasets"], out) == 0
    assert f"no database at {default} yet" in out.getvalue()
    assert not default.exists()  # listing creates nothing
    with contextlib.redirect_stderr(err):
        assert main(["analytics"], io.StringIO()) == 2
        assert main(["datasets", "show", "pets"], io.StringIO()) == 2
    assert f"no database at {default}: pass --db PATH_OR_URL or set {DB_ENV_VAR}" in (
        err.getvalue())
    assert main(["eval", "--dataset", "bundled"], io.StringIO()) == 0
    out = io.StringIO()
    assert main(["datasets"], out) == 0 and "bundled-demo" in out.getvalue()
    out = io.StringIO()
    assert main(["analytics"], out) == 0 and "24 run(s)" in out.getvalue()


def test_resume_after_kill_9_runs_every_cell_exactly_once(
    tmp_path: Path, db_location: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = DelayedServer(delay_s=0.1)
    db, data = db_location, tmp_path / "q.csv"
    data.write_text("prompt\n" + "".join(f"question {i}\n" for i in range(16)),
                    encoding="utf-8")
    config = ("worker=openai-compatible:w,grader=openai-compatible:g,"
              f"base_url={server.fake.base_url}")
    # Its runs' heartbeats go stale 3 s after the kill, not 30.
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key",
           "RUBRIC_STUDIO_STALE_AFTER_S": "3", "RUBRIC_STUDIO_HEARTBEAT_S": "0.25"}
    with server.fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rubric_core", "eval", "--dataset", str(data), "--rubric",
             "- c1\n- c2", "--config", config, "--concurrency", "2", "--db", str(db)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        satisfied = 0
        while satisfied < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            satisfied = _satisfied(db)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        with Store(db) as store:
            [exp] = store.list_experiments()
            cells = store.experiment_cells(exp.experiment_id)
        before = [c.status for c in cells]
        assert before.count("satisfied") < 16
        # Killed mid-cell: a run left 'running', or a cell dequeued before its run was created.
        assert any(c.status in ("running", "pending") for c in cells), before
        # The killed process's runs go stale after STALE_AFTER_S; shorten it for the test.
        monkeypatch.setattr(session, "STALE_AFTER_S", 1.0)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        out = io.StringIO()
        code = main(["eval", "--resume", exp.experiment_id, "--db", str(db)], out)
        assert code == 0, out.getvalue()
    with Store(db) as store:
        assert {c.status for c in store.experiment_cells(exp.experiment_id)} == {"satisfied"}
    assert runs_per_thread(db, exp.experiment_id) == [1] * 16


def _satisfied(db: Path | str) -> int:
    if not isinstance(db, str) and not (db.exists() and db.stat().st_size):
        return 0  # not created yet (and the test must not create it)
    # None until the tables are there
    return int(str(scalar(db, "SELECT COUNT(*) FROM runs WHERE status = 'satisfied'") or 0))


def test_progress_lines_are_throttled_but_starts_ends_and_errors_always_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rubric_core.cli import eval as eval_command

    clock = [100.0]
    monkeypatch.setattr(eval_command.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    show = eval_command.ProgressPrinter(out)

    def progress(done: int, errors: int = 0) -> dict[str, object]:
        return {"type": "experiment_progress", "config_index": 0, "label": "A", "done": done,
                "total": 10, "satisfied_rate": None, "errors": errors, "eta_s": None}

    for event in (progress(0), progress(1), progress(2)):
        show(event)
    clock[0] += 2.5
    for event in (progress(3), progress(4), progress(5, errors=1), progress(10, errors=1)):
        show(event)
    shown = [line.split(": ", 1)[1].split(" done")[0] for line in out.getvalue().splitlines()]
    assert shown == ["0/10", "3/10", "5/10", "10/10"]


def test_a_configuration_carries_its_judging_options_to_every_cell(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--db", str(db), "--config",
                 "worker=demo,grader=rules,grader_repeats=2,consensus=unanimous,return_best=yes,"
                 "label=steady"], out)
    assert code == 0, out.getvalue()
    with Store(db) as store:
        [exp] = store.list_experiments()
        [config] = exp.configurations
        assert (config.grader_repeats, config.consensus, config.return_best) == (
            2, "unanimous", True)
        cell = store.experiment_cells(exp.experiment_id)[0]
        assert cell.run is not None and cell.run.settings.grader_repeats == 2
        assert {ev.get("repeats") for ev in store.evaluations(cell.run.run_id)} == {2}


@pytest.mark.parametrize(("config", "message"), [
    pytest.param("worker=demo,return_best=maybe", "return_best must be yes or no", id="flag"),
    pytest.param("worker=demo,grader_repeats=x", "grader_repeats must be a whole number",
                 id="not_a_number"),
    pytest.param("worker=demo,grader_repeats=12", "grader_repeats must be from 1 to 9",
                 id="too_many"),
])
def test_bad_judging_keys_exit_2_and_store_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    db = tmp_path / "db.sqlite3"
    code = main(["eval", "--dataset", "bundled", "--db", str(db), "--config", config],
                io.StringIO())
    assert code == 2 and message in capsys.readouterr().err
    assert not db.exists() or _count(db, "experiments") == 0


def _answering_server(delay_s: float) -> DelayedServer:
    """A loopback server whose grader passes `_loopback_eval`'s criterion on the first pass."""
    return DelayedServer(delay_s=delay_s, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))


def _loopback_eval(tmp_path: Path, server: DelayedServer, *flags: str
                   ) -> tuple[list[str], dict[str, str], Path]:
    """``python -m rubric_core eval`` of 24 questions on ``server``: argv, env and database."""
    db, data = tmp_path / "db.sqlite3", tmp_path / "q.csv"
    data.write_text("prompt\n" + "".join(f"question {i}\n" for i in range(24)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key"}
    argv = [sys.executable, "-m", "rubric_core", "eval", "--dataset", str(data), "--rubric",
            "- answers the question", "--config",
            f"worker=openai-compatible:w,grader=openai-compatible:g,"
            f"base_url={server.fake.base_url}", "--db", str(db), *flags]
    return argv, env, db


