"""The command line: arguments, exit codes, messages without tracebacks, CSV output.

Most tests call `main(argv)` in-process; a few run ``python -m rubric_core`` as a subprocess
(no API keys in its environment) to pin what a person at a terminal sees. Model traffic goes to
a FakeOpenAI server on 127.0.0.1 through ``openai-compatible:`` models and ``--base-url``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from conftest import ROOT
from openai_server import FakeOpenAI, Reply, error, slow, text, verdict

from rubric_core import session
from rubric_core.cli import main
from rubric_core.grader import parse_grader_payload
from rubric_core.models import BASE_URL_ENV
from rubric_core.store import DB_ENV_VAR, Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RUBRIC = "- c1\n- c2"


FAIL = verdict("needs_revision", ("c2",))
PASS = verdict("satisfied")


class Scripted:
    """Worker drafts and grader verdicts served by one FakeOpenAI, told apart by tools."""

    def __init__(self, drafts: list[str], verdicts: list[Reply]) -> None:
        self.drafts, self.verdicts = list(drafts), list(verdicts)
        self.server = FakeOpenAI(default=self.respond)

    def respond(self, body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "GraderResponse" in names:
            return self.verdicts.pop(0)
        return text(self.drafts.pop(0))

    def argv(self, *extra: str) -> list[str]:
        return ["run", "--model", "openai-compatible:worker", "--grader",
                "openai-compatible:grader", "--base-url", self.server.base_url, *extra]


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[Scripted] = []

    def make(drafts: list[str], verdicts: list[Reply]) -> Scripted:
        servers.append(Scripted(drafts, verdicts))
        return servers[-1]

    yield make
    for s in servers:
        s.server.stop()


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.endswith("_API_KEY") or name == BASE_URL_ENV or name.startswith(
            ("LANGSMITH_", "LANGCHAIN_")
        ):
            monkeypatch.delenv(name)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rubric_core ARGS`` with no API keys and no tracing in its environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k != BASE_URL_ENV
           and not k.startswith(("LANGSMITH_", "LANGCHAIN_"))}
    return subprocess.run(
        [sys.executable, "-m", "rubric_core", *args], cwd=ROOT, env=env, input=stdin,
        capture_output=True, text=True, timeout=60, check=False,
    )


# --------------------------------------------------------------------------- end to end


def test_subprocess_run_over_http_satisfied_exits_0_and_writes_csv(
    scripted: Any, tmp_path: Path
) -> None:
    rubric_file = tmp_path / "rubric.md"
    rubric_file.write_text(RUBRIC, encoding="utf-8")
    csv = tmp_path / "out.csv"
    s = scripted(["draft one", "draft two"], [FAIL, PASS])
    proc = cli(*s.argv("--prompt", "write it", "--rubric", f"@{rubric_file}", "--csv", str(csv)))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    assert "── answer (pass 1) ──\ndraft one" in out
    assert "verdict: needs_revision" in out and "[FAIL] c2 — fix c2" in out
    assert "verdict: satisfied" in out and "status: satisfied after 2 grading pass(es)" in out
    assert f"wrote 4 rows to {csv}" in out

    rows = pd.read_csv(csv, dtype=str, keep_default_na=False)
    assert list(rows["iteration"]) == ["0", "0", "1", "1"]
    assert list(rows["criterion"]) == ["c1", "c2", "c1", "c2"]
    assert list(rows["passed"]) == ["True", "False", "True", "True"]
    assert list(rows["gap"]) == ["", "fix c2", "", ""]
    assert list(rows["result"]) == ["needs_revision"] * 2 + ["satisfied"] * 2
    # the answer is written once per iteration, on its first criterion row
    assert list(rows["answer"]) == ["draft one", "", "draft two", ""]
    assert set(rows["run_status"]) == {"satisfied"}
    assert set(rows["worker_model"]) == {"openai-compatible:worker"}
    assert rows["input_tokens"].str.isdigit().all()  # usage travelled over the stream
    assert len(s.server.requests) == 4


def test_subprocess_reads_prompt_from_stdin(scripted: Any) -> None:
    s = scripted(["draft"], [PASS])
    proc = cli(*s.argv("--prompt", "@-", "--rubric", RUBRIC, "--quiet"), stdin="from stdin")
    assert proc.returncode == 0, proc.stderr
    assert "── answer" not in proc.stdout  # --quiet
    first = s.server.requests[0]["messages"]
    assert first[-1] == {"role": "user", "content": "from stdin"}


@pytest.mark.parametrize(
    ("verdicts", "extra", "status", "hint"),
    [
        pytest.param([FAIL], ["--max-iterations", "1"], "max_iterations_reached",
                     "raise --max-iterations", id="cap"),
        pytest.param([error(400, "tools unsupported")], [], "grader_error",
                     "the grader itself failed", id="grader_error"),
    ],
)
def test_run_that_is_not_satisfied_exits_1(
    scripted: Any, capsys: pytest.CaptureFixture[str], verdicts: list[Reply], extra: list[str],
    status: str, hint: str,
) -> None:
    s = scripted(["draft"], verdicts)
    code, out, err = run_main(s.argv("--prompt", "p", "--rubric", RUBRIC, *extra), capsys)
    assert code == 1, err
    assert f"status: {status} after 1 grading pass(es)" in out
    assert f"next: {hint}" in out


def test_worker_server_down_exits_1_with_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeOpenAI()
    server.stop()  # nothing listens on this port any more
    argv = ["run", "--model", "openai-compatible:w", "--grader", "openai-compatible:g",
            "--base-url", server.base_url, "--prompt", "p", "--rubric", RUBRIC]
    code, out, _ = run_main(argv, capsys)
    assert code == 1
    assert "status: error after 0 grading pass(es)" in out
    assert "error: " in out and "Connection" in out
    assert "next: the worker failed" in out


def test_csv_in_process_matches_the_evaluations(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = scripted(["=SUM(A1:A2)"], [verdict("needs_revision", ("c1", "c2"))])
    csv = tmp_path / "evals.csv"
    code, out, _ = run_main(
        s.argv("--prompt", "p", "--rubric", RUBRIC, "--max-iterations", "1", "--csv", str(csv)),
        capsys,
    )
    assert code == 1 and f"wrote 2 rows to {csv}" in out
    rows = pd.read_csv(csv, dtype=str, keep_default_na=False)
    assert len(rows) == 2 and list(rows["gap"]) == ["fix c1", "fix c2"]
    assert list(rows["answer"]) == ["'=SUM(A1:A2)", ""]  # formula-safe, once per iteration
    assert set(rows["run_status"]) == {"max_iterations_reached"}


# --------------------------------------------------------------------------- bad input: exit 2


def test_subprocess_unreadable_file_exits_2_without_traceback(tmp_path: Path) -> None:
    proc = cli("run", "--prompt", f"@{tmp_path / 'missing.txt'}", "--rubric", RUBRIC)
    assert proc.returncode == 2
    assert "cannot read prompt file" in proc.stderr and "missing.txt" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_subprocess_missing_key_exits_2_with_clear_message() -> None:
    proc = cli("run", "--prompt", "p", "--rubric", RUBRIC, "--model", "openai:gpt-4.1-mini",
               "--grader", "openai:gpt-4.1-mini")
    assert proc.returncode == 2
    assert "OPENAI_API_KEY" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--prompt", "@/nonexistent/prompt.txt", "--rubric", RUBRIC],
                     "cannot read prompt file", id="unreadable_prompt"),
        pytest.param(["--prompt", "p", "--rubric", "@/nonexistent/rubric.md"],
                     "cannot read rubric file", id="unreadable_rubric"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--system-prompt", "@/nonexistent"],
                     "cannot read system prompt file", id="unreadable_system_prompt"),
        pytest.param(["--rubric", RUBRIC], "give --prompt", id="no_prompt"),
        pytest.param(["--prompt", "p"], "give --rubric", id="no_rubric"),
        pytest.param(["--prompt", "  ", "--rubric", RUBRIC], "prompt is empty", id="blank_prompt"),
        pytest.param(["--prompt", "p", "--rubric", "- c\n" * 30_000], "limit is",
                     id="huge_rubric"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--max-iterations", "0"],
                     "between 1 and 50", id="zero_cap"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--model", "nope:x", "--grader",
                      "nope:x"], "Unsupported provider='nope'", id="unknown_provider"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--model", "noprovider",
                      "--grader", "noprovider"], "is not 'provider:model-id'",
                     id="no_provider_prefix"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--model", "openai:gpt-4.1-mini",
                      "--grader", "openai:gpt-4.1-mini"], "needs an API key: OPENAI_API_KEY",
                     id="missing_key"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--model", "openai-compatible:x",
                      "--grader", "openai-compatible:x"], BASE_URL_ENV, id="no_base_url"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--model", "openai-compatible:x",
                      "--grader", "openai-compatible:x", "--base-url", "ftp://host"],
                     "must start with http", id="bad_url_scheme"),
        pytest.param(["--prompt", "p", "--rubric", RUBRIC, "--resume"],
                     "--resume needs --thread", id="resume_without_thread"),
        pytest.param(["--example", "haiku", "--no-db", "--db", "x.sqlite3"],
                     "--no-db records nothing", id="no_db_with_db"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["run", *argv], capsys)
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err and out == ""


def test_text_and_file_arguments_are_equivalent(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "p.txt").write_text("write it, ünïcode ✓", encoding="utf-8")
    (tmp_path / "r.md").write_text(RUBRIC, encoding="utf-8")
    by_text = scripted(["d"], [PASS])
    by_file = scripted(["d"], [PASS])
    assert run_main(by_text.argv("--prompt", "write it, ünïcode ✓", "--rubric", RUBRIC),
                    capsys)[0] == 0
    assert run_main(by_file.argv("--prompt", f"@{tmp_path / 'p.txt'}",
                                 "--rubric", f"@{tmp_path / 'r.md'}"), capsys)[0] == 0
    assert by_text.server.requests[0]["messages"] == by_file.server.requests[0]["messages"]
    # The grader sees the same request and criteria (the delimiters' nonces differ per call).
    graded = [parse_grader_payload(s.server.requests[1]["messages"][1]["content"])
              for s in (by_text, by_file)]
    assert graded[0] is not None and graded[0] == graded[1]
    assert graded[0].request == "write it, ünïcode ✓"


def test_db_and_resume_continue_a_thread(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "studio.sqlite3")
    first = scripted(["draft"], [FAIL])
    code, out, _ = run_main(first.argv("--prompt", "p", "--rubric", RUBRIC, "--db", db,
                                       "--thread", "th", "--max-iterations", "1"), capsys)
    assert code == 1 and "(thread th)" in out
    again = scripted([], [])
    code, out, _ = run_main(again.argv("--prompt", "p", "--rubric", RUBRIC, "--db", db,
                                       "--thread", "th", "--resume"), capsys)
    assert code == 1 and "status: max_iterations_reached after 1 grading pass(es)" in out
    assert again.server.requests == []  # a finished thread is reported, not run again


def test_db_runs_are_recorded_in_the_run_index(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "studio.sqlite3")
    first = scripted(["draft"], [FAIL])
    code, out, _ = run_main(first.argv("--prompt", "Write   it\nnow", "--rubric", RUBRIC,
                                       "--db", db, "--thread", "th", "--max-iterations", "1"),
                            capsys)
    assert code == 1
    with Store(db) as store:
        runs = store.list_runs()
        assert len(runs) == 1
        run = runs[0]
        assert (run.thread_id, run.title, run.status, run.iterations) == (
            "th", "Write it now", "max_iterations_reached", 1)
        assert (run.worker_model, run.grader_model) == (
            "openai-compatible:worker", "openai-compatible:grader")
        assert run.grader_tools == () and run.worker_system_prompt == ""
        assert [e["result"] for e in store.evaluations(run.run_id)] == ["needs_revision"]
    assert f"recorded as run {run.run_id[:8]} in {db}" in out

    # Resuming the thread keeps recording into the same run, not a new one.
    again = scripted([], [])
    run_main(again.argv("--prompt", "Write it now", "--rubric", RUBRIC, "--db", db,
                        "--thread", "th", "--resume"), capsys)
    with Store(db) as store:
        assert [r.run_id for r in store.list_runs()] == [run.run_id]


def test_resume_needs_a_thread(scripted: Any, capsys: pytest.CaptureFixture[str],
                               tmp_path: Path) -> None:
    s = scripted([], [])
    code, _, err = run_main(s.argv("--prompt", "p", "--rubric", RUBRIC, "--resume",
                                   "--db", str(tmp_path / "x.sqlite3")), capsys)
    assert code == 2 and "--resume needs --thread ID" in err
    assert s.server.requests == []


# --------------------------------------------------------------------------- bundled examples

EXAMPLE_NAMES = ["haiku", "photosynthesis", "find_duplicates", "json_product"]


def test_examples_command_lists_the_bundled_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["examples"], capsys)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == EXAMPLE_NAMES


def test_subprocess_bundled_example_runs_offline_and_is_satisfied() -> None:
    proc = cli("run", "--example", "haiku")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "status: satisfied" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_each_bundled_example_runs_offline_and_is_satisfied(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["run", "--example", name], capsys)
    assert code == 0, out[-2000:] + err[-2000:]
    assert "status: satisfied" in out
    assert "Traceback" not in err


def test_unknown_example_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["run", "--example", "no-such-example"], capsys)
    assert code == 2 and "no-such-example" in err


# --------------------------------------------------------------------------- bad input, early


@pytest.mark.parametrize(
    ("extra", "rubric", "message"),
    [
        pytest.param([], "-\n*\n-", "The rubric has no criteria", id="bullets_only_rubric"),
        pytest.param(["--csv", "/no/such/dir/out.csv"], RUBRIC, "does not exist",
                     id="csv_in_a_missing_directory"),
        pytest.param(["--csv", "/"], RUBRIC, "is a directory", id="csv_is_a_directory"),
        pytest.param(["--prompt", "@/dev/zero"], RUBRIC, "is over 1024 KB", id="prompt_dev_zero"),
        pytest.param([], "@/dev/zero", "is over 1024 KB", id="rubric_dev_zero"),
        pytest.param(["--max-iterations", str(10**9)], RUBRIC, "between 1 and 50",
                     id="huge_cap"),
    ],
)
def test_bad_input_exits_2_before_any_model_call(
    scripted: Any, capsys: pytest.CaptureFixture[str], extra: list[str], rubric: str,
    message: str,
) -> None:
    s = scripted(["draft"], [PASS])
    argv = [*s.argv("--prompt", "p", f"--rubric={rubric}"), *extra]
    code, out, err = run_main(argv, capsys)
    assert code == 2 and message in err, err
    assert "Traceback" not in err and out == ""
    assert s.server.requests == []  # nothing was spent


def test_a_huge_rubric_file_is_refused_by_size(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "rubric.md"
    big.write_text("- c\n" * 400_000, encoding="utf-8")
    code, _, err = run_main(["run", "--prompt", "p", "--rubric", f"@{big}"], capsys)
    assert code == 2 and "is over 1024 KB" in err


def test_non_utf8_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    code, _, err = run_main(["run", "--prompt", f"@{bad}", "--rubric", RUBRIC], capsys)
    assert code == 2 and "is not UTF-8 text" in err


def test_an_unusable_database_exits_2_with_the_store_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("my notes, not a database\n" * 50)
    before = db.read_bytes()
    code, _, err = run_main(["run", "--example", "haiku", "--db", str(db)], capsys)
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_analytics_over_a_database_of_real_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, csv = tmp_path / "runs.sqlite3", tmp_path / "stats.csv"
    for example in ("haiku", "photosynthesis"):
        assert run_main(["run", "--example", example, "--db", str(db), "--quiet"], capsys)[0] == 0
    code, out, err = run_main(["analytics", "--db", str(db), "--csv", str(csv)], capsys)
    assert code == 0, err
    assert "2 run(s)" in out and "first_pass_fail_rate" in out
    rows = pd.read_csv(csv)
    assert "Lines follow a 5-7-5 syllable pattern" in set(rows["criterion"])
    fixed = rows.set_index("criterion").loc["Lines follow a 5-7-5 syllable pattern"]
    assert fixed["first_pass_fail_rate"] == 1.0 and fixed["mean_passes_to_fix"] == 1.0
    code, _, err = run_main(["analytics", "--db", str(tmp_path / "none.sqlite3")], capsys)
    assert code == 2 and "no database at" in err


def test_analytics_of_one_run_a_rubric_or_an_experiment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "runs.sqlite3")
    for example in ("haiku", "photosynthesis"):
        assert run_main(["run", "--example", example, "--db", db, "--quiet"], capsys)[0] == 0
    with Store(db) as store:
        haiku = next(r for r in store.list_runs() if "haiku" in r.prompt)
    code, out, _ = run_main(["analytics", "--db", db, "--run", haiku.run_id[:8]], capsys)
    assert code == 0 and out.startswith("1 run(s), 2 grading pass(es)\n")
    assert "The answer is one sentence" not in out  # the other run's criterion
    # Never fixed, no gaps after it, no repeats: "-", not NaN or None.
    line = next(x for x in out.splitlines() if x.strip().startswith("The poem has three lines"))
    assert line.split()[-7:] == ["1", "0.0", "-", "0", "-", "0.0", "-"]
    assert "NaN" not in out and "None" not in out
    rubric = tmp_path / "rubric.md"
    rubric.write_text(haiku.rubric, encoding="utf-8")
    code, out, _ = run_main(["analytics", "--db", db, "--rubric", f"@{rubric}"], capsys)
    assert code == 0 and out.startswith("1 run(s)")
    code, _, err = run_main(["analytics", "--db", db, "--experiment", "feed"], capsys)
    assert code == 2 and "no experiment 'feed'" in err
    with pytest.raises(SystemExit) as exiting:  # argparse: one scope at a time
        run_main(["analytics", "--db", db, "--run", "x", "--rubric", "- a"], capsys)
    assert exiting.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    code, out, _ = run_main(["analytics", "--db", db, "--rubric", "- never used"], capsys)
    assert code == 0 and "no graded runs in" in out and "for this rubric" in out


# --------------------------------------------------------------------------- issue 10


def test_resume_takes_the_prompt_and_settings_from_the_record(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "studio.sqlite3")
    with Store(db) as store:  # a run stopped before its first pass
        record = store.create_run(title="t", prompt="write it", rubric=RUBRIC,
                                  worker_model="openai-compatible:worker",
                                  grader_model="openai-compatible:grader", max_iterations=2,
                                  thread_id="th")
        store.finish_run(record.run_id, "interrupted")
    s = scripted(["draft"], [PASS])
    code, out, err = run_main(["run", "--db", db, "--thread", "th", "--resume",
                               "--base-url", s.server.base_url], capsys)
    assert code == 0, err
    assert "status: satisfied after 1 grading pass(es)" in out
    assert s.server.requests[0]["messages"][-1] == {"role": "user", "content": "write it"}


def test_run_records_in_the_apps_database_like_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 24.7: `run` without --db stored nothing while `eval` wrote to the app's database.
    db = tmp_path / "app.sqlite3"
    monkeypatch.setenv(DB_ENV_VAR, str(db))
    code, out, err = run_main(["run", "--example", "haiku", "--quiet", "--thread", "t1"], capsys)
    assert code == 0, err
    assert "recorded as run" in out and str(db) in out
    with Store(db) as store:
        [run] = store.list_runs()
    assert run.status == "satisfied" and run.thread_id == "t1"
    code, out, _ = run_main(["run", "--example", "haiku", "--quiet", "--no-db"], capsys)
    assert code == 0 and "recorded as run" not in out
    with Store(db) as store:
        assert len(store.list_runs()) == 1


def test_resume_moves_a_run_to_another_server_and_models_and_records_it(
    scripted: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 24.2: a run that ended on a dead port is finished elsewhere, through the real
    # command; the new endpoint and models are recorded in the run's settings.
    db = str(tmp_path / "studio.sqlite3")
    code, out, err = run_main(
        ["run", "--model", "openai-compatible:w", "--grader", "openai-compatible:g",
         "--base-url", "http://127.0.0.1:9/v1", "--prompt", "p", "--rubric", RUBRIC,
         "--db", db, "--thread", "th"], capsys)
    assert code == 1 and "status: error" in out, err
    s = scripted(["a draft"], [PASS])
    code, out, err = run_main(
        ["run", "--db", db, "--thread", "th", "--resume", "--base-url", s.server.base_url,
         "--model", "openai-compatible:w2", "--grader", "openai-compatible:g2"], capsys)
    assert code == 0, out + err
    assert "status: satisfied" in out
    assert [r["model"] for r in s.server.requests] == ["w2", "g2"]
    with Store(db) as store:
        [run] = store.list_runs()
    assert run.status == "satisfied" and run.settings.base_url == s.server.base_url
    assert (run.worker_model, run.grader_model) == ("openai-compatible:w2",
                                                    "openai-compatible:g2")


def test_resume_right_after_a_killed_run_on_this_host_needs_no_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 24: --resume right after the run's process was killed waited for the 30 s
    # heartbeat, although that process was this host's and gone. Here a heartbeat stays fresh
    # for an hour: only the gone owner can let the resume through.
    db = str(tmp_path / "studio.sqlite3")
    with FakeOpenAI() as server:
        server.enqueue(text("first draft"), FAIL, slow(60, text("never sent")))
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rubric_core", "run", "--model", "openai-compatible:w",
             "--grader", "openai-compatible:g", "--base-url", server.base_url, "--prompt",
             "p", "--rubric", RUBRIC, "--db", db, "--thread", "th"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while len(server.requests) < 3:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
        with Store(db) as store:
            assert store.list_runs()[0].status == "running"  # its heartbeat is fresh
        server.enqueue(text("second draft"), PASS)
        monkeypatch.setattr(session, "STALE_AFTER_S", 3600.0)
        code, out, err = run_main(["run", "--db", db, "--thread", "th", "--resume",
                                   "--base-url", server.base_url, "--quiet"], capsys)
        assert code == 0, out + err
    with Store(db) as store:
        [run] = store.list_runs()
    assert run.status == "satisfied"


def test_resume_keeps_the_stored_base_url(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "studio.sqlite3")
    s = scripted(["draft one", "draft two"], [FAIL, PASS])
    code, _, _ = run_main(s.argv("--prompt", "p", "--rubric", RUBRIC, "--db", db, "--thread",
                                 "th", "--max-iterations", "2", "--quiet"), capsys)
    assert code == 0
    with Store(db) as store:
        [run] = store.list_runs()
        assert run.settings.base_url == s.server.base_url
    code, out, _ = run_main(["run", "--db", db, "--thread", "th", "--resume"], capsys)
    assert code == 0 and "status: satisfied after 2 grading pass(es)" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param([], "no run on thread 'nope'", id="unknown_thread"),
        pytest.param(["--prompt", "another"], "was started with another prompt",
                     id="other_prompt"),
    ],
)
def test_resume_that_cannot_continue_exits_2(
    scripted: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str],
    message: str,
) -> None:
    db = str(tmp_path / "studio.sqlite3")
    with Store(db) as store:
        store.create_run(title="t", prompt="p", rubric=RUBRIC, worker_model="demo",
                         grader_model="rules", max_iterations=2, thread_id="th")
    s = scripted([], [])
    thread = "nope" if not extra else "th"
    code, out, err = run_main(["run", "--db", db, "--thread", thread, "--resume", *extra],
                              capsys)
    assert code == 2 and message in err, err
    assert out == "" and s.server.requests == []
    with Store(db) as store:
        assert len(store.list_runs()) == 1  # nothing new was started


@pytest.mark.parametrize(
    ("argv", "title"),
    [
        pytest.param(["--example", "haiku"], "haiku", id="example_title"),
        pytest.param(["--prompt", "Write   a  haiku\nabout spring " + "x" * 80, "--rubric",
                      "- The poem has three lines"], "prompt", id="prompt_start"),
    ],
)
def test_csv_run_title_is_the_apps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], title: str
) -> None:
    from rubric_core.examples import get_example
    from rubric_core.settings import RunSettings, run_title

    csv, db = tmp_path / "out.csv", tmp_path / "db.sqlite3"
    run_main(["run", *argv, "--csv", str(csv), "--db", str(db), "--quiet"], capsys)
    rows = pd.read_csv(csv, dtype=str, keep_default_na=False)
    expected = get_example("haiku").title if title == "haiku" else run_title(
        RunSettings(prompt=argv[1], rubric="- r"))
    assert set(rows["run_title"]) == {expected}
    assert len(expected) <= 60
    with Store(db) as store:
        assert [r.title for r in store.list_runs()] == [expected]


def test_final_answer_is_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["run", "--example", "haiku"], capsys)
    assert code == 0
    assert "── Final answer · 3/3 criteria pass ──" in out


def test_best_attempt_is_labelled_when_the_last_is_worse(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def events(*_: object, **__: object) -> Iterator[dict]:
        def ev(i: int, answer: str, passed: bool) -> dict:
            return {"grading_run_id": "g", "iteration": i, "answer": answer,
                    "criteria": [{"name": "c", "passed": passed}]}
        yield {"type": "run_finished", "thread_id": "t", "status": "max_iterations_reached",
               "answer": "worse", "evaluations": [ev(0, "better", True), ev(1, "worse", False)],
               "duration_s": 0.1, "error": None}

    monkeypatch.setattr("rubric_core.runner.run_rubric", events)
    code, out, _ = run_main(["run", "--prompt", "p", "--rubric", "- c", "--no-db"], capsys)
    assert code == 1
    assert "── last attempt (pass 2 of 2) · 0/1 criteria pass ──\nworse" in out
    assert "── best attempt (pass 1 of 2) · 1/1 criteria pass ──\nbetter" in out


def test_judging_options_reach_the_run_and_are_kept_for_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.sqlite3"
    code, out, err = run_main(
        ["run", "--example", "haiku", "--grader-repeats", "3", "--consensus", "unanimous",
         "--return-best", "--db", str(db), "--thread", "t1", "--quiet"], capsys)
    assert code == 0, err
    assert "(3 repeats, unanimous.)" in out
    with Store(db) as store:
        [run] = store.list_runs()
        evaluations = store.evaluations(run.run_id)
    assert (run.settings.grader_repeats, run.settings.consensus, run.settings.return_best) == (
        3, "unanimous", True)
    assert {ev.get("repeats") for ev in evaluations} == {3}
    code, _, err = run_main(["run", "--db", str(db), "--thread", "t1", "--resume",
                             "--grader-repeats", "1"], capsys)
    assert code == 2 and "another grader-repeats" in err


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--grader-repeats", "10"], "grader_repeats must be from 1 to 9", id="ten"),
    pytest.param(["--grader-repeats", "0"], "grader_repeats must be from 1 to 9", id="zero"),
    pytest.param(["--consensus", "most"], "invalid choice: 'most'", id="consensus"),
])
def test_bad_judging_options_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code, _, err = run_main(["run", "--example", "haiku", *args], capsys)
    except SystemExit as exiting:  # argparse's own refusal
        code, err = int(exiting.code or 0), capsys.readouterr().err
    assert code == 2 and message in err


def test_a_late_ctrl_c_after_an_interrupted_command_changes_nothing() -> None:
    """Once a command stopped on Ctrl-C (exit 130), a SIGINT arriving as the interpreter exits
    (Ctrl-C pressed twice, a second signal to the process group) is ignored: the exit status
    stays 130 (the Ctrl-C drill saw eval die of a late SIGINT, exit -2, after saying
    "interrupted"). The late SIGINT is sent by an exit handler, the last code that runs."""
    script = (
        "import atexit, os, signal\n"
        "import rubric_core.cli as cli\n"
        "def interrupted(*args, **kwargs):\n"
        "    print('interrupted', flush=True)\n"
        "    return 130\n"
        "cli.main = interrupted\n"
        "atexit.register(os.kill, os.getpid(), signal.SIGINT)\n"
        "cli.program()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stdout) == (130, "interrupted\n"), done
    assert "KeyboardInterrupt" not in done.stderr, done.stderr


def test_a_ctrl_c_inside_an_exec_during_the_command_still_exits_130_under_python_m(
        tmp_path: Path) -> None:
    """``python -m`` exits 130 after a handled Ctrl-C even when the KeyboardInterrupt first
    left an ``exec()`` of a string (as it does when Ctrl-C lands while an import builds a
    dataclass): CPython 3.11 then kills the process with SIGINT unless the flag it set is
    cleared (`rubric_core.cli.program`)."""
    (tmp_path / "interrupted_command.py").write_text(
        "import rubric_core.cli as cli\n"
        "def interrupted(*args, **kwargs):\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt')  # Ctrl-C while a dataclass is built\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', flush=True)\n"
        "        return 130\n"
        "    return 0\n"
        "cli.main = interrupted\n"
        "cli.program()\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "interrupted_command"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stdout) == (130, "interrupted\n"), done


def test_a_ctrl_c_inside_the_database_pools_own_clean_up_still_exits_130(
        pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C that lands inside psycopg_pool's ``connection()`` before it sets its timer
    reaches the command as an ``UnboundLocalError`` from the pool's ``finally``, with the
    KeyboardInterrupt as its context (seen once in the Ctrl-C drill of a fresh clone: eval
    exited 1 with that traceback). It is still the Ctrl-C: "interrupted", exit 130."""
    import psycopg_pool.pool

    real = psycopg_pool.pool.monotonic
    interrupted = []

    def ctrl_c_as_connection_sets_its_timer() -> float:
        if sys._getframe(1).f_code.co_name == "connection" and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return real()

    monkeypatch.setattr(psycopg_pool.pool, "monotonic", ctrl_c_as_connection_sets_its_timer)
    assert main(["datasets", "list", "--db", pg_url]) == 130
    assert interrupted
    assert capsys.readouterr().err.endswith("interrupted\n")


def test_an_error_with_no_ctrl_c_behind_it_is_not_taken_for_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import rubric_core.cli.datasets as datasets_command

    def broken(*args: object) -> int:
        first, second = "first", "second"
        try:
            raise ValueError(first)
        except ValueError:
            raise RuntimeError(second) from None

    monkeypatch.setattr(datasets_command, "datasets", broken)
    with pytest.raises(RuntimeError, match="second"):
        main(["datasets", "list"])
