"""``rubric-studio app``: start the Streamlit app (``streamlit run serve.py``).

The app runs from the clone the package was installed from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rubric_core.cli._common import UsageError

if TYPE_CHECKING:
    import argparse

DESCRIPTION = (
    "Start the Streamlit app from the clone it was installed from. Arguments after 'app' go "
    "to 'streamlit run', e.g. rubric-studio app --server.port 8600."
)
"""``app --help``'s description."""


def app_root() -> Path | None:
    """The directory holding the Streamlit app (``serve.py``, ``app.py``, ``pages/``), if any.

    The app ships with the repository, not inside the package: it is found next to the
    package (an editable install or a clone) or in the current directory.
    """
    package_parent = Path(__file__).resolve().parents[2]  # .../rubric_core/cli/app.py
    for candidate in (package_parent, Path.cwd()):
        if all((candidate / name).exists() for name in ("serve.py", "app.py", "pages")):
            return candidate
    return None


def start_app(streamlit_args: list[str]) -> int:
    """Replace this process with ``streamlit run serve.py ARGS`` in the app's directory.

    Raises:
        UsageError: The app is not there (an installed wheel holds the package only).

    """
    root = app_root()
    if root is None:
        msg = (
            "the Streamlit app (serve.py, app.py, pages/) ships with the repository, not the "
            "package: run 'rubric-studio app' inside a clone, or install from one with "
            "'pip install -e .'"
        )
        raise UsageError(msg)
    args = [a for a in streamlit_args if a != "--"]
    os.chdir(root)  # streamlit reads .streamlit/config.toml from the working directory
    os.execv(sys.executable, [sys.executable, "-m", "streamlit", "run", "serve.py", *args])
    return 0  # pragma: no cover - execv does not return


def app(args: argparse.Namespace, out: TextIO) -> int:  # noqa: ARG001 - one signature
    """``app`` as parsed by argparse (no arguments reached it): start the app."""
    return start_app([])
