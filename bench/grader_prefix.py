"""How much of each grader call a provider's prompt cache could serve: ours against deepagents'.

Providers cache a prompt's start, and only a byte-identical one: OpenAI caches prefixes of
1,024+ tokens automatically, Anthropic bills cache reads at about 10% of the input price, Gemini
caches implicitly. So what a grader call costs depends on how much of it repeats the start of
the call before it. This script runs the same scripted K-pass loop (an 8-criterion rubric, a
~4 KB request, a fresh ~2 KB draft every pass, the grader failing one criterion until the last
pass) under `rubric_core.RubricMiddleware` and `deepagents.RubricMiddleware` on zero-latency
recording models, and reads what each grader call was sent, as the provider would see it: each
message's role, text and tool calls in order (the bound tool schemas, the same on every call
for both, are left out: counting them would only raise both shares).

Printed, per middleware:

- the repeated share: the characters of call k that repeat the start of call k-1 (their common
  prefix), over the characters of call k, averaged over calls 2..K;
- the effective input: every character of every call, those repeating the previous call's
  start at 10% of the price (the first call of a run pays in full), and ours/deepagents, over
  the run and over calls 2..K alone (what each further pass costs);
- across the rows of an experiment with one rubric: the repeated share of each row's first
  grader call against the previous row's first grader call (rows differ in their request);
- the same as a row of an experiment with one rubric: the run's first call, too, repeats the
  start of the row before it (instructions and criteria);
- the floor: the effective input of a layout that sends nothing but the criteria, the request
  and each pass's answer (no instructions, tags or nonce), with the criteria and request
  repeated from the second call on, against deepagents' — no layout that sends those whole can
  go below it;
- the worker's side: the share of each worker call that repeats the previous worker call's
  start, and whether the previous call is kept whole (revision feedback appended, nothing
  above it rewritten).

Run from the repository root:

    .venv/bin/python bench/grader_prefix.py            # print the figures
    .venv/bin/python bench/grader_prefix.py --check    # exit 1 if a target is missed
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import uuid
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langsmith.run_helpers import tracing_context
from pydantic import PrivateAttr
from scripted_model import Script, ScriptedChatModel
from typing_extensions import override

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import ChatResult

PASSES = 5
"""Grader passes of the scripted run (K)."""
ROWS = 4
"""Rows of the scripted experiment (one rubric, a different request each)."""
CACHED_PRICE = 0.10
"""Price of a cached input character relative to an uncached one."""
CHECK_MIN_SHARE = 0.7
"""`--check` fails when ours repeats less than this share of each grader call."""
CHECK_MAX_RATIO = 0.25
"""`--check` fails when ours' effective grader input is above this share of deepagents'."""

CRITERIA = (
    "The plan names an owner for every step",
    "The plan can be rolled back at any step",
    "The plan lists the checks that prove the migration worked",
    "The plan states the expected downtime",
    "The plan says how customers are told about the change",
    "The plan keeps card data out of logs and exports",
    "The plan has a step that freezes schema changes",
    "The plan fits on one page",
)
RUBRIC = "\n".join(f"- {criterion}" for criterion in CRITERIA)

_CONTEXT = (
    "Context pasted from the migration ticket: the billing database holds invoices, payment "
    "attempts, refunds and the ledger; nightly jobs reconcile it with the payment provider; "
    "the finance team closes the month on the third working day; the on-call rota is in the "
    "wiki; the new cluster runs the same major version with faster disks and a standby. "
)


def request(row: int) -> str:
    """The request of one experiment row: about 4,000 characters, different on every row."""
    head = (f"Row {row}: write a step-by-step plan for moving billing database number {row} to "
            "the new cluster.\n\n")
    body = (_CONTEXT * (4_000 // len(_CONTEXT) + 1))[: 4_000 - len(head)]
    return head + body


_SENTENCE = (
    "Step owners freeze writes, copy the billing tables, verify row counts and checksums, "
    "switch the connection string, and keep the old cluster warm for a one-day rollback. "
)
DRAFT = (_SENTENCE * (2_000 // len(_SENTENCE) + 1))[:2_000]


def worker_script(call: int) -> AIMessage:
    """A fresh ~2,000-character draft on every call."""
    return AIMessage(content=f"Draft {call + 1}.\n\n{DRAFT}")


def grader_script(passes: int) -> Script:
    """``needs_revision`` (the first criterion failing) until pass ``passes``, then satisfied."""

    def reply(call: int) -> AIMessage:
        satisfied = call >= passes - 1
        criteria: list[dict[str, Any]] = [{"name": c, "passed": True} for c in CRITERIA]
        if not satisfied:
            criteria[0] = {"name": CRITERIA[0], "passed": False,
                           "gap": "Steps 2 and 4 have no named owner; name one for each."}
        args = {"result": "satisfied" if satisfied else "needs_revision",
                "explanation": "All criteria met." if satisfied else "One criterion fails.",
                "criteria": criteria}
        call_id = f"call_grader_{call}"
        return AIMessage(content="", tool_calls=[
            {"name": "GraderResponse", "args": args, "id": call_id}])

    return reply


def serialize(messages: Sequence[BaseMessage]) -> str:
    """A call's messages as the provider reads them, in order: role, text and tool calls."""
    parts: list[str] = []
    for message in messages:
        part = f"[{message.type}]\n{message.text}"
        if isinstance(message, AIMessage) and message.tool_calls:
            part += "\n" + json.dumps(
                [[c["name"], c["args"], c.get("id")] for c in message.tool_calls], sort_keys=True)
        if isinstance(message, ToolMessage):
            part = f"[tool {message.tool_call_id}]\n{message.text}"
        parts.append(part)
    return "\n".join(parts)


