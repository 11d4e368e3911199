r"""Position bias of a pairwise judge: its flip rate over a bundled set of pairs.

Every pair of ``bench/data/pairwise_pairs.jsonl`` (12 pairs, three tasks, rubrics mixing
criteria the rules can check with ones only an LLM can) is judged per criterion twice, A shown
first and B shown first (`rubric_core.pairwise.judge_pairs`), and the script prints per
criterion the outcomes and the **flip rate** (the share of criterion judgements whose two
orders disagree), then over every criterion: the flip rate, the share of decided order-verdicts
that went to the answer shown first (0.5 for a judge without position bias), the criterion
judgements that failed, and seconds and tokens per call.

    .venv/bin/python bench/pairwise.py                    # the offline rules judge (flip 0)
    .venv/bin/python bench/pairwise.py --grader openai-compatible:smollm2 \
        --base-url http://127.0.0.1:8080/v1 --concurrency 1   # a local llama.cpp server

Nothing is stored; only the grader's own server is called.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "bench" / "data" / "pairwise_pairs.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grader", default="rules",
                        help="grader model string (default: rules)")
    parser.add_argument("--base-url", default=None,
                        help="OpenAI-compatible server of the grader (e.g. llama.cpp's)")
    parser.add_argument("--pairs", default=str(PAIRS),
                        help="a pairs file (CSV/JSONL: id, prompt, a, b, rubric); default: "
                        "the bundled set")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="grader calls at once (default 2; 1 for a one-slot local server)")
    args = parser.parse_args(argv)

    from rubric_core.models import model_resolver
    from rubric_core.pairwise import read_pairs_file, tallies
    from rubric_core.pairwise.judge import judge_pairs

    pairs = read_pairs_file(args.pairs)
    grader = model_resolver(streaming=False)(args.grader, "grader", args.base_url)
    started = time.perf_counter()
    judged = asyncio.run(judge_pairs(grader, pairs, "", concurrency=args.concurrency))
    wall = time.perf_counter() - started

    rows = tallies(j.criteria for j in judged)
    width = max(len(t.criterion) for t in rows)
    print(f"grader {args.grader}: {len(pairs)} pairs, both orders, {wall:.1f} s")
    print(f"{'criterion':<{width}}  {'A':>3} {'B':>3} {'tie':>4} {'incons':>6} {'failed':>6}"
          f"  flip rate")
    for t in rows:
        rate = "-" if t.flip_rate is None else f"{t.flip_rate:.2f}"
        print(f"{t.criterion:<{width}}  {t.a_wins:>3} {t.b_wins:>3} {t.ties:>4} "
              f"{t.inconsistent:>6} {t.failed:>6}  {rate}")
    # Each order's verdict as shown: the pair's "a" with A first, or its "b" with B first, is
    # the answer shown first.
    shown_first = decided = 0
    for j in judged:
        for c in j.criteria:
            for order, winner in (("a", c["winner_a_first"]), ("b", c["winner_b_first"])):
                if winner in ("a", "b"):
                    decided += 1
                    shown_first += winner == order
    calls = [c for j in judged for c in j.calls]
    overall = rows[-1]
    flip = "none judged" if overall.flip_rate is None else f"{overall.flip_rate:.3f}"
    first = "-" if not decided else f"{shown_first / decided:.3f}"
    print(f"\nflip rate: {flip} ({overall.inconsistent} of {overall.judged} criterion "
          "judgements changed with the order)")
    print(f"shown-first share of decided order-verdicts: {first} ({shown_first} of {decided}; "
          "0.5 = no position bias)")
    print(f"failed criterion judgements: {overall.failed} of {overall.judged + overall.failed}")
    latencies = [c["latency_s"] for c in calls]
    tokens_in = [c["input_tokens"] for c in calls if c["input_tokens"] is not None]
    tokens_out = [c["output_tokens"] for c in calls if c["output_tokens"] is not None]
    print(f"calls: {len(calls)} ({sum(c['status'] == 'error' for c in calls)} errors), median "
          f"{statistics.median(latencies) if latencies else 0:.2f} s, tokens in/out per call "
          f"{statistics.mean(tokens_in) if tokens_in else 0:.0f}/"
          f"{statistics.mean(tokens_out) if tokens_out else 0:.0f}")
    errors = [c["error"] for j in judged for c in j.criteria if c["error"]]
    if errors:
        print(f"first failure: {errors[0][:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
