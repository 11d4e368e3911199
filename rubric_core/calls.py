"""Call traces: every model call of a run, worker and grader, as a bounded, scrubbed record.

What LangSmith shows for an LLM run, kept with the run in our own database: the messages as
sent, the reply and its tool calls, the four token counts a price table needs (input, cached
input, cache creation, output: `rubric_core.usage.usage_counts`), latency (and time to the
first streamed token), the grader's retry attempt and the HTTP 429/5xx retries inside the call.

How calls are caught: `CALL_TRACER`, one LangChain callback handler for the process, is put on
the chat models a run uses (`attach`: the models' own ``callbacks``, so LangGraph's per-node
callbacks stay off, which a handler in the run's config would turn on at about a fifth of the
loop's overhead). LangGraph puts the run's ``thread_id`` in every call's metadata, through the
grading pass's runnable and under ``asyncio.gather`` alike, so the handler files each call in
the `CallLog` opened for that thread (`open_log`); a call on a thread nobody traces costs one
dict lookup. A grader call carries its pass in its metadata (`PASS_ITERATION_KEY`, set by the
middleware) and, when it retries, its attempt (`GRADER_ATTEMPT_KEY`); a worker call belongs to
the pass after the last grader call seen. The handler runs inline (``run_inline``), in the
call's own context: no executor hop under asyncio, and the HTTP retry count
(`rubric_core.http_retry.CALL_HTTP_RETRIES`) it sets is the one the call's HTTP client adds to.

Bounds (limits in `rubric_core.types`): each message's text is cut to
`CALL_MESSAGE_CHAR_LIMIT` and a reply's to `CALL_REPLY_CHAR_LIMIT` (head and tail around a
visible marker, as the grader's own transcript is), a call keeps its first
`CALL_HEAD_MESSAGES` messages and its last ones up to `CALL_MESSAGES_KEPT`, with a marker
message for those left out, and tool calls and their arguments are cut too. The store bounds
a run's traces as a whole (`MAX_CALLS_PER_RUN`, `CALL_CONTENT_BUDGET_CHARS`). Every string is
scrubbed of secrets (`rubric_core.redact`) as the record is built; the text is scrubbed around
each cut with a margin, so a key that straddles a cut is never kept in part.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage

from rubric_core.grader import message_text
from rubric_core.http_retry import CALL_HTTP_RETRIES, RetryCount
from rubric_core.redact import error_text, redact, secret_values
from rubric_core.types import (
    CALL_HEAD_MESSAGES,
    CALL_MESSAGE_CHAR_LIMIT,
    CALL_MESSAGES_KEPT,
    CALL_REPLY_CHAR_LIMIT,
    CALL_TOOL_ARGS_CHAR_LIMIT,
    CALL_TOOL_CALLS_KEPT,
    GRADER_ATTEMPT_KEY,
    PASS_GRADING_RUN_KEY,
    PASS_ITERATION_KEY,
    REVISION_SOURCE,
    CallMessage,
    CallRole,
    CallToolCall,
    ModelCallRecord,
)
from rubric_core.usage import usage_counts

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from uuid import UUID

    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import LLMResult

_SCRUB_MARGIN = 512
"""Characters past each cut that are scrubbed with the kept text, then dropped: a secret of up
to this length that straddles a cut is whole when scrubbed, and none of it is kept."""

_TOOLS_KEPT = 64
"""Tool names kept per call."""

_CACHED_MESSAGES = 256
"""Kept messages a run's `MessageCache` holds before it starts afresh."""


def bounded_text(text: str, limit: int, secrets: Sequence[str] | None = None) -> str:
    """``text`` scrubbed of secrets and cut to about ``limit`` characters around a marker.

    Like `rubric_core.grader.shorten` (three quarters head, one quarter tail), but only the kept
    pieces are scrubbed (a 5 MB reply costs two slices), each with `_SCRUB_MARGIN` characters
    past its cut that are dropped afterwards.

    Args:
        text: Any text.
        limit: The most characters to keep (the marker comes on top).
        secrets: `rubric_core.redact.secret_values()`, when the caller has read them.

    """
    known = secret_values() if secrets is None else secrets
    if len(text) <= limit:
        return redact(text, secrets=known)
    keep = max(limit - 80, 2)
    head_n, tail_n = keep * 3 // 4, keep // 4
    head = redact(text[: head_n + _SCRUB_MARGIN], secrets=known)
    head = head[: max(0, min(head_n, len(head) - _SCRUB_MARGIN))]
    tail = redact(text[-(tail_n + _SCRUB_MARGIN):], secrets=known)
    tail = tail[max(_SCRUB_MARGIN, len(tail) - tail_n):]
    omitted = len(text) - head_n - tail_n
    return f"{head}\n[… {omitted:,} characters omitted by Rubric Studio …]\n{tail}"


