"""Scrub secrets from every string that leaves the process or is stored.

A provider's error body may echo the request's ``Authorization`` header; a model may repeat a
key it was shown. Whatever reaches the database (checkpoints and run index), an export, a log
line, the app or the CLI's output goes through `redact` first, which removes:

- the values of configured secrets: environment variables whose names end in ``_KEY``,
  ``_TOKEN``, ``_SECRET`` or ``PASSWORD`` (values of 8 characters or more), and any value
  registered with `register_secret` (the app registers its ``st.secrets`` values and keys
  typed into the page);
- key-shaped tokens whatever their source: ``Bearer <token>``, ``sk-…`` (OpenAI, Anthropic's
  ``sk-ant-…``), ``gsk_…`` (Groq), ``AIza…`` (Google), ``xai-…``, ``api_key=…`` /
  ``"api_key": "…"`` assignments, and credentials in a URL's query string (``?key=…``,
  ``&access_token=…``, ``?sig=…``, ``?password=…``: httpx names the URL in its errors), and
  the password of a URL's user info (``http://user:password@host``).

Each is replaced by ``[redacted]`` (a ``Bearer``, an assignment or a query parameter keeps its
name, so the text still says what was there). Since every stored string passes through here,
characters nothing can store (NUL, lone surrogates) also become U+FFFD. Redaction is one pass
of plain string replacement and one regular expression, linear in the text's length.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

REDACTED = "[redacted]"
"""What a secret is replaced with."""

SECRET_NAME_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "PASSWORD")
"""Environment variables with these name endings hold secrets (``PASSWORD`` without the
underscore, so that libpq's ``PGPASSWORD`` counts too)."""

MIN_SECRET_CHARS = 8
"""Shorter values are not treated as secrets (they would match ordinary words)."""

_KEY_SHAPES = re.compile(
    r"(?P<bearer>\b[Bb]earer\s+)[A-Za-z0-9._~+/=-]{6,}"
    r"|\b(?:sk-(?:ant-)?|gsk_|xai-)[A-Za-z0-9_-]{12,}"
    r"|\bAIza[0-9A-Za-z_-]{30,}"
    # Values stop at a backslash too: in JSON text it escapes the quote that ends the string,
    # and replacing it with the value would leave that quote closing the string early.
    r"|(?P<assign>\bapi[_-]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"',}\\]{6,}"
    # A credential in a URL's query string (httpx puts the URL in its error messages):
    # ?key=, &access_token=, ?x-goog-api-key=, an Azure SAS ?sig=, libpq's ?password=.
    r"|(?P<query>[?&][\w.-]*(?:key|token|secret|password|passwd|sig|signature)=)[^&#\s\"'<>\\]+"
    # A password in a URL's user info (http://user:password@host, postgresql://u:p@h/db).
    # (one already masked as ``***`` by `rubric_core.store.mask_url` is left as it reads).
    r"|(?P<userinfo>\b[a-z][a-z0-9+.-]*://[^\s/?#@:\"'<>\\]*:)(?!\*+@)[^\s/?#@\"'<>\\]+(?=@)",
    re.IGNORECASE,
)

_KEY_HINTS = re.compile(
    rb"\bbearer|\b(?:sk-|gsk_|xai-)[a-z0-9_-]{12}|\baiza[0-9a-z_-]{30}|\bapi[_-]?key"
    rb"|(?:key|token|secret|password|passwd|sig|signature)=|://[^\s/?#@]*:[^\s/?#@]+@",
    re.IGNORECASE,
)
"""What every match of `_KEY_SHAPES` contains, as UTF-8 bytes: a serialized checkpoint with
none of these (and no configured secret) holds nothing `redact` would change."""

_KEY_HINT_WORDS = (b"bearer", b"sk-", b"gsk_", b"xai-", b"aiza", b"api_key", b"api-key",
                   b"apikey", b"key=", b"token=", b"secret=", b"password=", b"passwd=", b"sig=",
                   b"signature=", b"://")
"""Words one of which every `_KEY_HINTS` match holds (lower case): looked for first, since a
substring search is some ten times faster than the expression over the same bytes."""


_CASE_FOLDS = tuple(c.encode() for c in "\u0130\u0131\u017f\u212a")
"""The only characters outside ASCII that `_KEY_SHAPES` (case-insensitive, Unicode) takes for
an ASCII letter: İ and ı for i, ſ for s, the Kelvin sign for k. Bytes holding one are
scrubbed the slow way, since the ASCII words and expression above would not see through them."""


def _may_hold_key(data: bytes) -> bool:
    """Whether serialized bytes may hold a key shape (False: they surely do not)."""
    if any(fold in data for fold in _CASE_FOLDS):
        return True
    lower = data.lower()
    return any(word in lower for word in _KEY_HINT_WORDS) and bool(_KEY_HINTS.search(data))

UNSTORABLE_REPLACEMENT = "\ufffd"
"""What a character no store or UTF-8 file can hold is replaced with (U+FFFD)."""

# NUL (PostgreSQL's text and JSONB refuse it) and surrogate code points (no UTF-8 encoder takes
# them; JSON's "\ud800" escape makes one). A model's reply may carry either: left in, the
# first INSERT or CSV row that meets one fails halfway through recording.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

_lock = threading.Lock()
_registered: set[str] = set()

T = TypeVar("T")


def register_secret(value: object) -> None:
    """Treat ``value`` as a secret from now on (ignored unless a string of 8+ characters)."""
    if isinstance(value, str) and len(value.strip()) >= MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value.strip())


