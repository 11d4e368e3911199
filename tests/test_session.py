"""The session layer: start and resume record a run; the active registry; the stale-owner rule.

Every test runs on SQLite and on PostgreSQL (the ``store`` fixture of tests/conftest.py): what
another process is doing is read from the rows alone, on either database.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from rubric_core import session, stopping
from rubric_core.examples import get_example
from rubric_core.settings import RunSettings
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path


ALWAYS_STALE = "9999-01-01T00:00:00.000000+00:00"
"""A ``stale_before`` after any heartbeat: `Store.claim_run` takes the run whatever its state."""


def _haiku(**changes: Any) -> RunSettings:
    ex = get_example("haiku")
    return RunSettings(prompt=ex.prompt, rubric=ex.rubric, example_name="haiku",
                       worker_system_prompt=ex.worker_system_prompt).replace(**changes)


def _stop_after_first_pass(run: session.Session) -> None:
    graded = False
    for event in run:
        graded = graded or event["type"] == "evaluation_finished"
        if graded and event["type"] == "worker_token":
            break
    run.close()  # what a Stop or a rerun does to the page's loop


def _backdate(store: Store, run_id: str, seconds: float = 3600) -> None:
    """Set a run's heartbeat ``seconds`` in the past, as a process that died leaves it."""
    stamp = (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat(timespec="microseconds")
    with store._connect(write=True) as conn:
        conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (stamp, run_id))


def test_start_records_the_run_with_its_settings(store: Store) -> None:
    run = session.start(store, _haiku())
    events = list(run)
    assert events[-1]["type"] == "run_finished" and events[-1]["status"] == "satisfied"
    stored = store.get_run(run.run_id)
    assert stored is not None and stored.status == "satisfied"
    assert stored.iterations == len(events[-1]["evaluations"]) >= 2
    assert stored.duration_s is not None and stored.duration_s > 0
    assert stored.settings == _haiku().titled()
    assert stored.title == get_example("haiku").title


def test_invalid_settings_store_nothing(store: Store) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        session.start(store, _haiku(prompt=" "))
    with pytest.raises(ValueError, match="ghost"):
        session.start(store, _haiku(grader_tools=("ghost",)))
    assert store.list_runs() == []


def test_interrupt_then_resume_continues_the_same_grading_run(store: Store) -> None:
    run = session.start(store, _haiku())
    _stop_after_first_pass(run)
    interrupted = store.get_run(run.run_id)
    assert interrupted is not None and interrupted.status == "interrupted"
    assert session.is_resumable(interrupted)
    assert [r.run_id for r in session.resumable_runs(store)] == [run.run_id]
    first_gid = store.evaluations(run.run_id)[0]["grading_run_id"]

    events = list(session.resume(store, run.run_id))
    assert events[-1]["status"] == "satisfied"
    evaluations = store.evaluations(run.run_id)
    assert {e["grading_run_id"] for e in evaluations} == {first_gid}
    assert [e["iteration"] for e in evaluations] == list(range(len(evaluations)))
    assert session.resumable_runs(store) == []