class RecordingChatModel(ScriptedChatModel):
    """`ScriptedChatModel` that also keeps the serialized text of every call it was sent."""

    _texts: list[str] = PrivateAttr(default_factory=list)

    @property
    def texts(self) -> list[str]:
        """What each call was sent (`serialize`), in call order."""
        return self._texts

    @override
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._texts.append(serialize(messages))
        return super()._generate(messages, stop, run_manager, **kwargs)


@dataclass(frozen=True)
class Loop:
    """What one scripted run sent its grader and its worker."""

    grader: list[str]
    """Each grader call's text."""
    worker: list[str]
    """Each worker call's text."""


def run_loop(name: str, middleware_class: Callable[..., Any], prompt: str, passes: int) -> Loop:
    """One rubric loop of ``passes`` iterations; checks that it really took them."""
    worker = RecordingChatModel(script=worker_script)
    grader = RecordingChatModel(script=grader_script(passes))
    middleware = middleware_class(model=grader, max_iterations=passes)
    agent = create_agent(model=worker, middleware=[middleware], checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": f"bench-{name}-{uuid.uuid4().hex}"},
                   "recursion_limit": 20 * passes + 20}
    agent.invoke({"messages": [HumanMessage(prompt)], "rubric": RUBRIC}, config)
    status = agent.get_state(config).values.get("_rubric_status")
    if (worker.calls, grader.calls, status) != (passes, passes, "satisfied"):
        msg = (f"{name}: expected {passes} worker and grader calls ending 'satisfied', got "
               f"worker={worker.calls} grader={grader.calls} status={status!r}")
        raise RuntimeError(msg)
    return Loop(grader.texts, worker.texts)


def repeated(previous: str, current: str) -> int:
    """Characters at the start of ``current`` that repeat the start of ``previous``."""
    n = min(len(previous), len(current))
    return next((i for i in range(n) if previous[i] != current[i]), n)


def repeated_share(texts: Sequence[str]) -> float:
    """Mean over calls 2..K of the share of each call repeating the previous call's start."""
    return statistics.mean(repeated(a, b) / len(b) for a, b in itertools.pairwise(texts))


def effective_input(texts: Sequence[str]) -> float:
    """Characters sent, those repeating the previous call's start at `CACHED_PRICE`."""
    total = float(len(texts[0]))
    for previous, current in itertools.pairwise(texts):
        hit = repeated(previous, current)
        total += len(current) - hit + CACHED_PRICE * hit
    return total


def floor_input(passes: int) -> float:
    """The effective input of the barest layout: criteria, request and answer, nothing else.

    Every call sends the rubric's criteria and the request (repeated, so at `CACHED_PRICE` from
    the second call on) and that pass's answer (new every pass, so in full).
    """
    stable = len(RUBRIC) + len(request(0))
    answers = [len(worker_script(call).text) for call in range(passes)]
    return stable + answers[0] + sum(CACHED_PRICE * stable + a for a in answers[1:])


