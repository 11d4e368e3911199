"""Run deepagents' own RubricMiddleware tests against rubric_core and check every outcome.

deepagents' test file is not part of this repository: point this script at a copy of it.

    python scripts/deepagents_parity.py --upstream ~/src/deepagents           # a checkout
    python scripts/deepagents_parity.py --upstream deepagents.git --rev 23b83ad  # a git dir
    python scripts/deepagents_parity.py --upstream path/to/test_rubric_middleware.py
    python scripts/deepagents_parity.py --api-only   # the constructor only, no checkout

The file is copied into a temporary directory with its two import lines pointed at our shim
(``scripts/parity/shim.py``) and run in a child pytest with ``parity.plugin``, which leaves out
the tests of their private internals and runs the tests where we differ on purpose as strict
xfails (``scripts/parity/tables.py`` names each, with its reason). Every outcome is then checked
against those tables and the pinned counts. The constructor is checked too, against the installed
deepagents: every keyword parameter of its ``RubricMiddleware.__init__`` must be one of ours, and
ours may add only those ``tables.API_OURS_ONLY`` names. It exits 0 when all match, 1 when any
does not (each mismatch is printed) and 2 when the upstream file cannot be read or its imports
have changed.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from parity import tables

ROOT = Path(__file__).resolve().parents[1]
"""The tree whose rubric_core the child pytest tests."""
SCRIPTS = Path(__file__).resolve().parent
"""Where the ``parity`` package lives, for the child pytest's imports."""
_IN_PACKAGE = tables.UPSTREAM[1].removeprefix("libs/deepagents/")
"""The test file's path inside ``libs/deepagents`` (for a checkout of that directory alone)."""


class ParityError(Exception):
    """The upstream file cannot be found, read or rewritten: bad input, exit status 2."""


def read_upstream(path: Path, rev: str | None = None) -> tuple[str, str]:
    """The upstream test file's text and where it came from.

    Args:
        path: The test file itself, a deepagents checkout (its root or ``libs/deepagents``),
            or a git directory (bare or not) to read ``rev`` from.
        rev: A commit (or any revision git understands) to read the file at, through git.
            Without it a checkout's working copy is read, or else the git dir's ``HEAD``.

    Raises:
        ParityError: When no test file is found there.

    """
    if path.is_file():
        if rev is not None:
            msg = f"--rev needs a git directory or checkout, and {path} is a file"
            raise ParityError(msg)
        return path.read_text(encoding="utf-8"), str(path)
    if not path.is_dir():
        msg = f"{path} does not exist: give a deepagents checkout, git dir or test file"
        raise ParityError(msg)
    if rev is None:
        for candidate in (path / tables.UPSTREAM[1], path / _IN_PACKAGE):
            if candidate.is_file():
                return candidate.read_text(encoding="utf-8"), str(candidate)
        if not ((path / "HEAD").is_file() or (path / ".git").exists()):
            msg = (f"no {tables.UPSTREAM[1]} under {path}: give a deepagents checkout (its "
                   "root or libs/deepagents), a git dir with --rev, or the test file itself")
            raise ParityError(msg)
    spec = f"{rev or 'HEAD'}:{tables.UPSTREAM[1]}"
    proc = subprocess.run(["git", "-C", str(path), "show", spec], capture_output=True,
                          check=False)
    if proc.returncode != 0:
        msg = f"git cannot show {spec} in {path}: {proc.stderr.decode(errors='replace').strip()}"
        raise ParityError(msg)
    return proc.stdout.decode("utf-8"), f"{path} at {rev or 'HEAD'}"


def git_blob_id(text: str) -> str:
    """The id git gives a file with this text (to tell which upstream version was run)."""
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def rewrite_imports(text: str) -> str:
    """Point the upstream file's two import lines at ``parity.shim``; nothing else changes.

    Raises:
        ParityError: When an import line is missing (upstream changed how it imports).

    """
    lines = text.splitlines(keepends=True)
    for line in tables.IMPORTS:
        if line not in lines:
            msg = (f"the upstream file no longer has the line {line.strip()!r}: update "
                   "tables.IMPORTS and the shim for this version")
            raise ParityError(msg)
    return "".join(tables.IMPORTS.get(line, line) for line in lines)


def run_suite(text: str, *, timeout: float = 240) -> dict[str, Any]:
    """Run the upstream test file, imports rewritten, in a child pytest; return its report.

    Returns:
        ``{"outcomes": {outcome: [test ids]}, "xfail_text": {...}, "returncode": int,
        "output": str}``, as ``parity.plugin`` writes it plus the child's exit status and
        output.

    """
    with tempfile.TemporaryDirectory(prefix="deepagents-parity-") as tmp:
        work = Path(tmp)
        (work / tables.COPY_NAME).write_text(rewrite_imports(text), encoding="utf-8")
        # An ini file of its own, so the child ignores any pytest configuration around it.
        (work / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        report_path = work / "report.json"
        env = {**os.environ, tables.REPORT_ENV: str(report_path)}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), str(SCRIPTS), env.get("PYTHONPATH")) if p)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-p", "parity.plugin", tables.COPY_NAME],
            cwd=work, env=env, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if not report_path.exists():
            msg = f"the child pytest wrote no report:\n{proc.stdout[-3000:]}{proc.stderr}"
            raise ParityError(msg)
        report: dict[str, Any] = json.loads(report_path.read_text(encoding="utf-8"))
    report["returncode"], report["output"] = proc.returncode, proc.stdout
    return report


