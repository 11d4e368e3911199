"""Serve Rubric Studio (``app.py``) behind the host check: ``streamlit run serve.py``.

``streamlit run`` finds the ``st.App`` below and serves it with uvicorn, reading
``.streamlit/config.toml`` and the usual ``--server.*`` flags as for ``streamlit run app.py``.
``st.App(middleware=...)`` is Streamlit's documented way to add ASGI middleware; it is the only
one that reaches every HTTP request and the WebSocket, where ``server.allowedHosts`` covers
the WebSocket alone. See ``rubric_core/host_check.py`` for the rule.

The check fails closed: an untested Streamlit version, a bad ``RUBRIC_STUDIO_ALLOWED_HOSTS``
entry, or a middleware that did not end up in the request path stops the server at start.
"""

from __future__ import annotations

import os
import re

import streamlit as st
from starlette.middleware import Middleware

from rubric_core import host_check

# Versions tests/test_host_check.py passed with. Another may route requests past user
# middleware; rerun that test with it before widening this.
TESTED_STREAMLIT = (1, 67)

_version = re.match(r"(\d+)\.(\d+)", st.__version__)
if _version is None or tuple(map(int, _version.groups())) != TESTED_STREAMLIT:
    msg = (
        f"serve.py's host check was tested with Streamlit {'.'.join(map(str, TESTED_STREAMLIT))}"
        f".x, not {st.__version__}; refusing to serve without it. Install requirements.txt, "
        "or pass tests/test_host_check.py with this version and update TESTED_STREAMLIT."
    )
    raise RuntimeError(msg)

# The pages in pages/ are app.py's own (`st.navigation`). Streamlit takes a pages/ folder beside
# the main script for an old-style multipage app until a script calls `st.navigation`, so the
# first run after the server starts showed, for the seconds its imports take, every file there
# by its lower-case name (the helper _calls_view.py as "calls view" too) and, on a deep link,
# ran that page's file on its own. Said up front instead (the attribute Streamlit itself sets).
from streamlit.runtime.pages_manager import PagesManager  # noqa: E402

PagesManager.uses_pages_directory = False

app = st.App(
    "app.py",
    middleware=[
        Middleware(
            host_check.HostCheckMiddleware,
            allowed_hosts=host_check.allowed_hosts(os.environ),
        )
    ],
    lifespan=host_check.require_installed,
)