def test_an_exception_marks_the_run_error_and_it_stays_resumable(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        yield {"type": "worker_started", "iteration": 0}
        msg = "worker crashed"
        raise RuntimeError(msg)

    monkeypatch.setattr(stopping, "run_rubric", boom)  # the pump runs it
    run = session.start(store, _haiku())
    with pytest.raises(RuntimeError):
        list(run)
    stored = store.get_run(run.run_id)
    assert stored is not None and stored.status == "error" and "worker crashed" in stored.error
    assert session.is_resumable(stored)
    monkeypatch.undo()
    assert list(session.resume(store, run.run_id))[-1]["status"] == "satisfied"


def test_the_registry_blocks_a_second_recorder(store: Store) -> None:
    run = session.start(store, _haiku())
    next(run)
    assert session.is_active(run.run_id)
    with pytest.raises(RuntimeError, match="still running"):
        session.resume(store, run.run_id)
    run.close()
    assert not session.is_active(run.run_id)
    assert session.wait_until_inactive(run.run_id, timeout_s=0.1)
    assert store.get_run(run.run_id).status == "interrupted"


def test_a_running_run_whose_owner_died_is_interrupted_and_resumable(store: Store) -> None:
    record = store.create_run(_haiku().titled())  # as a killed process leaves it
    assert not session.is_stale(record) and not session.is_resumable(record)
    with pytest.raises(RuntimeError, match="still running"):
        session.resume(store, record.run_id)  # its owner may be alive: its heartbeat is fresh
    _backdate(store, record.run_id, session.STALE_AFTER_S + 5)
    stale = store.get_run(record.run_id)
    assert stale is not None and session.is_stale(stale)
    assert session.run_status(stale) == "interrupted" and session.is_resumable(stale)
    assert [r.run_id for r in session.resumable_runs(store)] == [record.run_id]
    assert store.get_run(record.run_id).status == "interrupted"  # written by reconcile
    assert list(session.resume(store, record.run_id))[-1]["status"] == "satisfied"


def test_a_live_run_in_this_process_is_never_stale(store: Store) -> None:
    run = session.start(store, _haiku())
    next(run)
    _backdate(store, run.run_id)
    assert not session.is_stale(store.get_run(run.run_id))
    assert session.reconcile(store) == 0
    run.close()


def test_the_heartbeat_touches_the_row(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "HEARTBEAT_S", 0.01)
    run = session.start(store, _haiku())
    next(run)
    _backdate(store, run.run_id)
    before = store.get_run(run.run_id).updated_at
    assert session.wait_until_inactive(run.run_id, timeout_s=0.2) is False
    after = store.get_run(run.run_id)
    assert after.updated_at > before and after.duration_s is not None
    run.close()


def test_resume_of_an_unknown_run_says_so(store: Store) -> None:
    with pytest.raises(KeyError, match="no run with id 'nope'"):
        session.resume(store, "nope")


def test_claim_run_lets_one_of_two_resumers_win(db_location: Path | str) -> None:
    with Store(db_location) as shared:
        _claims(shared)


def _claims(store: Store) -> None:
    run = session.start(store, _haiku())
    list(run)
    fresh = session.stale_before()
    # An ended run is claimed once; a second claimant then sees a live 'running' row.
    assert store.claim_run(run.run_id, stale_before=fresh)
    assert store.get_run(run.run_id).status == "running"
    assert not store.claim_run(run.run_id, stale_before=fresh)
    # A 'running' row whose heartbeat is older than the cut-off lost its owner: claimable.
    assert store.claim_run(run.run_id, stale_before="9999-01-01T00:00:00.000000+00:00")
    with pytest.raises(KeyError):
        store.claim_run("no-such-run", stale_before=fresh)


def test_a_resumer_that_read_the_run_before_it_ended_does_not_take_it_back(
        db_location: Path | str) -> None:
    """A claim names the status its caller read: a run another process resumed and finished
    since is not claimed back (a paused worker waking up, a slow second Resume); a run seen
    finished may still be resumed on purpose."""
    with Store(db_location) as store:
        run = session.start(store, _haiku())
        list(run)
        store.finish_run(run.run_id, "interrupted")
        seen = store.get_run(run.run_id)
        assert seen is not None and seen.status == "interrupted"
        # Another process resumes it and finishes it.
        assert store.claim_run(run.run_id, stale_before=session.stale_before(), owner="b:2:y",
                               seen_status="interrupted")
        store.finish_run(run.run_id, "satisfied", owner="b:2:y")
        # The first wakes up with what it read: refused, and the run stays finished.
        assert not store.claim_run(run.run_id, stale_before=ALWAYS_STALE, owner="a:1:x",
                                   seen_status=seen.status)
        after = store.get_run(run.run_id)
        assert after is not None and (after.status, after.owner) == ("satisfied", "b:2:y")
        # Seen finished and resumed on purpose (a Resume with changes): claimed.
        assert store.claim_run(run.run_id, stale_before=ALWAYS_STALE, owner="a:1:x",
                               seen_status="satisfied")
        # A session claims with what it read: a Resume whose run another process resumed and
        # finished after it read it (before its first step) is refused.
        store.finish_run(run.run_id, "interrupted", owner="a:1:x")
        late = session.resume(store, run.run_id)
        assert store.claim_run(run.run_id, stale_before=session.stale_before(), owner="c:3:z",
                               seen_status="interrupted")
        store.finish_run(run.run_id, "satisfied", owner="c:3:z")
        with pytest.raises(RuntimeError, match="was just resumed by another server"):
            list(late)
        after = store.get_run(run.run_id)
        assert after is not None and (after.status, after.owner) == ("satisfied", "c:3:z")


def test_a_late_stop_or_failure_never_replaces_a_recorded_ending(
        db_location: Path | str) -> None:
    """A recorder that learns late that its run ended (a cancelled wait for the write of its
    ending, a process woken from a pause) and records the run stopped or failed leaves the
    ending as it was; a run still running is still marked."""
    from rubric_core.store import StoreError

    with Store(db_location) as store:
        run = session.start(store, _haiku())
        ending = list(run)[-1]["status"]
        record = store.get_run(run.run_id)
        assert record is not None and record.status == ending != "running"
        late = session._Recording(store, record, resume=False, owner=run.owner)
        late.stopped()
        late = session._Recording(store, record, resume=False, owner=run.owner)
        late.failed(StoreError("the database went away"))
        # The graph's own ending after its last pass recorded the verdict: a lost connection
        # to its last checkpoint's write (the SIGSTOP drill: the server ended the paused
        # worker's transaction), reported by the runner as interrupted.
        late = session._Recording(store, record, resume=False, owner=run.owner)
        late.record({"type": "run_finished", "thread_id": run.record.thread_id,
                     "status": "interrupted", "answer": "", "evaluations": [],
                     "duration_s": 1.0, "error": "StoreUnavailable: lost the connection"})
        assert late.finished
        after = store.get_run(run.run_id)
        assert after is not None and (after.status, after.owner) == (ending, run.owner)
        assert not store.finish_run(run.run_id, "interrupted", owner=run.owner,
                                    only_running=True)
        assert store.claim_run(run.run_id, stale_before=ALWAYS_STALE, owner=run.owner)
        assert store.finish_run(run.run_id, "interrupted", owner=run.owner, only_running=True)
        assert store.get_run(run.run_id).status == "interrupted"  # type: ignore[union-attr]


def test_judging_options_travel_from_settings_to_the_middleware_and_back(store: Store) -> None:
    from scripted import ScriptedChatModel, verdict

    fails_c2 = verdict("needs_revision", "c2 missing", ["c1", ("c2", "add c2")])
    passes = verdict("satisfied", "fine", ["c1", "c2"])
    worse = verdict("needs_revision", "both gone", [("c1", "lost c1"), ("c2", "add c2")])
    worker = ScriptedChatModel(replies=["draft 1", "draft 2"])
    grader = ScriptedChatModel(replies=[fails_c2, fails_c2, passes, worse, worse, worse])

    def models(name: str, role: session.Role, base_url: str | None) -> Any:
        return worker if role == "worker" else grader

    settings = RunSettings(prompt="write it", rubric="- c1\n- c2", max_iterations=2,
                           grader_repeats=3, consensus="majority", return_best=True)
    run = session.start(store, settings, models=models)
    final = list(run)[-1]
    assert final["status"] == "max_iterations_reached"
    assert final["answer"] == "draft 1"  # the best attempt, not the last one
    assert len(grader.calls) == 6  # three gradings of each of the two answers
    first, second = store.evaluations(run.run_id)
    assert first["unstable"] == ["c2"]
    agreement = {c["name"]: c["agreement"] for c in first["criteria"]}
    assert agreement == {"c1": 1.0, "c2": pytest.approx(2 / 3, abs=1e-4)}
    assert second["regressed"] == ["c1"]
    stored = store.get_run(run.run_id)
    assert stored is not None
    assert (stored.settings.grader_repeats, stored.settings.consensus,
            stored.settings.return_best) == (3, "majority", True)


def _scripted_models(worker_replies: list[Any], grader_replies: list[Any]) -> Any:
    from scripted import ScriptedChatModel

    worker = ScriptedChatModel(replies=worker_replies, default="another draft")
    grader = ScriptedChatModel(replies=grader_replies)

    def models(name: str, role: session.Role, base_url: str | None) -> Any:
        return worker if role == "worker" else grader

    return models


def test_a_paused_owner_whose_run_was_taken_over_writes_nothing_more(
    db_location: Path | str,
) -> None:
    from scripted import verdict

    from rubric_core.store import RunTakenOver

    fail = verdict("needs_revision", "c2 missing", ["c1", ("c2", "add c2")])
    ok = verdict("satisfied", "fine", ["c1", "c2"])
    with Store(db_location) as store:
        settings = RunSettings(prompt="write it", rubric="- c1\n- c2", max_iterations=5)
        paused = session.start(store, settings, models=_scripted_models(
            ["draft 1", "draft 2", "draft 3"], [fail, fail, ok]))
        events = iter(paused)
        for event in events:
            if event["type"] == "evaluation_finished":
                break  # the owner is paused here, between passes, long enough to look dead
        # Another process finds it silent and resumes it: it is the owner now.
        assert store.claim_run(paused.run_id, owner="elsewhere:1:x",
                               stale_before="9999-01-01T00:00:00.000000+00:00")
        assert not store.touch_run(paused.run_id, owner=paused.owner)  # its heartbeat is refused
        with pytest.raises(RunTakenOver, match="taken over by another server or process"):
            for _ in events:
                pass  # the paused owner wakes up and goes on
        record = store.get_run(paused.run_id)
        assert record is not None
        assert (record.status, record.owner) == ("running", "elsewhere:1:x")
        assert len(store.evaluations(paused.run_id)) == 1  # its second pass was not recorded
        # Nor its second pass's model calls: only the first pass's worker and grader calls.
        assert [c["role"] for c in store.calls(paused.run_id)] == ["worker", "grader"]
        with pytest.raises(RunTakenOver):
            store.add_calls(paused.run_id, store.calls(paused.run_id)[:1], owner=paused.owner)
        with pytest.raises(RunTakenOver):
            store.finish_run(paused.run_id, "interrupted", owner=paused.owner)
        assert store.touch_run(paused.run_id, owner="elsewhere:1:x")
        # A run that ended is not lost to its owner: a heartbeat that fires between the last
        # pass (which sets the run's status) and the ending must not read as a takeover.
        store.finish_run(paused.run_id, "satisfied", owner="elsewhere:1:x")
        assert store.touch_run(paused.run_id, owner="elsewhere:1:x")
        assert store.get_run(paused.run_id).status == "satisfied"  # type: ignore[union-attr]


def _checkpoint_ids(store: Store, thread_id: str) -> set[str]:
    return {t.config["configurable"]["checkpoint_id"]
            for t in store.saver().list({"configurable": {"thread_id": thread_id}})}


@pytest.mark.parametrize("on_loop", [False, True], ids=["session", "async_session"])
def test_a_taken_over_owner_stores_no_checkpoint_and_calls_no_model(
    db_location: Path | str, on_loop: bool,
) -> None:
    """The owner is held inside its second grader call while another process takes the run
    over; once it goes on, that pass's checkpoint and evaluation are refused (fenced), which
    ends its graph before another model call, and it stops with `RunTakenOver`.

    Held in a model call, not paused after an event: the graph runs ahead of its events (on a
    thread of its own, or as a task), so a pause after ``evaluation_finished`` raced the next
    step's checkpoint, which could be stored before the takeover (and its model call made)."""
    import asyncio
    import threading

    from scripted import ScriptedChatModel, verdict

    from rubric_core.store import RunTakenOver

    fail = verdict("needs_revision", "c2 missing", ["c1", ("c2", "add c2")])
    grading, release = threading.Event(), threading.Event()

    def held(_messages: Any) -> Any:
        grading.set()
        assert release.wait(60), "the test never released the grader"
        return fail

    worker = ScriptedChatModel(replies=[], default="a draft")
    grader = ScriptedChatModel(replies=[fail, held, fail, fail, fail])

    def models(name: str, role: session.Role, base_url: str | None) -> Any:
        return worker if role == "worker" else grader

    settings = RunSettings(prompt="write it", rubric="- c1\n- c2", max_iterations=5)
    with Store(db_location) as store:

        def take_over(run_id: str, thread_id: str) -> tuple[set[str], int]:
            # Another process finds the owner silent and resumes the run.
            assert grading.wait(60), "the second grader call never came"
            # The first pass's evaluation is recorded by the owner's consumer, which may trail
            # the graph (seen in a fresh clone's run): the takeover comes after it.
            deadline = time.monotonic() + 60
            while not store.evaluations(run_id) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert store.claim_run(run_id, owner="elsewhere:1:x", stale_before=ALWAYS_STALE)
            seen = _checkpoint_ids(store, thread_id), len(worker.calls) + len(grader.calls)
            release.set()  # the owner wakes up and goes on
            return seen

        if on_loop:
            async def owner() -> tuple[Any, set[str], int]:
                run = await session.astart(store, settings, models=models)

                async def drain() -> None:
                    async for _ in run:
                        pass

                going = asyncio.ensure_future(drain())
                seen = await asyncio.to_thread(take_over, run.run_id, run.record.thread_id)
                with pytest.raises(RunTakenOver):
                    await going
                return run, *seen

            run, at_claim, calls = asyncio.run(owner())
        else:
            run = session.start(store, settings, models=models, watch=False)
            raised: list[BaseException] = []

            def drain() -> None:
                try:
                    for _ in run:
                        pass
                except BaseException as exc:  # handed to the test's thread
                    raised.append(exc)

            going = threading.Thread(target=drain)
            going.start()
            at_claim, calls = take_over(run.run_id, run.record.thread_id)
            going.join(60)
            assert not going.is_alive()
            assert len(raised) == 1 and isinstance(raised[0], RunTakenOver), raised
        assert calls == 4  # two passes' worker and grader calls, the second grader's held
        assert _checkpoint_ids(store, run.record.thread_id) == at_claim
        assert len(worker.calls) + len(grader.calls) == calls
        assert len(store.evaluations(run.run_id)) == 1  # the held pass was not recorded
        record = store.get_run(run.run_id)
        assert record is not None and (record.status, record.owner) == ("running",
                                                                         "elsewhere:1:x")


def test_heartbeats_are_timed_by_the_database_servers_clock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as real_datetime
    import time as real_time

    import psycopg

    from rubric_core.store import _core

    hour = 3600.0
    real_now = real_datetime.datetime.now

    class AheadDatetime(real_datetime.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # this machine's clock runs an hour fast
            return real_now(tz) + real_datetime.timedelta(seconds=hour)

    monkeypatch.setattr(_core, "datetime", AheadDatetime)
    real_time_time = real_time.time
    monkeypatch.setattr(real_time, "time", lambda: real_time_time() + hour)
    with Store(pg_url) as store:
        run = store.create_run(prompt="p", rubric="- a")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            (server,) = conn.execute("SELECT clock_timestamp()").fetchone()
        written = real_datetime.datetime.fromisoformat(run.created_at)
        assert abs((written - server).total_seconds()) < 5  # the server's time, not ours
        fresh = store.get_run(run.run_id)
        assert fresh is not None and not session.is_stale(fresh)
        assert session.reconcile(store) == 0


def test_active_registry_refuses_a_second_hold_and_wakes_its_waiters() -> None:
    import threading

    from rubric_core.registry import ActiveRegistry, new_owner

    registry: ActiveRegistry[threading.Event] = ActiveRegistry("Experiment")
    stop = threading.Event()
    with registry.hold("abcdefgh-1234", stop) as held:
        assert held is stop and "abcdefgh-1234" in registry
        assert registry.get("abcdefgh-1234") is stop and registry.keys() == {"abcdefgh-1234"}
        with pytest.raises(RuntimeError, match=r"^Experiment abcdefgh is already running or "
                                               r"stopping in this server"):
            registry.add("abcdefgh-1234", threading.Event())
        assert not registry.wait_until_inactive("abcdefgh-1234", timeout_s=0.01)
        waited: list[bool] = []
        waiter = threading.Thread(target=lambda: waited.append(
            registry.wait_until_inactive("abcdefgh-1234", timeout_s=10)))
        waiter.start()
    waiter.join(timeout=10)
    assert waited == [True] and "abcdefgh-1234" not in registry
    assert registry.get("abcdefgh-1234") is None
    host, pid, tag = new_owner().split(":")
    assert host and pid == str(os.getpid()) and len(tag) == 8 and new_owner() != new_owner()


def test_an_owner_is_gone_only_when_it_was_this_hosts_and_has_exited() -> None:
    import socket
    import subprocess
    import sys

    from rubric_core.registry import new_owner, owner_is_gone

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = socket.gethostname()
    assert owner_is_gone(f"{host}:{child.pid}:abcd1234")
    assert not owner_is_gone(new_owner())  # this process
    assert not owner_is_gone(f"another-host-{host}:{child.pid}:abcd1234")
    assert not owner_is_gone(None) and not owner_is_gone("garbage")


@pytest.mark.parametrize(("value", "ok"), [
    pytest.param("", True, id="unset_a_third_of_staleness"),
    pytest.param("0.25", True, id="a_quarter_second"),
    pytest.param("0.01", False, id="too_often"),
    pytest.param("11", False, id="over_a_third_of_30_s"),
    pytest.param("soon", False, id="not_a_number"),
])
def test_the_heartbeat_setting_is_checked(monkeypatch: pytest.MonkeyPatch, value: str,
                                          ok: bool) -> None:
    from rubric_core import registry

    monkeypatch.setenv(registry.HEARTBEAT_ENV, value)
    monkeypatch.setattr(registry, "STALE_AFTER_S", 30.0)
    if ok:
        assert registry._heartbeat_s() == (float(value) if value else 5.0)
    else:
        with pytest.raises(ValueError, match=registry.HEARTBEAT_ENV):
            registry._heartbeat_s()
