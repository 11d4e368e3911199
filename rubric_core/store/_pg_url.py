"""A PostgreSQL URL as text: what selects PostgreSQL, and how to show it with no secret in it.

Nothing here imports psycopg (the app and the CLI mask a URL without the ``postgres`` extra).
The rules follow libpq's own reading of a URL, which differs from `urllib.parse`'s: libpq ends
the user and password at the first ``@`` before any ``/`` (so ``?`` and ``#`` may stand
unencoded in a password), takes any ``key=value`` in the query string (``password`` and
``sslpassword`` hold secrets) and percent-decodes keys and values. Where the two readings
disagree about where a password ends, the whole URL is hidden: a password holding a raw ``/``
(``postgresql://u:pa/ss@host/db``) is not a password to libpq, which would read ``pa`` as a
port and echo it in its error.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

URL_SCHEMES = ("postgresql://", "postgres://")
"""Prefixes of a database location that selects PostgreSQL (any case)."""

MASK = "***"
"""What a password is shown as."""

_PARAMETER = re.compile(r"([?&])([^=&?]*)=([^&]*)")
"""A ``key=value`` query parameter; its value runs to the next ``&``, as libpq reads it."""

_OPTION = re.compile(r"(?:-c\s*|--)([A-Za-z0-9_.-]+)=(\S*)")
"""A server setting in libpq's ``options`` (``-c name=value`` or ``--name=value``)."""

_SECRET_NAME = re.compile(r"pass|secret|token|key", re.IGNORECASE)
"""A server setting whose name says it holds a secret (``-c app.api_key=...``)."""


def is_url(location: object) -> bool:
    """Whether a database location names PostgreSQL rather than a SQLite file."""
    return isinstance(location, str) and location.strip().lower().startswith(URL_SCHEMES)


def normalized(url: str) -> str:
    """``url`` stripped, with its scheme in lower case (libpq accepts no other spelling)."""
    scheme, _, rest = url.strip().partition("://")
    return f"{scheme.lower()}://{rest}"


def _secret_values(key: str, value: str) -> list[str] | None:
    """The secrets a query parameter holds, as written; None when it holds none.

    ``password`` and ``sslpassword`` are secrets; so is an ``options`` value that sets a
    server setting named like one (``-c app.secret=...``), whose values are returned.
    """
    name = urllib.parse.unquote(key).strip().lower()
    if "password" in name:
        return [value]
    if name == "options":
        found = [m[2] for m in _OPTION.finditer(urllib.parse.unquote(value))
                 if _SECRET_NAME.search(m[1])]
        return found or None
    return None


def _userinfo_end(rest: str) -> int:
    """Index of the ``@`` that ends the user part of ``rest`` (after ``://``), or -1.

    libpq takes the first ``@`` with no ``/`` before it; `urllib.parse` the last ``@`` before
    the first ``/`` or ``?``. The last ``@`` before the first ``/`` or ``?`` that follows
    libpq's is taken, so that either reading's password is inside what is masked.
    """
    first_at, first_slash = rest.find("@"), rest.find("/")
    if first_at < 0 or (0 <= first_slash < first_at):
        return -1
    ends = [i for i in (rest.find("/", first_at), rest.find("?", first_at)) if i >= 0]
    return rest.rfind("@", 0, min(ends) if ends else len(rest))


def unreadable(url: str) -> bool:
    """Whether a URL's user part cannot be told apart from its host, path or query.

    True when no ``@`` ends a user part (one stands after a ``/``) but one stands outside a
    query value (``postgresql://u:pa/ss@host/db``, ``postgresql://u:p#s/s@host/db``): a user
    name or password with a raw ``/`` that should have been percent-encoded.
    """
    _, _, rest = url.strip().partition("://")
    if _userinfo_end(rest) >= 0:
        return False
    path, _, query = rest.partition("?")
    if "@" in path:
        return True
    return any("@" in item.partition("=")[0] for item in query.split("&"))


def mask_url(url: str) -> str:
    """``url`` with every password in it shown as ``***`` (the whole URL when unreadable)."""
    url = normalized(url)
    scheme, _, rest = url.partition("://")
    if unreadable(url):
        return f"{scheme}://{MASK}"
    end = _userinfo_end(rest)
    if end >= 0:
        user, colon, _ = rest[:end].partition(":")
        rest = (f"{user}:{MASK}" if colon else user) + rest[end:]

    def masked(item: re.Match[str]) -> str:
        secret = _secret_values(item[2], item[3]) is not None
        return f"{item[1]}{item[2]}={MASK}" if secret else item[0]

    return f"{scheme}://{_PARAMETER.sub(masked, rest)}"


def url_secrets(url: str) -> list[str]:
    """Every spelling of every password in ``url``: as written, and percent-decoded.

    An `unreadable` URL has no password that can be told apart (refuse it instead).
    """
    _, _, rest = normalized(url).partition("://")
    raw: list[str] = []
    end = _userinfo_end(rest)
    if end >= 0:
        raw.append(rest[:end].partition(":")[2])
    for item in _PARAMETER.finditer(rest):
        raw += _secret_values(item[2], item[3]) or []
    found = {s for r in raw for s in (r, urllib.parse.unquote(r)) if s}
    return sorted(found, key=len, reverse=True)  # longest first: no prefix masks the rest


def servers(parsed: Mapping[str, str]) -> str:
    """The ``host:port`` pairs a connection goes to, for messages (several, comma-separated).

    Args:
        parsed: libpq's reading of the URL (``psycopg.conninfo.conninfo_to_dict``).

    """
    hosts = (parsed.get("host") or parsed.get("hostaddr") or "localhost").split(",")
    ports = (parsed.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    shown = [f"[{h}]" if ":" in h and not h.startswith("/") else (h or "localhost")
             for h in hosts]
    return ", ".join(f"{h}:{p or '5432'}" for h, p in zip(shown, ports, strict=False))