def register_secrets(values: Mapping[str, Any] | Iterable[object]) -> None:
    """`register_secret` for every value of a mapping (nested ones included) or iterable."""
    items = values.values() if isinstance(values, Mapping) else values
    for value in items:
        if isinstance(value, Mapping):
            register_secrets(value)
        else:
            register_secret(value)


_env_seen: tuple[tuple[Any, Any], ...] | None = None
_env_secret_items: tuple[tuple[Any, Any], ...] = ()


def _secret_env_items() -> tuple[tuple[Any, Any], ...]:
    """The environment's secret-named ``(name, value)`` pairs, undecoded.

    Read on every call, so a key set or changed at run time counts at once. From the mapping
    behind ``os.environ`` when there is one (CPython's ``_data``: every change through
    ``os.environ`` lands there): iterating ``os.environ`` itself decodes every name and value
    of the environment, and redaction asks once per checkpoint write. The names are matched
    again only when the environment changed (a snapshot compared in C, not a scan in Python).
    """
    global _env_seen, _env_secret_items
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return tuple((name, value) for name, value in os.environ.items()
                     if name.upper().endswith(SECRET_NAME_SUFFIXES))
    snapshot = tuple(raw.items())
    with _lock:
        if snapshot == _env_seen:
            return _env_secret_items
    suffixes: tuple[Any, ...] = tuple(
        s.encode() if os.supports_bytes_environ else s for s in SECRET_NAME_SUFFIXES)
    items = tuple((name, value) for name, value in snapshot if name.upper().endswith(suffixes))
    with _lock:
        _env_seen, _env_secret_items = snapshot, items
    return items


_cache_key: tuple[object, ...] | None = None
_cache_value: list[str] = []


def secret_values() -> list[str]:
    """The configured secret values, longest first (so a key's prefix never masks the rest)."""
    global _cache_key, _cache_value
    items = _secret_env_items()
    with _lock:
        key = (items, len(_registered))  # registrations only ever add
        if key == _cache_key:
            return list(_cache_value)
        found = set(_registered)
    for _, raw in items:
        value = (os.fsdecode(raw) if isinstance(raw, bytes) else raw).strip()
        if len(value) >= MIN_SECRET_CHARS:
            found.add(value)
    ordered = sorted(found, key=len, reverse=True)
    with _lock:
        _cache_key, _cache_value = key, ordered
    return list(ordered)


def _shape(match: re.Match[str]) -> str:
    prefix = (match.group("bearer") or match.group("assign") or match.group("query")
              or match.group("userinfo") or "")
    return prefix + REDACTED


def redact(text: str, *, secrets: Sequence[str] | None = None) -> str:
    """``text`` with configured secrets and key-shaped tokens replaced by ``[redacted]``.

    Args:
        text: Any text (non-strings are returned unchanged).
        secrets: `secret_values()`, when the caller redacts many strings at once and has
            read them already (reading the environment is most of the cost of a short text).
    """
    if not isinstance(text, str) or not text:
        return text
    if _UNSTORABLE.search(text):
        text = _UNSTORABLE.sub(UNSTORABLE_REPLACEMENT, text)
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    # The expression costs ~0.15 ms a KB (a traced grader prompt is several); the hint
    # search that rules it out, a tenth of that. No surrogate is left to encode (above).
    if not _may_hold_key(text.encode()):
        return text
    return _KEY_SHAPES.sub(_shape, text)


