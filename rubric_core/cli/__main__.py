"""``python -m rubric_core.cli``: the same command as ``rubric-studio``."""

from __future__ import annotations

import os

from rubric_core.cli import main

os.environ.setdefault("PYTHONWARNINGS", "ignore")
raise SystemExit(main())
