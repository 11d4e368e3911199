#!/usr/bin/env bash
# Set up a virtual environment with the dev requirements and run every check:
# ruff (lint), mypy (types of rubric_core) and the pytest suite, browser tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt

# The browser test drives Debian's Chromium, the sandbox tests run graded code under bubblewrap
# and the PostgreSQL tests start a throwaway server from Debian's postgresql package; install
# whichever is missing when we can (root and apt-get).
missing=()
if [ -z "${RUBRIC_STUDIO_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  missing+=(chromium)
fi
if [ -z "${RUBRIC_STUDIO_BWRAP:-}" ] && ! command -v bwrap >/dev/null 2>&1; then
  missing+=(bubblewrap)
fi
if [ -z "${RUBRIC_STUDIO_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    && ! command -v initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing ${missing[*]} for the tests (apt-get) ..."
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "Missing for the tests: ${missing[*]}. Install them (e.g. 'sudo apt-get install" \
      "${missing[*]}'), or point RUBRIC_STUDIO_CHROMIUM / RUBRIC_STUDIO_BWRAP /" \
      "RUBRIC_STUDIO_PG_BIN at them." >&2
  fi
fi

# ruff and mypy run beside pytest, not before it; their verdicts are printed after its own.
# pytest runs on every core (pytest-xdist: one worker process per core, each with its own
# PostgreSQL cluster, ports and temporary directories; RUBRIC_STUDIO_TEST_WORKERS overrides),
# handed one test at a time, the long ones first (tests/conftest.py, LONG_FIRST).
checks="$(mktemp -d)"
trap 'rm -rf "$checks"' EXIT
# (`|| rc=$?`: under `set -e` a failing check would end its subshell before its code is kept.)
( rc=0; .venv/bin/ruff check . >"$checks/ruff.out" 2>&1 || rc=$?; echo "$rc" >"$checks/ruff.rc" ) &
( rc=0; .venv/bin/mypy >"$checks/mypy.out" 2>&1 || rc=$?; echo "$rc" >"$checks/mypy.rc" ) &
echo "== pytest (ruff and mypy beside it)"
status=0
.venv/bin/python -m pytest -n "${RUBRIC_STUDIO_TEST_WORKERS:-auto}" --dist load \
  --maxschedchunk 1 "$@" || status=$?
wait
for check in ruff mypy; do
  echo "== $check"
  cat "$checks/$check.out"
  rc="$(cat "$checks/$check.rc")"
  if [ "$rc" != 0 ]; then
    echo "$check failed (exit $rc)" >&2
    [ "$status" != 0 ] || status="$rc"
  fi
done
exit "$status"