def _tool_calls(calls: Sequence[Mapping[str, Any]], secrets: Sequence[str]
                ) -> list[CallToolCall]:
    kept: list[CallToolCall] = []
    for call in calls[:CALL_TOOL_CALLS_KEPT]:
        args = call.get("args")
        raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False,
                                                            default=str)
        item: CallToolCall = {"name": redact(str(call.get("name") or ""), secrets=secrets),
                              "args": bounded_text(raw, CALL_TOOL_ARGS_CHAR_LIMIT, secrets)}
        if call.get("id"):
            item["id"] = redact(str(call["id"]), secrets=secrets)
        kept.append(item)
    if len(calls) > CALL_TOOL_CALLS_KEPT:
        kept.append({"name": "[…]", "args": f"{len(calls) - CALL_TOOL_CALLS_KEPT} more tool "
                                            "call(s) left out by Rubric Studio"})
    return kept


def call_message(message: BaseMessage, limit: int, secrets: Sequence[str] | None = None
                 ) -> CallMessage:
    """One message as a call trace keeps it: its text bounded, everything scrubbed."""
    known = secret_values() if secrets is None else secrets
    kept: CallMessage = {"role": message.type,
                         "text": bounded_text(message_text(message), limit, known)}
    if message.name:
        kept["name"] = redact(message.name, secrets=known)
    if isinstance(message, AIMessage):
        calls: list[Mapping[str, Any]] = [*message.tool_calls, *message.invalid_tool_calls]
        if calls:
            kept["tool_calls"] = _tool_calls(calls, known)
    if isinstance(message, ToolMessage) and message.tool_call_id:
        kept["tool_call_id"] = redact(str(message.tool_call_id), secrets=known)
    return kept


