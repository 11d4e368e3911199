"""One process grades a re-grade at a time: a second resumer is refused instead of paying for
the same gradings again, a killed holder is taken over at once, and a holder that lost its
hold stops. On SQLite and a real PostgreSQL, with real processes and a loopback server."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import ROOT
from holding_server import HoldingServer
from openai_server import DelayedServer, verdict
from pg_support import scalar
from test_lab_cli import _env, _held_after, _loopback, _run

from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
from rubric_core.lab import regrade as regrade_module
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

CRITERION = "answers the question"
DEAD_OWNER = "elsewhere.example:4242:0123abcd"  # another host: its pid cannot be checked here


def _job(store: Store, count: int = 3, base_url: str | None = None) -> str:
    answers = parse_answers("id,request,answer\n" + "".join(
        f"q{i},question {i},reply {i}\n" for i in range(count)), name="qa")
    config = GraderConfig(rubric=f"- {CRITERION}", grader_model="openai-compatible:g",
                          base_url=base_url) if base_url else GraderConfig(rubric="- c")
    return create_regrade(store, answers, [config]).job_id


def test_a_hold_goes_to_one_owner_until_released_or_run_out(store: Store) -> None:
    job_id = _job(store)
    assert store.hold_regrade(job_id, "a:1:x", hold_s=60) is None
    assert store.hold_regrade(job_id, "a:1:x", hold_s=60) is None  # its own: kept
    assert store.hold_regrade(job_id, DEAD_OWNER, hold_s=60) == "a:1:x"
    assert store.renew_regrade_hold(job_id, "a:1:x", hold_s=60)
    assert not store.renew_regrade_hold(job_id, DEAD_OWNER, hold_s=60)
    with pytest.raises(ValueError, match="being graded by a process now"):
        store.delete_regrade_job(job_id)
    assert not store.release_regrade(job_id, DEAD_OWNER)  # not its hold: nothing changes
    assert store.release_regrade(job_id, "a:1:x")
    assert store.hold_regrade(job_id, DEAD_OWNER, hold_s=0.05) is None
    time.sleep(0.3)  # the database's clock runs the hold out
    assert store.hold_regrade(job_id, "a:1:x", hold_s=60) is None
    assert not store.renew_regrade_hold(job_id, DEAD_OWNER, hold_s=60)  # it lost it
    with pytest.raises(KeyError):
        store.hold_regrade("nope", "a:1:x", hold_s=60)
    with pytest.raises(ValueError, match="positive"):
        store.hold_regrade(job_id, "a:1:x", hold_s=0)


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(store: Store) -> None:
    job_id = _job(store)
    proc = subprocess.Popen(["true"])
    proc.wait()  # a pid of this machine that has exited
    holder = f"{socket.gethostname()}:{proc.pid}:deadbeef"
    assert store.hold_regrade(job_id, holder, hold_s=600) is None
    assert store.delete_regrade_job(job_id)  # its holder is gone: deletable
    job_id = _job(store)
    assert store.hold_regrade(job_id, holder, hold_s=600) is None
    assert store.hold_regrade(job_id, "b:2:y", hold_s=60) is None  # no wait for the 600 s


def test_a_second_resumer_is_refused_and_pays_for_nothing(
        tmp_path: Path, db_location: Path | str) -> None:
    server = HoldingServer(free=10, delay_s=0.01)
    db = db_location
    with server.fake:
        first = subprocess.Popen(_loopback(tmp_path, server, 30, db), cwd=ROOT, env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _held_after(server, db, 10)  # ten recorded, both slots held: the first one grades
            with Store(db) as store:
                [job] = store.list_regrade_jobs()
            calls = server.calls
            code, out, err = _run(["regrade", "--resume", job.job_id, "--db", str(db),
                                   "--base-url", server.fake.base_url])
            assert code == 2, out + err
            assert "is being graded by another process (pid " in err
            assert server.calls == calls  # refused before any call
            server.release()
            out, err = first.communicate(timeout=120)
        finally:
            first.kill()
            first.wait()
        assert first.returncode == 0, out + err
    assert server.calls == 30  # each answer graded once, by the first process only
    assert scalar(db, "SELECT COUNT(*) FROM regrade_results") == 30
    with Store(db) as store:
        assert store.get_regrade_job(job.job_id).status == "finished"  # type: ignore[union-attr]
        assert store.hold_regrade(job.job_id, "c:3:z", hold_s=60) is None  # released at the end


def test_a_holder_that_lost_its_hold_stops_and_records_nothing_more(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(regrade_module, "HEARTBEAT_S", 0.1)
    server = DelayedServer(0.05, verdict("satisfied", (), (CRITERION,)))
    with server.fake:
        job_id = _job(store, count=200, base_url=server.fake.base_url)
        events: list[Any] = []
        recorded_when_lost = None
        for event in run_regrade(store, job_id, concurrency=2):
            events.append(event)
            if event["type"] == "item_graded" and recorded_when_lost is None:
                # Another process takes the re-grade over (this one was paused past its hold).
                with store._connect(write=True) as conn:  # the takeover, as SQL
                    conn.execute("UPDATE regrade_jobs SET owner = ? WHERE job_id = ?",
                                 (DEAD_OWNER, job_id))
                recorded_when_lost = len(store.regrade_results(job_id))
    assert events[-1]["type"] == "regrade_finished"
    assert events[-1]["status"] == "stopped"
    recorded = len(store.regrade_results(job_id))
    assert recorded_when_lost is not None
    # It noticed at its next renewal (0.1 s here) and stopped: a few gradings at most, far
    # from the 200 it would have graded. (A grading recorded after the loss is harmless: each
    # key is recorded once, and the new holder skips it.)
    assert recorded < recorded_when_lost + 40
    assert recorded < 200
    job = store.get_regrade_job(job_id)
    assert job is not None and job.status == "running"  # left to its new holder to say


@pytest.mark.parametrize("owner", [
    "[click](https://evil.example):1:x",  # Markdown on the Lab page
    "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD:77:x",  # a key-shaped host
    "host.example:<script>alert(1)</script>:x",  # not a pid
    "a\nb:1:x",
])
def test_a_holder_written_by_anyone_cannot_put_its_text_in_the_messages(
        store: Store, owner: str) -> None:
    from rubric_core.app_support import regrade_view

    job_id = _job(store)
    assert store.hold_regrade(job_id, owner, hold_s=600) is None
    with pytest.raises(regrade_module.RegradeBusy) as refused:
        list(run_regrade(store, job_id))
    message = regrade_view(store, job_id).message
    assert message is not None
    for shown in (str(refused.value), message.text):
        assert "pid " in shown and "evil" not in shown and "sk-proj" not in shown
        assert "<script>" not in shown and "](" not in shown and "\n" not in shown