def kept_whole(texts: Sequence[str]) -> bool:
    """True when every call starts with the whole of the call before it."""
    return all(b.startswith(a) for a, b in itertools.pairwise(texts))


@dataclass(frozen=True)
class Figures:
    """The printed figures of one middleware."""

    share: float
    effective: float
    later: float
    sent: int
    row_share: float
    warm: float
    """The effective input when the run's first call also repeats the start of the previous row's
    first call (a row of an experiment with one rubric, after the row before it)."""
    worker_share: float
    worker_kept: bool


def measure(name: str, middleware_class: Callable[..., Any]) -> Figures:
    """The K-pass run on row 0, and the first grader call of `ROWS` rows with one rubric."""
    loop = run_loop(name, middleware_class, request(0), PASSES)
    firsts = [run_loop(name, middleware_class, request(row), 1).grader[0] for row in range(ROWS)]
    return Figures(
        share=repeated_share(loop.grader), effective=effective_input(loop.grader),
        later=effective_input(loop.grader) - len(loop.grader[0]),
        sent=sum(len(t) for t in loop.grader), row_share=repeated_share(firsts),
        warm=effective_input(loop.grader)
        - (1 - CACHED_PRICE) * repeated(firsts[1], loop.grader[0]),
        worker_share=repeated_share(loop.worker), worker_kept=kept_whole(loop.worker),
    )


def report(figures: dict[str, Figures]) -> float | None:
    """Print the table; return ours/deepagents effective input, or None without both."""
    print(f"One run: K={PASSES} grader passes, {len(CRITERIA)} criteria, a "
          f"{len(request(0)):,}-character request, a ~2,000-character draft a pass.")
    print(f"Repeated = characters repeating the previous call's start; effective input counts "
          f"them at {CACHED_PRICE:.0%}.\n")
    print(f"{'middleware':<11} {'repeated share':>15} {'sent chars':>11} {'effective':>10} "
          f"{'rows: repeated':>15} {'worker repeated':>16} {'worker kept':>12}")
    for name, f in figures.items():
        print(f"{name:<11} {f.share:>15.3f} {f.sent:>11,} {f.effective:>10,.0f} "
              f"{f.row_share:>15.3f} {f.worker_share:>16.3f} {f.worker_kept!s:>12}")
    print(f"\nrepeated share: mean over grader calls 2..{PASSES}; rows: each row's first grader "
          f"call against the previous row's ({ROWS} rows, one rubric)")
    if {"ours", "deepagents"} <= set(figures):
        ratio = figures["ours"].effective / figures["deepagents"].effective
        later = figures["ours"].later / figures["deepagents"].later
        print(f"effective grader input ours/deepagents: {ratio:.2f}x over the run "
              f"({later:.2f}x over calls 2..{PASSES}, the first call left out)")
        warm = figures["ours"].warm / figures["deepagents"].warm
        print(f"as a row of an experiment with one rubric (its first call repeating the previous "
              f"row's start): {warm:.2f}x")
        floor = floor_input(PASSES) / figures["deepagents"].effective
        print(f"floor (criteria, request and answers only, no instructions or tags): "
              f"{floor:.2f}x of deepagents' over the run")
        return ratio
    return None


def main(argv: list[str] | None = None) -> int:
    """Run both middlewares and print the figures; with ``--check``, fail on a missed target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if ours repeats < {CHECK_MIN_SHARE} or its effective "
                             f"input is > {CHECK_MAX_RATIO}x deepagents'")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*beta.*")

    from deepagents import RubricMiddleware as TheirMiddleware

    from rubric_core import RubricMiddleware

    with tracing_context(enabled=False):
        figures = {"ours": measure("ours", RubricMiddleware),
                   "deepagents": measure("deepagents", TheirMiddleware)}
    ratio = report(figures)
    if not args.check:
        return 0
    share = figures["ours"].share
    assert ratio is not None  # both were measured
    if share < CHECK_MIN_SHARE or ratio > CHECK_MAX_RATIO:
        print(f"--check: ours repeats {share:.3f} (target >= {CHECK_MIN_SHARE}), effective "
              f"input {ratio:.2f}x (target <= {CHECK_MAX_RATIO}x)", file=sys.stderr)
        return 1
    print(f"--check: repeated share {share:.3f} >= {CHECK_MIN_SHARE}, effective input "
          f"{ratio:.2f}x <= {CHECK_MAX_RATIO}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