def _name(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def counts(report: dict[str, Any]) -> dict[str, int]:
    """How many upstream tests had each outcome."""
    return {outcome: len(ids) for outcome, ids in report["outcomes"].items()}


def problems(report: dict[str, Any]) -> list[str]:
    """Every way the report differs from the tables and the pinned counts (none: parity holds)."""
    found: list[str] = []
    outcomes: dict[str, list[str]] = report["outcomes"]
    if report.get("returncode", 0) != 0:
        found.append(f"the child pytest exited {report['returncode']}")
    for outcome in sorted(set(outcomes) - {"passed", "xfailed", "deselected"}):
        found.append(f"{outcome}: " + ", ".join(outcomes[outcome]))
    seen = {test for ids in outcomes.values() for test in ids}
    expected_pass = {t for t in seen if _name(t) not in tables.EXCLUDED | tables.DIFFERS.keys()}
    passed = set(outcomes.get("passed", ()))
    if passed != expected_pass:
        found.extend(f"expected to pass, did not: {t}" for t in sorted(expected_pass - passed))
        found.extend(f"passed but is in a table: {t}" for t in sorted(passed - expected_pass))
    xfailed = outcomes.get("xfailed", [])
    for name in sorted(set(tables.DIFFERS) - {_name(t) for t in xfailed}):
        found.append(f"differs on purpose, but did not fail as expected: {name}")
    for test in xfailed:
        if _name(test) not in tables.DIFFERS:
            found.append(f"xfailed, but not in tables.DIFFERS: {test}")
            continue
        _reason, evidence = tables.DIFFERS[_name(test)]
        if evidence not in report["xfail_text"].get(test, ""):
            found.append(f"fails, but not on the documented difference ({evidence!r}): {test}")
    left_out = {_name(t) for t in outcomes.get("deselected", ())}
    found.extend(f"left out in the tables, not found upstream: {name}"
                 for name in sorted(set(tables.EXCLUDED) - left_out))
    pinned = {"passed": tables.PASSED, "xfailed": tables.DIFFERING,
              "deselected": tables.LEFT_OUT}
    if counts(report) != pinned:
        found.append(f"counts {counts(report)} are not the pinned {pinned}")
    return found


def parameters(cls: type) -> set[str]:
    """The keyword parameters of ``cls.__init__`` (``self`` and ``*args``/``**kwargs`` aside)."""
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {name for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind in kinds}


def constructor_problems(theirs: type, ours: type) -> list[str]:
    """How our constructor departs from theirs beyond `tables.API_OURS_ONLY` (none: parity)."""
    their_names, our_names = parameters(theirs), parameters(ours)
    found = [f"constructor: deepagents takes {name!r}, ours does not"
             for name in sorted(their_names - our_names)]
    found += [f"constructor: ours takes {name!r}, not in tables.API_OURS_ONLY"
              for name in sorted(our_names - their_names - tables.API_OURS_ONLY.keys())]
    found += [f"constructor: tables.API_OURS_ONLY names {name!r}, which "
              + ("deepagents now takes too" if name in their_names else "ours does not take")
              for name in sorted(tables.API_OURS_ONLY.keys() - (our_names - their_names))]
    return found


def installed_constructor_problems() -> list[str]:
    """`constructor_problems` of the installed deepagents and ours (a dev requirement)."""
    import warnings

    from rubric_core import RubricMiddleware

    with warnings.catch_warnings():  # deepagents marks its RubricMiddleware beta
        warnings.simplefilter("ignore")
        from deepagents.middleware.rubric import RubricMiddleware as Theirs
    return constructor_problems(Theirs, RubricMiddleware)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upstream", type=Path,
                        help="a deepagents checkout, a git dir (with --rev) or the test file")
    parser.add_argument("--api-only", action="store_true",
                        help="check only the constructor against the installed deepagents")
    parser.add_argument("--rev", help="read the test file at this commit, through git")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="list every upstream test with its outcome and, if any, why")
    args = parser.parse_args(argv)
    if args.upstream is None and not args.api_only:
        parser.error("--upstream is required (or --api-only)")
    if str(ROOT) not in sys.path:  # the constructor checked is this tree's, as the suite's is
        sys.path.insert(0, str(ROOT))
    api = installed_constructor_problems()
    for problem in api:
        print(f"MISMATCH {problem}")
    if not api:
        print("constructor: every parameter of the installed deepagents' RubricMiddleware is "
              f"ours; ours adds {', '.join(sorted(tables.API_OURS_ONLY))}")
    if args.api_only:
        return 1 if api else 0
    try:
        text, origin = read_upstream(args.upstream, args.rev)
        blob = git_blob_id(text)
        print(f"upstream: {origin} (git blob {blob})")
        if blob != tables.UPSTREAM_BLOB:
            print(f"note: the tables were written for blob {tables.UPSTREAM_BLOB} (commit "
                  f"{tables.UPSTREAM[2][:9]}); this version may differ")
        report = run_suite(text)
    except ParityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.verbose:
        for outcome, ids in sorted(report["outcomes"].items()):
            for test in ids:
                why = (tables.EXCLUDED.get(_name(test))
                       or tables.DIFFERS.get(_name(test), ("",))[0])
                print(f"{outcome:10} {test}" + (f"\n           {why}" if why else ""))
    n = counts(report)
    total = sum(n.values())
    print(f"{n.get('passed', 0)} passed, {n.get('xfailed', 0)} differ on purpose (strict "
          f"xfail), {n.get('deselected', 0)} left out, of {total} upstream tests")
    found = problems(report)
    for problem in found:
        print(f"MISMATCH {problem}")
    if found:
        print(report["output"][-4000:])
    if found or api:
        return 1
    print("parity holds: every outcome is the one the tables and the README state")
    return 0


if __name__ == "__main__":
    sys.exit(main())
