"""Links: ``?run=ID`` opens that run on Review, ``?experiment=ID`` that one on Experiments.

They open what they name in a new browser session and in one that already shows another.

A link is followed whenever the URL carries one this session has not shown (`follow_link`,
every script run): on a session's first run (a link opened, a reload) and whenever the URL
changes under a live session (the browser's Back and Forward keep the session and change the
URL). The pages put the link of what they show into the URL (`show_link`), so the address bar
always links to what is on screen, and what a page wrote is not taken for a new link.

An id in a link is the whole id, a prefix that names one run or experiment (the history, the
pickers and the CLI show 8 characters), or, for ``?run=``, the id of the run's thread (the CLI
prints it whole). A link that names none is said so on its page (`find_run`,
`find_experiment`), which then opens nothing in its place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rubric_core.ids import unique_id

if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

    from rubric_core.store import Store

LINK_PAGES = {"run": "pages/review.py", "experiment": "pages/experiments.py"}
"""URL query parameters that open a page, and the page each opens."""

OPEN_RUN = "open_request"
"""Session key: the run (as a link gave it) the Review page opens when it is drawn next."""

OPEN_EXPERIMENT = "exp_open_request"
"""Session key: the experiment (as a link gave it) the Experiments page opens next."""

_SHOWN = "_links_shown"  # session key: {param: the id this session last followed or showed}
_LINK_ID = re.compile(r"[0-9a-f]{4,32}")


@dataclass(frozen=True)
class LinkRequest:
    """What a URL asked to open: the page, and the id of the run or experiment."""

    page: str
    """The page file (`LINK_PAGES`)."""
    param: str
    """``run`` or ``experiment``."""
    target_id: str
    """The id as the link gives it: whole, a prefix, or (``run``) a thread's id."""


@dataclass(frozen=True)
class LinkTarget:
    """What a link's id names in the database: one id, or why none."""

    target_id: str | None
    """The run's or experiment's whole id; None when the link names none."""
    problem: str | None
    """Why nothing is opened (for the page to say); None when ``target_id`` is set."""


def link_id(value: object) -> str | None:
    """The id in a link's parameter (4 to 32 hex digits); None when it is not one."""
    text = value.strip().lower() if isinstance(value, str) else ""
    return text if _LINK_ID.fullmatch(text) else None


def link_request(params: Mapping[str, Any]) -> LinkRequest | None:
    """The run or experiment a URL's query parameters ask to open (the first valid one)."""
    for param, page in LINK_PAGES.items():
        target = link_id(params.get(param))
        if target is not None:
            return LinkRequest(page, param, target)
    return None


def open_link(state: MutableMapping[str, Any], link: LinkRequest) -> None:
    """Make the linked page open the linked run or experiment when it is drawn."""
    state[OPEN_RUN if link.param == "run" else OPEN_EXPERIMENT] = link.target_id


def follow_link(state: MutableMapping[str, Any], params: Mapping[str, Any]
                ) -> LinkRequest | None:
    """The link to follow on this script run, asked of its page; None when there is none.

    A link is one the URL carries that differs from what this session last followed or
    showed for that parameter (see the module docstring).
    """
    shown = state.setdefault(_SHOWN, {})
    for param, page in LINK_PAGES.items():
        target = link_id(params.get(param))
        if target is None or shown.get(param) == target:
            continue
        shown[param] = target
        link = LinkRequest(page, param, target)
        open_link(state, link)
        return link
    return None


def show_link(state: MutableMapping[str, Any], params: MutableMapping[str, Any], param: str,
              target_id: str) -> None:
    """Put the link of what the page shows in the URL, as this session's own (not a request)."""
    state.setdefault(_SHOWN, {})[param] = target_id
    if params.get(param) != target_id:
        params[param] = target_id


def link_for(param: str, target_id: str) -> str:
    """The relative link that opens a run (``run``) or an experiment (``experiment``)."""
    return f"?{param}={target_id}"


def _not_found(param: str, given: str, reason: str) -> str:
    kind = "run" if param == "run" else "experiment"
    return (f"The link `?{param}={given}` opens no {kind}: {reason}. It may be in another "
            f"database (the one in use is in the sidebar), or deleted; pick a {kind} here.")


def find_run(store: Store, given: str) -> LinkTarget:
    """The run a link's id names: its id, its thread's id, or a unique prefix of its id."""
    if store.get_run(given) is not None:
        return LinkTarget(given, None)
    if (on_thread := store.latest_run_for_thread(given)) is not None:
        return LinkTarget(on_thread.run_id, None)
    try:
        return LinkTarget(unique_id("run", given,
                                    (r.run_id for r in store.list_runs(limit=None))), None)
    except ValueError as exc:
        return LinkTarget(None, _not_found("run", given, str(exc)))


def find_experiment(store: Store, given: str) -> LinkTarget:
    """The experiment a link's id names: its id, or a unique prefix of it."""
    if store.get_experiment(given) is not None:
        return LinkTarget(given, None)
    try:
        return LinkTarget(unique_id("experiment", given, (
            e.experiment_id for e in store.list_experiments(limit=None))), None)
    except ValueError as exc:
        return LinkTarget(None, _not_found("experiment", given, str(exc)))


__all__ = ["LINK_PAGES", "OPEN_EXPERIMENT", "OPEN_RUN", "LinkRequest", "LinkTarget",
           "find_experiment", "find_run", "follow_link", "link_for", "link_id", "link_request",
           "open_link", "show_link"]
