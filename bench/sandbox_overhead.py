"""What the kernel sandbox costs: one graded-code run under bubblewrap vs the plain child process.

Both modes run the bundled find_duplicates example's test cases against a correct solution and
against the set-based first draft (which fails one case), through the same `run_tests`, side by
side in alternating order over several rounds; the median wall time per run is reported for each
mode with the ratio bwrap / unsafe-process. Every run's result is checked (the right cases pass
and fail, in the mode asked for), so a broken sandbox fails loudly instead of looking fast.

Run from the repository root:

    .venv/bin/python bench/sandbox_overhead.py             # print the table
    .venv/bin/python bench/sandbox_overhead.py --check     # also exit 1 if a ratio is > 1.5
    .venv/bin/python bench/sandbox_overhead.py --rounds 5  # quicker, noisier
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

from rubric_core.examples import FIND_DUPLICATES_TESTS
from rubric_core.tools import isolation
from rubric_core.tools.python_tests import run_tests

CORRECT = """
def find_duplicates(lst):
    seen, dupes = [], []
    for item in lst:
        if item in seen and item not in dupes:
            dupes.append(item)
        seen.append(item)
    return dupes
"""
SET_DRAFT = """
def find_duplicates(lst):
    seen, dupes = set(), []
    for item in lst:
        if item in seen and item not in dupes:
            dupes.append(item)
        seen.add(item)
    return dupes
"""
CASES = {"correct": (CORRECT, 0), "set_draft": (SET_DRAFT, 1)}
MODES = (isolation.BWRAP, isolation.UNSAFE_PROCESS)
TARGET = 1.5


def _one(mode: str, code: str, failures: int) -> float:
    os.environ[isolation.SANDBOX_ENV] = mode
    started = time.perf_counter()
    result = run_tests(code, [dict(c) for c in FIND_DUPLICATES_TESTS], function="find_duplicates")
    elapsed = time.perf_counter() - started
    if result["sandbox"] != mode or len(result["failures"]) != failures or result["error"]:
        msg = f"unexpected result in mode {mode}: {result}"
        raise SystemExit(msg)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if a ratio > {TARGET}")
    args = parser.parse_args()
    # unsafe-process warns once in the log; this benchmark chooses that mode on purpose.
    logging.getLogger("rubric_core.tools.sandbox").setLevel(logging.ERROR)
    for mode in MODES:  # warm up: the first bwrap call also probes the kernel once
        os.environ[isolation.SANDBOX_ENV] = mode
        if not isolation.sandbox_status().ready:
            print(isolation.sandbox_status().detail)
            return 2
        _one(mode, CORRECT, 0)
    times: dict[tuple[str, str], list[float]] = {}
    for round_no in range(args.rounds):
        order = MODES if round_no % 2 == 0 else MODES[::-1]
        for case, (code, failures) in CASES.items():
            for mode in order:
                times.setdefault((case, mode), []).append(_one(mode, code, failures))
    print(f"find_duplicates example, {args.rounds} rounds, median wall time per run_tests call")
    print(f"{'case':<12}{'bwrap ms':>10}{'unsafe ms':>11}{'ratio':>8}")
    worst = 0.0
    for case in CASES:
        bwrap = statistics.median(times[(case, isolation.BWRAP)]) * 1000
        plain = statistics.median(times[(case, isolation.UNSAFE_PROCESS)]) * 1000
        ratio = bwrap / plain
        worst = max(worst, ratio)
        print(f"{case:<12}{bwrap:>10.1f}{plain:>11.1f}{ratio:>7.2f}x")
    print(f"root: {os.geteuid() == 0} (as root the sandbox adds an outer stage that drops to "
          f"uid {isolation.SANDBOX_UID})")
    if args.check and worst > TARGET:
        print(f"FAIL: ratio {worst:.2f}x is over the {TARGET}x target")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
