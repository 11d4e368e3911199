"""Loop overhead of `rubric_core.RubricMiddleware` against `deepagents.RubricMiddleware`.

Both middlewares run the same loop on the same zero-latency scripted models: the worker returns
a ~2,000-character draft on every call, and the grader answers ``needs_revision`` for N-1 passes
and ``satisfied`` on pass N. What is measured is everything but model time: the wall time of one
``agent.invoke`` minus the seconds spent inside the scripted models' ``_generate``, divided by the
N iterations. That is the middleware's own work plus the agent graph, checkpointing and LangChain
model plumbing it drives (for deepagents, the nested grader agent it builds).

The two are run side by side, in alternating order over several rounds, for N = 3 and N = 10,
and the median per-iteration overhead is reported with the ratio ours/deepagents. The grader
input size (characters of the messages sent to the grader) at iteration 1 and 10 shows whether
the grader's prompt grows with the transcript.

Run from the repository root:

    .venv/bin/python bench/loop_overhead.py            # print the table
    .venv/bin/python bench/loop_overhead.py --check    # also exit 1 if ratio at N=10 > 0.7
    .venv/bin/python bench/loop_overhead.py --calls    # also ours with call traces on

With ``--calls`` a third contender, ``ours+calls``, runs ours with every model call traced as
the runner traces a run's calls (`rubric_core.calls`: the handler on both models, a log open
for the run's thread), so the cost of call traces reads off beside ours.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langsmith.run_helpers import tracing_context
from scripted_model import Script, ScriptedChatModel

if TYPE_CHECKING:
    from collections.abc import Callable

ITERATIONS = (3, 10)
"""Grader passes per run; the last is also where grader input growth is read."""
DEFAULT_ROUNDS = 7
"""Alternating rounds per (middleware, N); the median is reported."""
CHECK_MAX_RATIO = 0.7
"""`--check` fails when ours/deepagents overhead at the largest N is above this."""

CRITERIA = (
    "The plan names an owner for every step",
    "The plan can be rolled back at any step",
    "The plan lists the checks that prove the migration worked",
)
RUBRIC = "\n".join(f"- {criterion}" for criterion in CRITERIA)
PROMPT = "Write a step-by-step plan for moving the billing database to the new cluster."
_SENTENCE = (
    "Step owners freeze writes, copy the billing tables, verify row counts and checksums, "
    "switch the connection string, and keep the old cluster warm for a one-day rollback. "
)
DRAFT = (_SENTENCE * (2_000 // len(_SENTENCE) + 1))[:2_000]
"""The body of every worker reply (about 2,000 characters)."""


def worker_script(call: int) -> AIMessage:
    """A fresh ~2,000-character draft on every call."""
    return AIMessage(content=f"Draft {call + 1}.\n\n{DRAFT}")


def grader_script(passes: int) -> Script:
    """``needs_revision`` (first criterion failing) for ``passes - 1`` calls, then ``satisfied``.

    The reply is a ``GraderResponse`` tool call, the form both middlewares read: ours binds the
    schema as a tool, and deepagents' grader agent picks LangChain's tool strategy for a model
    with no provider structured-output profile.
    """

    def reply(call: int) -> AIMessage:
        satisfied = call >= passes - 1
        criteria: list[dict[str, Any]] = [{"name": c, "passed": True} for c in CRITERIA]
        if not satisfied:
            criteria[0] = {
                "name": CRITERIA[0],
                "passed": False,
                "gap": "Steps 2 and 4 have no named owner; name the person or team for each.",
            }
        args = {
            "result": "satisfied" if satisfied else "needs_revision",
            "explanation": "All criteria met." if satisfied else "One criterion still fails.",
            "criteria": criteria,
        }
        call_id = f"call_grader_{call}"
        return AIMessage(
            content="", tool_calls=[{"name": "GraderResponse", "args": args, "id": call_id}]
        )

    return reply


@dataclass(frozen=True)
class RunResult:
    """One timed ``invoke`` of one middleware for one N."""

    iterations: int
    """Grader passes the run took."""
    wall_s: float
    """Wall time of ``agent.invoke``."""
    model_s: float
    """Seconds inside the scripted worker and grader."""
    grader_chars: tuple[int, ...]
    """Characters of message text sent to the grader, per call."""

    @property
    def overhead_ms(self) -> float:
        """Milliseconds per iteration spent outside the models."""
        return (self.wall_s - self.model_s) / self.iterations * 1_000

    @property
    def model_ms(self) -> float:
        """Milliseconds per iteration spent inside the models."""
        return self.model_s / self.iterations * 1_000


def run_once(name: str, middleware_class: Callable[..., Any], passes: int) -> RunResult:
    """Build a fresh agent, time one rubric loop of ``passes`` iterations, and check it ran."""
    worker = ScriptedChatModel(script=worker_script)
    grader = ScriptedChatModel(script=grader_script(passes))
    thread_id = f"bench-{name}-{uuid.uuid4().hex}"
    traced = name == "ours+calls"
    if traced:
        from rubric_core.calls import attach, close_log, open_log

        attach(worker)
        attach(grader)
        log = open_log(thread_id)
    middleware = middleware_class(model=grader, max_iterations=passes)
    agent = create_agent(model=worker, middleware=[middleware], checkpointer=InMemorySaver())
    config: Any = {
        "configurable": {"thread_id": thread_id},
        "recursion_limit": 20 * passes + 20,
    }
    payload: Any = {"messages": [HumanMessage(PROMPT)], "rubric": RUBRIC}
    gc.collect()
    started = time.perf_counter()
    agent.invoke(payload, config)
    if traced:
        calls = log.drain()  # the runner hands a pass's calls over as the pass ends
    wall = time.perf_counter() - started
    if traced:
        close_log(thread_id, log)
        if len(calls) != 2 * passes:
            msg = f"{name}: expected {2 * passes} traced calls, got {len(calls)}"
            raise RuntimeError(msg)

    status = agent.get_state(config).values.get("_rubric_status")
    if (worker.calls, grader.calls, status) != (passes, passes, "satisfied"):
        msg = (
            f"{name}: expected {passes} worker and grader calls ending 'satisfied', got "
            f"worker={worker.calls} grader={grader.calls} status={status!r}"
        )
        raise RuntimeError(msg)
    return RunResult(
        passes, wall, worker.model_seconds + grader.model_seconds, tuple(grader.input_chars)
    )


def load_ours() -> Callable[..., Any] | str:
    """`rubric_core.RubricMiddleware`, or why it could not be imported."""
    try:
        return importlib.import_module("rubric_core").RubricMiddleware
    except (ImportError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def load_deepagents() -> Callable[..., Any]:
    """`deepagents.RubricMiddleware` (a dev/bench requirement only)."""
    from deepagents import RubricMiddleware

    return RubricMiddleware


def measure(
    contenders: dict[str, Callable[..., Any]], rounds: int
) -> dict[tuple[str, int], list[RunResult]]:
    """Alternate the contenders' order every round, after one untimed warm-up run each."""
    for name, cls in contenders.items():
        for passes in ITERATIONS:
            run_once(name, cls, passes)
    results: dict[tuple[str, int], list[RunResult]] = {
        (name, n): [] for name in contenders for n in ITERATIONS
    }
    names = list(contenders)
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for passes in ITERATIONS:
            for name in order:
                results[name, passes].append(run_once(name, contenders[name], passes))
    return results


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(results: dict[tuple[str, int], list[RunResult]], names: list[str]) -> float | None:
    """Print the tables; return ours/deepagents at the largest N, or None without both."""
    rounds = len(next(iter(results.values())))
    print("Loop overhead per iteration = (wall time of invoke - time inside scripted models) / N")
    print(f"{rounds} rounds, alternating order; median (min-max) in milliseconds\n")
    print(
        f"{'N':>3}  {'middleware':<11} {'overhead ms/iter':>24} {'model ms/iter':>14} "
        f"{'wall ms/run':>12}"
    )
    for passes in ITERATIONS:
        for name in names:
            runs = results[name, passes]
            over = [r.overhead_ms for r in runs]
            spread = f"{_median(over):.2f} ({min(over):.2f}-{max(over):.2f})"
            model = _median([r.model_ms for r in runs])
            wall = _median([r.wall_s * 1_000 for r in runs])
            print(f"{passes:>3}  {name:<11} {spread:>24} {model:>14.3f} {wall:>12.1f}")

    ratio_at_max: float | None = None
    if {"ours", "deepagents"} <= set(names):
        print()
        for passes in ITERATIONS:
            ours = _median([r.overhead_ms for r in results["ours", passes]])
            theirs = _median([r.overhead_ms for r in results["deepagents", passes]])
            ratio = ours / theirs
            print(f"ratio ours/deepagents at N={passes}: {ratio:.2f}")
            ratio_at_max = ratio

    last = max(ITERATIONS)
    print(f"\nGrader input size (characters of the messages sent to the grader), N={last} run")
    print(f"{'middleware':<11} {'iteration 1':>12} {f'iteration {last}':>13} {'growth':>8}")
    for name in names:
        chars = results[name, last][0].grader_chars
        first, final = chars[0], chars[last - 1]
        print(f"{name:<11} {first:>12,} {final:>13,} {final / first:>7.2f}x")
    return ratio_at_max


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; with ``--check``, fail when ours is not fast enough."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 if ours/deepagents at N={max(ITERATIONS)} is above {CHECK_MAX_RATIO}",
    )
    parser.add_argument("--calls", action="store_true",
                        help="also run ours with call traces on (ours+calls)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    # deepagents marks its middleware beta; the warning says nothing about speed.
    warnings.filterwarnings("ignore", message=".*beta.*")
    contenders: dict[str, Callable[..., Any]] = {}
    ours = load_ours()
    if isinstance(ours, str):
        print(f"rubric_core.RubricMiddleware is not available ({ours}); measuring deepagents only.")
    else:
        contenders["ours"] = ours
        if args.calls:
            contenders["ours+calls"] = ours
    contenders["deepagents"] = load_deepagents()

    # No traces leave the machine, and tracing costs are the same (none) for both.
    with tracing_context(enabled=False):
        results = measure(contenders, args.rounds)
    ratio = report(results, list(contenders))

    if not args.check:
        return 0
    if ratio is None:
        print("--check: cannot compare without rubric_core.RubricMiddleware", file=sys.stderr)
        return 2
    if ratio > CHECK_MAX_RATIO:
        print(f"--check: ratio {ratio:.2f} is above {CHECK_MAX_RATIO}", file=sys.stderr)
        return 1
    print(f"--check: ratio {ratio:.2f} <= {CHECK_MAX_RATIO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