def error_text(exc: BaseException) -> str:
    """How a run records an exception: ``Type: message``, scrubbed (`redact`)."""
    return redact(f"{type(exc).__name__}: {exc}")


_PARTIAL_KEY = re.compile(
    r"(?:\b[Bb]earer\s+[A-Za-z0-9._~+/=-]*"
    r"|\b(?:sk-(?:ant-)?|gsk_|xai-)[A-Za-z0-9_-]*"
    r"|\bAIza[0-9A-Za-z_-]*"
    r"|\bapi[_-]?key[\"']?\s*[:=]\s*[\"']?[^\s\"',}\\]*"
    r"|[?&][\w.-]*(?:key|token|secret|password|passwd|sig|signature)=[^&#\s\"'<>\\]*)\Z",
    re.IGNORECASE,
)
"""A key shape that has begun at the very end of a text but may not be complete yet."""

_STREAM_HOLD_MIN = 4  # the fewest characters of a secret's start worth holding back


def redact_stream(text: str) -> str:
    """`redact` for text still being streamed: a tail that may be a key's beginning is held.

    A key arrives over several tokens; shown as it comes, its first characters would be on the
    screen before the whole key is there to be recognised. So the end of the text is held back
    when it is the start of a configured secret, or of a key shape (``sk-``, ``Bearer``,
    ``api_key=``, ...), and ``…`` stands for it until more text arrives or the stream ends
    (the whole message is then shown, scrubbed, as `redact` gives it).
    """
    if not isinstance(text, str) or not text:
        return text
    known = secret_values()
    clean = redact(text, secrets=known)
    cut = len(clean)
    for secret in known:
        for n in range(min(len(secret) - 1, len(clean)), _STREAM_HOLD_MIN - 1, -1):
            if clean.endswith(secret[:n]):
                cut = min(cut, len(clean) - n)
                break
    partial = _PARTIAL_KEY.search(clean)
    if partial is not None:
        cut = min(cut, partial.start())
    return clean if cut == len(clean) else clean[:cut] + "…"


def redact_data(value: T, *, secrets: Sequence[str] | None = None) -> T:
    """`redact` every string inside ``value`` (dicts, lists and tuples, recursively).

    Returns a new structure of the same shape; keys are kept as they are. The secrets are read
    once for the whole structure.
    """
    known = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        return redact(value, secrets=known)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {key: redact_data(item, secrets=known)  # type: ignore[return-value]
                for key, item in value.items()}
    if isinstance(value, list):
        return [redact_data(item, secrets=known) for item in value]  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(redact_data(item, secrets=known)  # type: ignore[return-value]
                     for item in value)
    return value


_factory_installed = False


def install_log_redaction() -> None:
    """Make every log record, from any library, carry redacted text (idempotent).

    Wraps the logging record factory, so it applies to records of every logger and handler,
    including ones configured later (Streamlit's, a provider SDK's).
    """
    global _factory_installed
    with _lock:
        if _factory_installed:
            return
        _factory_installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as it would
            return record
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)


def install_traceback_redaction() -> None:
    """Make the interpreter's own traceback printers redact what they print (idempotent).

    An exception nothing caught is printed by ``sys.excepthook`` (or, in a thread, by
    ``threading.excepthook``) straight to stderr, past the log redaction: a provider error
    that echoed a key would be printed whole. Both hooks format the traceback as they would,
    then print it scrubbed. For command-line entry points; the app's exceptions go to its log.
    """
    global _tracebacks_installed
    with _lock:
        if _tracebacks_installed:
            return
        _tracebacks_installed = True

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:  # as the default hook: a thread's exit is no error
            return
        name = args.thread.name if args.thread is not None else threading.get_ident()
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value,
                                                  args.exc_traceback))
        sys.stderr.write(redact(f"Exception in thread {name}:\n{text}"))

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook


_tracebacks_installed = False


