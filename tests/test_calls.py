"""Call traces (`rubric_core.calls`): every model call of a run, caught, bounded and scrubbed.

Model traffic goes to the loopback OpenAI-compatible server (`openai_server.CachingOpenAI`,
which reports cached prompt tokens as OpenAI does), through the runner's three paths: the
watched sync stream (``stream_events`` v3), the unwatched sync stream and ``astream`` (where
grader repeats run under ``asyncio.gather``).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from langchain_core.tools import tool
from openai_server import CachingOpenAI, Reply, error, text, tool_call, verdict

from rubric_core import session
from rubric_core.calls import bounded_text, open_log
from rubric_core.http_retry import SharedBackoff
from rubric_core.models import model_resolver, resolve_model
from rubric_core.redact import REDACTED
from rubric_core.runner import RunSpec, arun_rubric, run_rubric
from rubric_core.settings import RunSettings
from rubric_core.store import RunTakenOver, Store
from rubric_core.types import CALL_MESSAGE_CHAR_LIMIT, CALL_REPLY_CHAR_LIMIT

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
RUBRIC = "- c1\n- c2"
PROMPT = "Write a short note. " + "Context that stays the same on every call. " * 40
FAIL = verdict("needs_revision", ("c2",))
PASS = verdict("satisfied")


class Scripted:
    """Worker drafts and grader replies served by one caching server, told apart by tools."""

    def __init__(self, drafts: list[Reply], grader: list[Reply], **kwargs: Any) -> None:
        self.drafts, self.grader = list(drafts), list(grader)
        self.server = CachingOpenAI(default=self.respond, **kwargs)

    def respond(self, body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        return self.grader.pop(0) if "GraderResponse" in names else self.drafts.pop(0)

    def model(self, name: str, **kwargs: Any) -> Any:
        return resolve_model(f"openai-compatible:{name}", base_url=self.server.base_url,
                             api_key="test-key", **kwargs)


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[Scripted] = []

    def make(drafts: list[Reply], grader: list[Reply], **kwargs: Any) -> Scripted:
        servers.append(Scripted(drafts, grader, **kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.server.stop()


def _calls(events: list[Any]) -> list[dict[str, Any]]:
    return [c for e in events if e["type"] in ("evaluation_finished", "run_finished")
            for c in e.get("calls", [])]


def _run(spec: RunSpec, path: str) -> list[Any]:
    if path == "async":
        async def consume() -> list[Any]:
            return [e async for e in arun_rubric(spec)]

        return asyncio.run(consume())
    return list(run_rubric(spec))


# --------------------------------------------------------------------------- capture


@pytest.mark.parametrize("path", ["watched", "unwatched", "async"])
def test_every_call_is_traced_with_cached_tokens_per_call_and_pass(scripted: Any,
                                                                   path: str) -> None:
    s = scripted([text("draft one"), text("draft two")], [FAIL, PASS])
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=s.model("worker"),
                   grader=s.model("grader"), max_iterations=3,
                   watch_worker=path == "watched")
    events = _run(spec, path)
    assert events[-1]["status"] == "satisfied"
    calls = _calls(events)
    assert [(c["role"], c["iteration"]) for c in calls] == [
        ("worker", 0), ("grader", 0), ("worker", 1), ("grader", 1)]
    # Every call's usage is the server's, as reported, in the order it answered.
    assert [c["cached_input_tokens"] for c in calls] == s.server.cached
    assert all(c["status"] == "ok" and c["model"] in ("worker", "grader") for c in calls)
    assert all(c["provider"] == "openai" and c["latency_s"] > 0 for c in calls)
    # The grader's stable start (instructions, criteria, request) is cached on its 2nd call.
    first_grader, second_grader = calls[1], calls[3]
    assert first_grader["cached_input_tokens"] == 0
    assert second_grader["cached_input_tokens"] >= 256
    assert second_grader["cached_input_tokens"] < second_grader["input_tokens"]
    evaluations = [e["evaluation"] for e in events if e["type"] == "evaluation_finished"]
    assert [ev["cached_input_tokens"] for ev in evaluations] == [
        first_grader["cached_input_tokens"], second_grader["cached_input_tokens"]]
    assert [ev["input_tokens"] for ev in evaluations] == [
        first_grader["input_tokens"], second_grader["input_tokens"]]
    # Messages as sent and the reply with its tool call.
    assert calls[0]["messages"][0] == {"role": "human", "text": PROMPT}
    assert calls[0]["reply"]["text"] == "draft one"
    assert calls[1]["tools"] == ["GraderResponse"]
    verdict_call = calls[1]["reply"]["tool_calls"][0]
    assert verdict_call["name"] == "GraderResponse"
    assert json.loads(verdict_call["args"])["result"] == "needs_revision"
    assert calls[2]["messages"][-1]["role"] == "human"  # the revision turn
    assert calls[2]["messages"][-1]["name"] == "rubric_grader"
    # Streamed calls know their first token; the worker streams when watched.
    assert (calls[0]["first_token_s"] is not None) == (path == "watched")


def test_grader_repeats_under_gather_are_each_traced(scripted: Any) -> None:
    s = scripted([text("draft")], [PASS, PASS, PASS])
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=s.model("worker"),
                   grader=s.model("grader"), grader_repeats=3, watch_worker=False)
    events = _run(spec, "async")
    calls = _calls(events)
    assert [(c["role"], c["iteration"]) for c in calls] == [("worker", 0)] + [("grader", 0)] * 3
    assert len({c["call_id"] for c in calls}) == 4
    evaluation = events[-1]["evaluations"][0]
    assert evaluation["cached_input_tokens"] == sum(c["cached_input_tokens"] for c in calls[1:])
    assert evaluation["input_tokens"] == sum(c["input_tokens"] for c in calls[1:])


def test_grader_retry_is_an_error_call_then_the_next_attempt(scripted: Any) -> None:
    s = scripted([text("draft")], [error(500, "server fell over"), PASS])
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=s.model("worker"),
                   grader=s.model("grader"))
    events = _run(spec, "unwatched")
    assert events[-1]["status"] == "satisfied"
    grader = [c for c in _calls(events) if c["role"] == "grader"]
    assert [(c["status"], c["attempt"]) for c in grader] == [("error", 0), ("ok", 1)]
    assert "server fell over" in grader[0]["error"] and grader[0]["reply"] is None


@pytest.mark.parametrize("path", ["unwatched", "async"])
def test_http_retries_of_the_shared_backoff_are_counted_per_call(scripted: Any,
                                                                 path: str) -> None:
    s = scripted([error(503, "busy"), error(429, "slow down"), text("draft")], [PASS])
    models = model_resolver(backoff=SharedBackoff(base_s=0.0, max_s=0.0), streaming=False,
                            api_key="test-key")
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, watch_worker=False,
                   worker=models("openai-compatible:worker", "worker", s.server.base_url),
                   grader=models("openai-compatible:grader", "grader", s.server.base_url))
    calls = _calls(_run(spec, path))
    assert [(c["role"], c["http_retries"]) for c in calls] == [("worker", 2), ("grader", 0)]


def test_a_worker_that_raises_mid_run_is_recorded_as_an_error_call(scripted: Any) -> None:
    s = scripted([text("draft"), error(400, "context too long")], [FAIL])
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=s.model("worker"),
                   grader=s.model("grader"))
    events = _run(spec, "watched")
    assert events[-1]["status"] == "error"  # as before: the run ends on the worker's error
    failed = events[-1]["calls"]
    assert [(c["role"], c["iteration"], c["status"]) for c in failed] == [
        ("worker", 1, "error")]
    assert "context too long" in failed[0]["error"]


def test_calls_on_untraced_threads_are_not_kept(scripted: Any) -> None:
    s = scripted([text("draft"), text("outside")], [PASS])
    log = open_log("some-other-thread")
    worker = s.model("worker")
    events = list(run_rubric(RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=worker,
                                     grader=s.model("grader"))))
    assert len(_calls(events)) == 2 and log.drain() == []
    # The same model used outside any run answers as before and leaves no trace anywhere.
    assert worker.invoke("hi").content == "outside"
    assert log.drain() == []


# --------------------------------------------------------------------------- bounds, secrets


def test_bounded_text_never_keeps_part_of_a_key_cut_at_the_edge() -> None:
    key = "sk-" + "A1b2C3d4" * 8
    for offset in range(-70, 10, 7):  # the key straddles the head's cut, then the tail's
        head_cut = (200 - 80) * 3 // 4
        body = "x " * ((head_cut + offset) // 2) + key + " y" * 2_500
        kept = bounded_text(body, 200)
        assert "A1b2C3d4A1b2" not in kept and "sk-A1b2" not in kept
        tail = "z " * 2_500 + key + " w" * ((30 + offset + 60) // 2)
        assert "A1b2C3d4A1b2" not in bounded_text(tail, 200)
    # Whole, in kept text, the key is scrubbed as usual.
    assert bounded_text(f"my {key} here", 200) == f"my {REDACTED} here"


def test_a_five_megabyte_reply_is_kept_bounded(scripted: Any) -> None:
    huge = "word " * 1_000_000
    s = scripted([text(huge)], [PASS])
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=s.model("worker"),
                   grader=s.model("grader"), watch_worker=False)
    calls = _calls(_run(spec, "unwatched"))
    worker, grader = calls
    assert len(worker["reply"]["text"]) < CALL_REPLY_CHAR_LIMIT + 200
    assert "characters omitted by Rubric Studio" in worker["reply"]["text"]
    assert all(len(m["text"]) < CALL_MESSAGE_CHAR_LIMIT + 200 for m in grader["messages"])
    assert len(json.dumps(calls)) < 100_000


def test_keys_in_a_reply_and_in_tool_output_are_scrubbed(
        scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "Zq81hd7Gq0Lm2-configured-secret"
    monkeypatch.setenv("MY_SERVICE_API_KEY", secret)
    shaped = "sk-proj-" + "K3y" * 12

    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return f"found {query} and {secret}"

    s = scripted([text(f"draft with {secret} and {shaped}")],
                 [tool_call("lookup", {"query": shaped}), PASS])
    spec = RunSpec(prompt=PROMPT, rubric=RUBRIC, worker=s.model("worker"),
                   grader=s.model("grader"), grader_tools=[lookup])
    events = _run(spec, "watched")
    assert events[-1]["status"] == "satisfied"
    calls = _calls(events)
    assert len(calls) == 3
    dumped = json.dumps(calls)
    assert secret not in dumped and shaped not in dumped and "K3yK3yK3y" not in dumped
    assert REDACTED in calls[0]["reply"]["text"]
    tool_result = [m for m in calls[2]["messages"] if m["role"] == "tool"]
    assert tool_result and REDACTED in tool_result[0]["text"]


# --------------------------------------------------------------------------- stored with the run


def _call(call_id: str, *, text_chars: int = 10, **fields: Any) -> dict[str, Any]:
    return {"call_id": call_id, "role": "grader", "iteration": 0, "grading_run_id": "g",
            "attempt": 0, "provider": "openai", "model": "gpt-x-2026", "status": "ok",
            "error": None, "started_at": "2026-12-05T10:00:00.000000+00:00", "latency_s": 0.5,
            "first_token_s": None, "input_tokens": 1200, "cached_input_tokens": 1024,
            "cache_creation_tokens": 0, "output_tokens": 30, "http_retries": 0,
            "messages": [{"role": "human", "text": "q" * text_chars}], "messages_total": 1,
            "reply": {"role": "ai", "text": "a"}, "tools": ["GraderResponse"],
            "content_kept": True, **fields}


def test_calls_round_trip_once_each_within_the_run_bounds(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run = store.create_run(RunSettings(prompt="p", rubric="- c1", title="t"), owner="me")
    first = [_call("a"), _call("b", role="worker", iteration=1, grading_run_id=None)]
    assert store.add_calls(run.run_id, first, owner="me") == 2
    assert store.calls(run.run_id) == first
    assert store.add_calls(run.run_id, first, owner="me") == 0  # a resumed pass repeats them
    # Past the run's text budget a call keeps its numbers, not its text.
    monkeypatch.setattr("rubric_core.store._calls.CALL_CONTENT_BUDGET_CHARS", 5_000)
    assert store.add_calls(run.run_id, [_call("c", text_chars=4_000),
                                        _call("d", text_chars=4_000)], owner="me") == 2
    c, d = store.calls(run.run_id)[2:]
    assert c["content_kept"] and len(c["messages"][0]["text"]) == 4_000
    assert not d["content_kept"] and d["messages"] == [] and d["reply"] is None
    assert (d["input_tokens"], d["cached_input_tokens"], d["model"]) == (1200, 1024, "gpt-x-2026")
    # And past the most calls a run keeps, calls are not stored at all.
    monkeypatch.setattr("rubric_core.store._calls.MAX_CALLS_PER_RUN", 5)
    assert store.add_calls(run.run_id, [_call("e"), _call("f"), _call("g")], owner="me") == 1
    assert [c["call_id"] for c in store.calls(run.run_id)] == ["a", "b", "c", "d", "e"]
    assert store.calls_for_runs([run.run_id, "nope"])["nope"] == []
    assert store.delete_run(run.run_id) and store.calls(run.run_id) == []


def test_a_former_owner_cannot_write_calls_after_a_takeover(store: Store) -> None:
    run = store.create_run(RunSettings(prompt="p", rubric="- c1", title="t"), owner="paused")
    assert store.claim_run(run.run_id, owner="resumer",
                           stale_before="9999-01-01T00:00:00.000000+00:00")
    with pytest.raises(RunTakenOver):
        store.add_calls(run.run_id, [_call("late")], owner="paused")
    assert store.calls(run.run_id) == []
    assert store.add_calls(run.run_id, [_call("mine")], owner="resumer") == 1
    with pytest.raises(KeyError):
        store.add_calls("no-such-run", [_call("x")])


def test_a_recorded_run_keeps_its_calls_and_cached_tokens(
        store: Store, scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "Zq81hd7Gq0Lm2-configured-secret"
    monkeypatch.setenv("MY_SERVICE_API_KEY", secret)
    s = scripted([text(f"draft one {secret}"), text("draft two")], [FAIL, PASS])
    settings = RunSettings(prompt=PROMPT, rubric=RUBRIC, worker_model="openai-compatible:w",
                           grader_model="openai-compatible:g", base_url=s.server.base_url)
    run = session.start(store, settings, models=model_resolver(api_key="test-key"))
    for _ in run:
        pass
    record = store.get_run(run.run_id)
    assert record is not None and record.status == "satisfied"
    calls = store.calls(run.run_id)
    assert [(c["role"], c["iteration"]) for c in calls] == [
        ("worker", 0), ("grader", 0), ("worker", 1), ("grader", 1)]
    assert [c["cached_input_tokens"] for c in calls] == s.server.cached
    evaluations = store.evaluations(run.run_id)
    assert [ev["cached_input_tokens"] for ev in evaluations] == [
        calls[1]["cached_input_tokens"], calls[3]["cached_input_tokens"]]
    assert record.cached_input_tokens == calls[3]["cached_input_tokens"] > 0
    assert record.input_tokens == calls[1]["input_tokens"] + calls[3]["input_tokens"]
    assert secret not in json.dumps(calls) and REDACTED in calls[0]["reply"]["text"]


# --------------------------------------------------------------------------- the command line


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k != "RUBRIC_STUDIO_BASE_URL"
           and not k.startswith(("LANGSMITH_", "LANGCHAIN_"))}
    return subprocess.run([sys.executable, "-m", "rubric_core", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_cli_run_records_cached_tokens_per_call_pass_and_run(scripted: Any,
                                                             tmp_path: Path) -> None:
    s = scripted([text("draft one"), text("draft two")], [FAIL, PASS])
    db = tmp_path / "runs.sqlite3"
    proc = _cli("run", "--model", "openai-compatible:worker", "--grader",
                "openai-compatible:grader", "--base-url", s.server.base_url, "--prompt", PROMPT,
                "--rubric", RUBRIC, "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    with Store(db) as store:
        [record] = store.list_runs()
        calls = store.calls(record.run_id)
        evaluations = store.evaluations(record.run_id)
    assert [c["cached_input_tokens"] for c in calls] == s.server.cached
    cached = calls[3]["cached_input_tokens"]
    assert cached > 0 and [e["cached_input_tokens"] for e in evaluations] == [0, cached]
    assert record.cached_input_tokens == cached
    # Visible as each pass is printed.
    assert f"grader tokens: {calls[3]['input_tokens']} in ({cached} cached)" in proc.stdout
    assert f"grader tokens: {calls[1]['input_tokens']} in (0 cached)" in proc.stdout


def test_cli_eval_sums_cached_tokens_per_configuration(scripted: Any, tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("id,prompt\n" + "".join(
        f"r{i},{PROMPT} Row {i}.\n" for i in range(2)), encoding="utf-8")
    s = scripted([text("answer")] * 2, [PASS] * 2)
    db, summary = tmp_path / "runs.sqlite3", tmp_path / "summary.csv"
    proc = _cli("eval", "--dataset", str(rows), "--rubric", RUBRIC, "--db", str(db),
                "--config", f"worker=openai-compatible:w,grader=openai-compatible:g,"
                f"base_url={s.server.base_url}", "--concurrency", "1",
                "--summary-csv", str(summary))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(db) as store:
        runs = store.list_runs()
        total = sum(r.cached_input_tokens or 0 for r in runs)
        assert sum(c["cached_input_tokens"] for r in runs for c in store.calls(r.run_id)) == sum(
            s.server.cached)
    assert total > 0  # the second row's grader call repeats the first's long start
    [row] = list(csv.DictReader(summary.open(encoding="utf-8")))
    # cached_input_tokens stays where it was published; the costs were appended after it.
    assert list(row)[-3:] == ["cached_input_tokens", "cost_usd", "cost_per_100_rows_usd"]
    assert int(row["cached_input_tokens"]) == total
    assert "cached_input_tokens" in proc.stdout


def test_a_recorded_run_whose_worker_raises_keeps_the_failed_call(store: Store,
                                                                  scripted: Any) -> None:
    s = scripted([text("draft"), error(400, "context too long")], [FAIL])
    settings = RunSettings(prompt=PROMPT, rubric=RUBRIC, worker_model="openai-compatible:w",
                           grader_model="openai-compatible:g", base_url=s.server.base_url)
    run = session.start(store, settings, models=model_resolver(api_key="test-key"))
    for _ in run:
        pass
    record = store.get_run(run.run_id)
    assert record is not None and record.status == "error"  # as before
    calls = store.calls(run.run_id)
    assert [(c["role"], c["iteration"], c["status"]) for c in calls] == [
        ("worker", 0, "ok"), ("grader", 0, "ok"), ("worker", 1, "error")]
    assert "context too long" in (calls[-1]["error"] or "")
