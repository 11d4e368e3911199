#!/usr/bin/env bash
# Set up a virtual environment with the dev requirements and run every check:
# ruff (lint), mypy (types of rubric_core) and the pytest suite, browser test included.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt

# The browser test drives Debian's Chromium; install it when missing and we can.
if [ -z "${RUBRIC_STUDIO_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing Chromium for the browser test (apt-get) ..."
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "Chromium is missing: install it (e.g. 'sudo apt-get install chromium') or set RUBRIC_STUDIO_CHROMIUM." >&2
  fi
fi

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest "$@"