class MessageCache:
    """Messages already kept by a run's earlier calls, so each is cut and scrubbed once.

    A run's calls send the same messages again and again (the worker's conversation grows by
    a turn a pass; every grader call starts with the same instructions), and scrubbing is
    most of what a trace costs. Keyed by the message's kind, name and text (a text's hash is
    computed once per string object); a message carrying tool calls is not cached. Emptied
    when the configured secrets change, and when it holds `_CACHED_MESSAGES` entries.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str | None, str, str | None], CallMessage] = {}
        self._secrets: Sequence[str] = ()

    def kept(self, message: BaseMessage, secrets: Sequence[str]) -> CallMessage:
        """``call_message(message)`` (the trace's form of a sent message), once per text."""
        if isinstance(message, AIMessage) and (message.tool_calls
                                               or message.invalid_tool_calls):
            return call_message(message, CALL_MESSAGE_CHAR_LIMIT, secrets)
        if secrets != self._secrets or len(self._kept) >= _CACHED_MESSAGES:
            self._kept, self._secrets = {}, list(secrets)
        content = message.content
        text = content if isinstance(content, str) else message_text(message)
        key = (message.type, message.name, text, getattr(message, "tool_call_id", None))
        shaped = self._kept.get(key)
        if shaped is None:
            shaped = self._kept[key] = call_message(message, CALL_MESSAGE_CHAR_LIMIT, secrets)
        return shaped


def sent_messages(messages: Sequence[BaseMessage], secrets: Sequence[str] | None = None,
                  cache: MessageCache | None = None) -> list[CallMessage]:
    """The messages of a call as its trace keeps them: the start, the end, a marker between."""
    known = secret_values() if secrets is None else secrets
    cache = cache or MessageCache()
    if len(messages) <= CALL_MESSAGES_KEPT:
        return [cache.kept(m, known) for m in messages]
    tail_n = CALL_MESSAGES_KEPT - CALL_HEAD_MESSAGES
    left_out = len(messages) - CALL_MESSAGES_KEPT
    marker: CallMessage = {"role": "marker",
                           "text": f"[… {left_out:,} messages omitted by Rubric Studio …]"}
    return [*(cache.kept(m, known) for m in messages[:CALL_HEAD_MESSAGES]),
            marker,
            *(cache.kept(m, known) for m in messages[-tail_n:])]


class CallLog:
    """The call records of one run as they end; `drain` hands over those not yet taken.

    Thread-safe: a run's calls may end on the graph's worker threads.

    Args:
        iteration: The pass the worker's next answer is for.
        listener: Told of each record as its call ends (on the call's thread), before any
            event that drains it: a watched run's live cost (`rubric_core.stopping.RunPump`).

    """

    def __init__(self, iteration: int = 0,
                 listener: Callable[[ModelCallRecord], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._records: list[ModelCallRecord] = []
        self._listener = listener
        self.worker_iteration = iteration
        """The pass the worker's next answer is for (the pass after the last grader call)."""
        self.grading_run_id: str | None = None
        """The grading run of the last grader call seen."""
        self.messages = MessageCache()
        """The run's messages as kept so far (each message is cut and scrubbed once)."""

    def add(self, record: ModelCallRecord) -> None:
        """Keep one finished call."""
        with self._lock:
            self._records.append(record)
        if self._listener is not None:
            self._listener(record)

    def drain(self) -> list[ModelCallRecord]:
        """The calls that ended since the last drain, in the order they ended."""
        with self._lock:
            records, self._records = self._records, []
        return records


_logs: dict[str, CallLog] = {}
_logs_lock = threading.Lock()


def open_log(thread_id: str, *, iteration: int = 0,
             listener: Callable[[ModelCallRecord], None] | None = None) -> CallLog:
    """Start tracing the model calls made on ``thread_id`` (a run's LangGraph thread).

    Args:
        thread_id: The thread; its calls go to the new log until `close_log`.
        iteration: The pass the worker's next answer is for (a resumed run's).
        listener: Told of each call's record as the call ends (see `CallLog`).

    """
    log = CallLog(iteration, listener)
    with _logs_lock:
        _logs[thread_id] = log
    return log


def close_log(thread_id: str, log: CallLog) -> None:
    """Stop tracing ``thread_id`` (if ``log`` is still the one that traces it).

    Calls of the log still open (a call whose end was never reported) are forgotten.
    """
    with _logs_lock:
        if _logs.get(thread_id) is log:
            del _logs[thread_id]
    CALL_TRACER.forget(log)


class _Open:
    """A call under way."""

    __slots__ = ("attempt", "first_token_s", "grading_run_id", "iteration", "log", "messages",
                 "messages_total", "model", "provider", "retries", "role", "started",
                 "started_at", "tools")

    def __init__(self, log: CallLog, role: CallRole, iteration: int, grading_run_id: str | None,
                 attempt: int, provider: str | None, model: str, messages: list[CallMessage],
                 messages_total: int, tools: list[str], retries: RetryCount) -> None:
        self.log, self.role, self.iteration = log, role, iteration
        self.grading_run_id, self.attempt = grading_run_id, attempt
        self.provider, self.model = provider, model
        self.messages, self.messages_total, self.tools = messages, messages_total, tools
        self.retries = retries
        self.first_token_s: float | None = None
        self.started_at = datetime.now(UTC).isoformat(timespec="microseconds")
        self.started = time.perf_counter()


def _requested_model(serialized: Mapping[str, Any] | None, metadata: Mapping[str, Any],
                     params: Mapping[str, Any]) -> str:
    name = (metadata.get("ls_model_name") or params.get("model") or params.get("model_name")
            or params.get("_type"))
    if not name and serialized:
        name = (serialized.get("id") or ["model"])[-1]
    return str(name or "model")


def _tool_names(params: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in (params.get("tools") or [])[:_TOOLS_KEPT]:
        if isinstance(tool, Mapping):
            fn = tool.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else tool.get("name")
            names.append(str(name or "?"))
    return names


class CallTracer(BaseCallbackHandler):
    """The callback handler that turns model calls into `ModelCallRecord`s (`CALL_TRACER`).

    Only chat model events reach it (chains, tools and retrievers are ignored), it never raises
    into the call (``raise_error`` is False), and it runs inline under asyncio.
    """

    run_inline = True
    raise_error = False
    ignore_chain = True
    ignore_agent = True
    ignore_retriever = True
    ignore_custom_event = True
    ignore_retry = True

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[UUID, _Open] = {}

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]],
                            *, run_id: UUID, tags: list[str] | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Open a record for a call on a traced thread."""
        meta = metadata or {}
        log = _logs.get(str(meta.get("thread_id")))
        if log is None:
            return
        sent = messages[0] if messages else []
        params = kwargs.get("invocation_params") or {}
        if PASS_ITERATION_KEY in meta or REVISION_SOURCE in (tags or ()):
            role: CallRole = "grader"
            iteration = int(meta.get(PASS_ITERATION_KEY) or 0)
            grading_run_id = str(meta.get(PASS_GRADING_RUN_KEY) or "") or None
            log.worker_iteration = max(log.worker_iteration, iteration + 1)
            log.grading_run_id = grading_run_id
        else:
            role, iteration, grading_run_id = "worker", log.worker_iteration, log.grading_run_id
        retries = RetryCount()
        CALL_HTTP_RETRIES.set(retries)  # this call's context: its HTTP client counts here
        self._open[run_id] = _Open(
            log, role, iteration, grading_run_id, int(meta.get(GRADER_ATTEMPT_KEY) or 0),
            meta.get("ls_provider"), _requested_model(serialized, meta, params),
            sent_messages(sent, cache=log.messages), len(sent), _tool_names(params), retries)

    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> None:  # noqa: ARG002
        """Note when the first streamed token came."""
        call = self._open.get(run_id)
        if call is not None and call.first_token_s is None:
            call.first_token_s = round(time.perf_counter() - call.started, 6)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:  # noqa: ARG002
        """Close the call's record with its reply and usage."""
        call = self._open.pop(run_id, None)
        if call is None:
            return
        generations = response.generations[0] if response.generations else []
        message = getattr(generations[0], "message", None) if generations else None
        usage = getattr(message, "usage_metadata", None)
        reported = None
        if message is not None:
            meta = message.response_metadata or {}
            reported = meta.get("model_name") or meta.get("model")
        reported = reported or (response.llm_output or {}).get("model_name")
        reply = None
        if isinstance(message, AIMessage):
            known = secret_values()
            # A reply that needs no cut is kept as the run's next call will send it: once.
            short = len(message_text(message)) <= CALL_MESSAGE_CHAR_LIMIT
            reply = (call.log.messages.kept(message, known) if short
                     else call_message(message, CALL_REPLY_CHAR_LIMIT, known))
        call.log.add(self._record(run_id, call, str(reported or call.model), usage, reply, None))

    def on_llm_error(self, error: BaseException, *, run_id: UUID,
                     **kwargs: Any) -> None:  # noqa: ARG002
        """Close the call's record as an error."""
        call = self._open.pop(run_id, None)
        if call is not None:
            call.log.add(self._record(run_id, call, call.model, None, None, error_text(error)))

    def forget(self, log: CallLog) -> None:
        """Drop the open calls of a log that was closed."""
        for run_id, call in list(self._open.items()):
            if call.log is log:
                self._open.pop(run_id, None)

    @staticmethod
    def _record(run_id: UUID, call: _Open, model: str, usage: Any, reply: CallMessage | None,
                error: str | None) -> ModelCallRecord:
        counts = usage_counts(usage)
        return {
            "call_id": str(run_id), "role": call.role, "iteration": call.iteration,
            "grading_run_id": call.grading_run_id, "attempt": call.attempt,
            "provider": call.provider, "model": redact(model),
            "status": "error" if error is not None else "ok", "error": error,
            "started_at": call.started_at,
            "latency_s": round(time.perf_counter() - call.started, 6),
            "first_token_s": call.first_token_s,
            "input_tokens": counts.input_tokens,
            "cached_input_tokens": counts.cached_input_tokens,
            "cache_creation_tokens": counts.cache_creation_tokens,
            "output_tokens": counts.output_tokens, "http_retries": call.retries.count,
            "messages": call.messages, "messages_total": call.messages_total, "reply": reply,
            "tools": call.tools, "content_kept": True,
        }


CALL_TRACER = CallTracer()
"""The process's one call-trace handler; `attach` puts it on a run's chat models."""


def attach(model: object) -> None:
    """Put `CALL_TRACER` on a chat model's own callbacks (once; other objects are left alone).

    The handler records nothing for calls on threads nobody traces (`open_log`), so a model
    shared by traced runs and other uses is unaffected elsewhere.
    """
    if not isinstance(model, BaseChatModel):
        return
    callbacks = model.callbacks
    if callbacks is None:
        model.callbacks = [CALL_TRACER]
    elif isinstance(callbacks, list) and CALL_TRACER not in callbacks:
        model.callbacks = [*callbacks, CALL_TRACER]


__all__ = [
    "CALL_TRACER",
    "CallLog",
    "CallTracer",
    "MessageCache",
    "attach",
    "bounded_text",
    "call_message",
    "close_log",
    "open_log",
    "sent_messages",
]