def _scrub_stored(value: Any, secrets: Sequence[str]) -> Any:
    """`redact_data` that also reaches into chat messages and exceptions (for checkpoints)."""
    if isinstance(value, str):
        return redact(value, secrets=secrets)
    if isinstance(value, BaseException):
        # LangGraph stores a failed task's error as its repr
        return redact(repr(value), secrets=secrets)
    if isinstance(value, dict):
        return {key: _scrub_stored(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrub_stored(item, secrets) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_scrub_stored(item, secrets) for item in value)
    content = getattr(value, "content", None)
    copy = getattr(value, "model_copy", None)
    if content is not None and callable(copy) and isinstance(content, str | list):
        # A chat message: its text, and every other field a model's reply can echo a key into
        # (tool call arguments, provider extras, an unparsable call's raw text, an artifact).
        changed: dict[str, Any] = {}
        for name in _MESSAGE_FIELDS:
            field = getattr(value, name, None)
            if field is not None:
                cleaned = _scrub_stored(field, secrets)
                if cleaned != field:
                    changed[name] = cleaned
        if changed:
            return copy(update=changed)
    return value


_MESSAGE_FIELDS = ("content", "tool_calls", "invalid_tool_calls", "additional_kwargs",
                   "response_metadata", "artifact")


def scrub_checkpoint_config(config: Any, metadata: Any) -> tuple[Any, Any]:
    """A saver's ``put`` arguments with the secrets scrubbed from what becomes metadata.

    LangGraph's savers store checkpoint metadata as JSON, past their serializer, and copy
    into it every string of the run's ``config["metadata"]`` and ``config["configurable"]``
    (where a configurable model's ``api_key`` goes). The keys that address the checkpoint
    (``thread_id``, ``checkpoint_ns``, ``checkpoint_id``) are kept exactly: they are never
    copied into metadata, and a changed one would store the checkpoint elsewhere.
    """
    from langgraph.checkpoint.base import EXCLUDED_METADATA_KEYS

    known = secret_values()
    configurable = {
        key: value if key in EXCLUDED_METADATA_KEYS or key.startswith("__")
        else redact_data(value, secrets=known)
        for key, value in (config.get("configurable") or {}).items()
    }
    clean_config = {**config, "configurable": configurable,
                    "metadata": redact_data(dict(config.get("metadata") or {}), secrets=known)}
    return clean_config, redact_data(dict(metadata), secrets=known)


_encoded_cache: tuple[tuple[str, ...], tuple[bytes, ...]] = ((), ())


def _encoded(secrets: Sequence[str]) -> tuple[bytes, ...]:
    """The secrets as UTF-8 bytes (kept for the last list asked for)."""
    global _encoded_cache
    key = tuple(secrets)
    cached = _encoded_cache
    if cached[0] != key:
        cached = key, tuple(v.encode("utf-8", "surrogatepass") for v in key)
        _encoded_cache = cached
    return cached[1]


class RedactingSerializer:
    """A LangGraph checkpoint serializer that scrubs secrets before delegating.

    Wraps any ``SerializerProtocol`` (LangGraph's ``JsonPlusSerializer`` by default), so that
    checkpoints and pending writes (a failed task's error included) never hold a secret.
    """

    def __init__(self, inner: Any | None = None) -> None:
        if inner is None:
            from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

            inner = JsonPlusSerializer()
        self._inner = inner

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        """Serialize ``obj`` with its secrets redacted.

        A checkpoint is written after every step of every run and nearly always holds no
        secret, so it is serialized first and the bytes are searched (in C): msgpack keeps
        every string as its UTF-8 bytes, so bytes holding neither a configured secret nor
        what a key shape starts with (`_KEY_HINTS`) are stored as they are. Anything else (a
        hint, another format, a value msgpack refuses) is scrubbed object by object and
        serialized again. A NUL stays in the stored bytes (a checkpoint is binary), and
        LangGraph's msgpack writes a lone surrogate as ``?``; every text read back from a
        checkpoint is redacted again before it is recorded.
        """
        known = secret_values()
        if not isinstance(obj, BaseException):  # an error is stored as its (scrubbed) repr
            with contextlib.suppress(Exception):  # e.g. a lone surrogate: scrubbed below
                kind, data = self._inner.dumps_typed(obj)
                if kind == "msgpack" and not _may_hold_key(data) and not any(
                        secret in data for secret in _encoded(known)):
                    return kind, data
        result: tuple[str, bytes] = self._inner.dumps_typed(_scrub_stored(obj, known))
        return result

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """Deserialize as the wrapped serializer does."""
        return self._inner.loads_typed(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
