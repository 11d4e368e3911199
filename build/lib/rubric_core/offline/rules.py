"""Criterion recognition for the offline graders: which phrasings the rules can check, and how.

`recognise` maps a criterion, as written in a rubric, to a deterministic check built on the
evidence tools' pure functions; `check_criterion` grades one criterion with it and
`unrecognised_criteria` lists the ones no rule recognises. A criterion that is not recognised is
never guessed. The chat models that use these rules, `RulesGrader` and `HybridGrader`, live in
`rubric_core.offline.graders`.

Recognised criteria (case-insensitive; a trailing period is ignored; a value may be quoted with
`` `...` ``, ``"..."`` or ``'...'`` and must be quoted when it is more than a plain word or two):

========================================  ===================================================
Criterion (examples)                      Check
========================================  ===================================================
The poem has three lines / exactly 3      count of lines, words, sentences or characters;
lines / is three lines long / The answer  comparators: exactly, at most, no more than, up
is one sentence / a single sentence / at  to, under, fewer than, at least, more than, over,
most 50 words / under 200 characters /    "... or fewer", "... or more", "does not exceed"
50 words or fewer
Lines follow a 5-7-5 syllable pattern /   syllables per line, and the number of lines
syllables 5/7/5 / 5-7-5
mentions X and Y / mentions X / The       each term appears as a word, plural allowed
theme is spring (= mentions spring)
includes the word X / uses the words X    each term appears as a whole word
contains X / does not contain X           substring, case-insensitive (``run_check``)
does not mention X / never mentions X     none of the terms appears as a word
matches the regex /.../ / matches         ``run_check`` regex; ``/.../i`` sets flags
regular expression `...`
starts with X / ends with X               ``run_check`` starts_with / ends_with (any case)
is valid JSON                             ``run_check`` valid_json (one wrapping fence ok)
validates against the JSON schema in      calls the bound tool TOOL with the record (the
TOOL / validates against TOOL             answer's first fenced block, else the answer)
validates against the JSON schema `{..}`  ``run_check`` json_schema with the inline schema
All tests pass in TOOL / passes the       calls the bound tool TOOL with the Python code
tests in TOOL                             extracted from the answer
The function is named `f` (and accepts a  parses the extracted code: a top-level ``def f``
single list argument)                     with that many parameters (a type word is checked
                                          against the annotation when there is one)
========================================  ===================================================

Anything else in a criterion must be filler ("The poem", "should", "is", ...); a criterion with
other words ("Each line has at most 10 words", "never has 3 lines", "mentions at least two
examples") is not recognised. TOOL criteria are recognised only when a tool of that name is
bound; such tools take one string argument and return a dict with ``ok`` (and ``failures``,
``error`` or ``detail`` explaining a failure). `rubric_core.tools.json_schema_tool` builds one
for a schema.
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.tools import BaseTool

from rubric_core.tools.checks import embedded_json, run_check
from rubric_core.tools.sandbox import extract_python_code
from rubric_core.tools.text import text_stats_data
from rubric_core.types import CriterionVerdict

_GAP_LIMIT = 600
_SPACES = re.compile(r"\s+")

# --------------------------------------------------------------------------- vocabulary


def _word_list(text: str) -> list[str]:
    return text.split()


def _wordset(text: str) -> frozenset[str]:
    return frozenset(_word_list(text))


_SUBJECT = _wordset(
    "the a an this its it your whole entire final answer response reply output text poem "
    "haiku summary record story essay message tweet post description explanation definition "
    "title json object"
)
_VERBS = _wordset(
    "is are be has have should must will needs need to consists consist of contains contain "
    "uses use written in with fits fit stays stay kept keep"
)
_FILLER = _SUBJECT | _VERBS
_QUANTITY_FILLER = _FILLER | {"long", "length", "total", "overall", "in"}
_SYLLABLE_FILLER = _FILLER | _wordset(
    "line lines each every per syllable syllables pattern structure count counts form follow "
    "follows match matches traditional respectively"
)
_BARE_PATTERN_FILLER = _wordset(
    "a the follow follows pattern form structure haiku poem lines uses use has is"
)
_MENTION_FILLER = _SUBJECT | _wordset("should must also clearly explicitly both")
_CODE_FILLER = _FILLER | _wordset("code function solution implementation python")
_STOPWORDS = _wordset(
    "a an the some any at least most more less fewer than all each every one two three four "
    "five several many few other examples example how what why that which who when where "
    "its their they his her not no both either or also something things thing"
)

_NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        _word_list(
            "zero one two three four five six seven eight nine ten eleven twelve thirteen "
            "fourteen fifteen sixteen seventeen eighteen nineteen twenty"
        )
    )
}
_NUMBER = r"(?P<num>\d+|a\s+single|single|" + "|".join(_NUMBER_WORDS) + ")"
_BEFORE = (
    r"(?P<cmp>exactly|precisely|just|only|at\s+most|(?:no|not)\s+more\s+than|up\s+to|"
    r"(?:a\s+)?max(?:imum)?(?:\s+of)?|at\s+least|(?:no|not)\s+(?:fewer|less)\s+than|"
    r"(?:a\s+)?min(?:imum)?(?:\s+of)?|under|below|fewer\s+than|less\s+than|over|above|"
    r"more\s+than|within|(?:does|do|must|should|will)\s+not\s+exceed|(?:doesn't|don't|"
    r"cannot|can't|won't)\s+exceed|not\s+exceeding)"
)
_AFTER = r"(?P<after>or\s+(?:fewer|less|under|below|more|above)|at\s+(?:the\s+)?(?:most|least))"
_QUANTITY = re.compile(
    rf"(?<![\w-])(?:{_BEFORE}\s+)?{_NUMBER}\s+(?P<unit>lines?|words?|sentences?|characters?|"
    rf"chars?)(?:\s*,?\s*{_AFTER})?(?![\w-])",
    re.IGNORECASE,
)
_SYLLABLES = re.compile(r"(?<![\w-])(?P<pat>\d{1,2}(?:\s*[-/–,]\s*\d{1,2}){1,11})(?![\w-])")

_TOOL = r"`?(?P<tool>[A-Za-z_][\w.-]*)`?(?:\s+tool)?"
_QUOTED = r"`[^`]+`|\"[^\"]+\"|“[^”]+”|'[^']+'"
_NEG = r"(?:does\s+not|doesn't|do\s+not|don't|must\s+not|should\s+not|never|will\s+not|won't)"
_ITEM = re.compile(
    r"\s*(?:`(?P<bt>[^`]+)`|\"(?P<dq>[^\"]+)\"|“(?P<cq>[^”]+)”|'(?P<sq>[^']+)'|"
    r"(?P<plain>[^,&`\"“]+?))\s*(?:,\s*(?:and\s+|or\s+)?|&\s*|\s(?:and|or)\s+|$)",
    re.IGNORECASE,
)
_PLAIN_WORD = re.compile(r"[^\W_][\w'’+#.-]*")


def _clean(criterion: str) -> str:
    return _SPACES.sub(" ", criterion).strip().rstrip(".").strip()


def _only_filler(text: str, match: re.Match[str], filler: frozenset[str]) -> bool:
    """True when everything outside the matched core is filler words."""
    rest = f"{text[: match.start()]} {text[match.end() :]}"
    for token in re.findall(r"[\w'’-]+|[^\w\s]", rest):
        word = re.sub(r"['’]s$", "", token.lower())
        if word not in filler and word not in {",", ":"}:
            return False
    return True


def _unquote(value: str) -> str | None:
    """The value inside quotes, or None when `value` is not quoted."""
    value = value.strip()
    for left, right in (("`", "`"), ('"', '"'), ("'", "'"), ("“", "”")):
        if len(value) >= 2 and value[0] == left and value[-1] == right:
            return value[1:-1]
    return None


def _items(text: str, *, max_plain_words: int) -> list[str] | None:
    """Split "X, Y and Z" into terms; None when an unquoted term is not a plain word or two."""
    items: list[str] = []
    pos = 0
    text = re.sub(r"^(?:both|either)\s+", "", text.strip(), flags=re.IGNORECASE)
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            return None
        pos = m.end()
        plain = m.group("plain")
        if plain is None:
            items.append(next(g for g in m.group("bt", "dq", "cq", "sq") if g is not None))
            continue
        words = plain.split()
        if not 1 <= len(words) <= max_plain_words or any(
            not _PLAIN_WORD.fullmatch(w) or w.lower() in _STOPWORDS
            or w.lower() in _NUMBER_WORDS for w in words
        ):
            return None
        items.append(plain.strip())
    return items or None


def _word_pattern(term: str, *, plural: bool) -> re.Pattern[str]:
    body = r"\s+".join(re.escape(w) for w in term.split())
    return re.compile(rf"(?<!\w){body}{'(?:s|es)?' if plural else ''}(?!\w)", re.IGNORECASE)


def _plural(n: int, unit: str) -> str:
    return unit if n == 1 else f"{unit}s"


def _shorten(text: str) -> str:
    text = _SPACES.sub(" ", text).strip()
    return text if len(text) <= _GAP_LIMIT else text[: _GAP_LIMIT - 1] + "…"


# --------------------------------------------------------------------------- checks

Check = Callable[[str, Mapping[str, BaseTool]], str | None]
"""A recognised criterion: given the answer and the bound tools, the gap, or None if it passes."""

_UNITS = {"line": "lines", "word": "words", "sentence": "sentences", "character": "characters",
          "char": "characters"}
_CMP_TEXT = {"eq": "exactly", "le": "at most", "lt": "fewer than", "ge": "at least",
             "gt": "more than"}


def _comparator(before: str | None, after: str | None) -> str:
    for phrase in (p.lower() for p in (before, after) if p):
        if re.search(r"exceed|most|up to|max|within|no more|not more|or (?:fewer|less)", phrase):
            return "le"
        if re.search(r"least|min|no (?:fewer|less)|not (?:fewer|less)|or (?:more|above)", phrase):
            return "ge"
        if re.search(r"under|below|fewer|less|or (?:under|below)", phrase):
            return "lt"
        if re.search(r"over|above|more than", phrase):
            return "gt"
    return "eq"


def _quantity_check(m: re.Match[str]) -> Check:
    raw = m.group("num").lower()
    n = int(raw) if raw.isdigit() else _NUMBER_WORDS.get(raw, 1)
    unit = m.group("unit").lower().rstrip("s")
    key = _UNITS[unit]
    cmp = _comparator(m.group("cmp"), m.group("after"))
    ok: Callable[[int, int], bool] = {
        "eq": operator.eq, "le": operator.le, "lt": operator.lt, "ge": operator.ge,
        "gt": operator.gt}[cmp]
    noun = "character" if unit == "char" else unit

    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        actual = int(text_stats_data(answer)[key])
        if ok(actual, n):
            return None
        return f"the answer has {actual} {_plural(actual, noun)}, needs {_CMP_TEXT[cmp]} {n}"

    return check


def _syllable_check(pattern: list[int]) -> Check:
    shown = "-".join(map(str, pattern))

    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        counts = [int(c) for c in text_stats_data(answer)["syllables_per_line"]]
        if len(counts) != len(pattern):
            found = "-".join(map(str, counts)) or "none"
            return (f"the answer has {len(counts)} {_plural(len(counts), 'line')} "
                    f"(syllables {found}); the {shown} pattern needs {len(pattern)}")
        gaps = [f"line {i} has {got} {_plural(got, 'syllable')}, needs {want}"
                for i, (got, want) in enumerate(zip(counts, pattern, strict=True), 1)
                if got != want]
        return "; ".join(gaps) or None

    return check


def _mention_check(terms: list[str], *, plural: bool, negate: bool) -> Check:
    patterns = [(t, _word_pattern(t, plural=plural)) for t in terms]

    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        found = [t for t, p in patterns if p.search(answer)]
        if negate:
            return f"mentions: {', '.join(found)}" if found else None
        missing = [t for t, _ in patterns if t not in found]
        return f"missing: {', '.join(missing)}" if missing else None

    return check


def _run_check(name: str, value: Any, *, label: str = "") -> Check:
    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        outcome = run_check(answer, name, value)
        if outcome["ok"]:
            return None
        return _shorten(f"{label}{outcome.get('detail') or name + ' check failed'}")

    return check


def _call_tool(tool: BaseTool, value: str) -> dict[str, Any]:
    """Invoke a one-argument evidence tool and return its result dict."""
    names = list(tool.args)
    key = names[0] if len(names) == 1 else next(
        (n for n in ("code", "text", "json_text", "answer") if n in names), None
    )
    if key is None:
        msg = f"tool {tool.name!r} takes {names}; the rules grader needs one string argument"
        raise ValueError(msg)
    result = tool.invoke({key: value})
    if isinstance(result, str):
        with contextlib.suppress(json.JSONDecodeError):
            result = json.loads(result)
    if not isinstance(result, dict) or "ok" not in result:
        msg = f"tool {tool.name!r} returned {type(result).__name__}, not a dict with 'ok'"
        raise ValueError(msg)
    return result


def _tool_gap(name: str, result: Mapping[str, Any]) -> str:
    if result.get("error"):
        return _shorten(f"{name} could not run the answer: {result['error']}")
    failures = result.get("failures") or []
    if failures:
        listed = "; ".join(f"{f.get('name', '?')}: {f.get('reason', '')}" for f in failures)
        passed = result.get("passed")  # a list of test names (or a count, for other tools)
        count = len(passed) if isinstance(passed, list) else passed
        total = f" of {count + len(failures)}" if isinstance(count, int) else ""
        noun = "test" if len(failures) == 1 and not total else "tests"
        return _shorten(f"{len(failures)}{total} {noun} failed in {name} — {listed}")
    return _shorten(f"{name}: {result.get('detail') or 'failed without details'}")


def _tool_check(tool_name: str, *, code: bool) -> Check:
    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        tool = tools[tool_name]
        value = extract_python_code(answer) if code else embedded_json(answer)
        result = _call_tool(tool, value)
        return None if result["ok"] else _tool_gap(tool_name, result)

    return check


def _function_check(name: str, count: int | None, type_word: str | None) -> Check:
    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        try:
            module = ast.parse(extract_python_code(answer))
        except SyntaxError as exc:
            return f"the code does not parse: {exc.msg} (line {exc.lineno})"
        defs = [n for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        fn = next((d for d in defs if d.name == name), None)
        if fn is None:
            found = ", ".join(f"`{d.name}`" for d in defs) or "none"
            return f"no top-level function named `{name}` (functions found: {found})"
        params = [*fn.args.posonlyargs, *fn.args.args]
        if count is not None and (len(params) != count or fn.args.vararg):
            listed = ", ".join(a.arg for a in params) or "none"
            extra = " and *" + fn.args.vararg.arg if fn.args.vararg else ""
            return f"`{name}` takes {len(params)} parameters ({listed}{extra}), needs {count}"
        if type_word and count == 1 and params[0].annotation is not None:
            shown = ast.unparse(params[0].annotation)
            base = shown.split("[")[0].rsplit(".", 1)[-1].lower()
            if base != type_word and not (type_word == "list" and base == "sequence"):
                return f"parameter `{params[0].arg}` is annotated `{shown}`, not {type_word}"
        return None

    return check


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class _Rule:
    """A criterion shape: a core pattern, the filler allowed around it, and a check builder."""

    pattern: re.Pattern[str]
    filler: frozenset[str]
    build: Callable[[re.Match[str], frozenset[str]], Check | None]


def _rule(
    pattern: str, filler: frozenset[str]
) -> Callable[[Callable[[re.Match[str], frozenset[str]], Check | None]], _Rule]:
    def wrap(build: Callable[[re.Match[str], frozenset[str]], Check | None]) -> _Rule:
        return _Rule(re.compile(pattern, re.IGNORECASE), filler, build)

    return wrap


@_rule(_QUANTITY.pattern, _QUANTITY_FILLER)
def _quantity(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    return _quantity_check(m)


@_rule(_SYLLABLES.pattern, _SYLLABLE_FILLER)
def _syllables(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    text = m.string
    if "syllable" not in text.lower():
        rest = f"{text[: m.start()]} {text[m.end() :]}".lower().split()
        if not set(rest) <= _BARE_PATTERN_FILLER:
            return None
    return _syllable_check([int(n) for n in re.findall(r"\d+", m.group("pat"))])


@_rule(r"(?:is\s+)?(?:a\s+)?valid\s+json(?:\s+(?:object|document|value|text))?"
       r"|parses\s+as\s+(?:valid\s+)?json", _FILLER)
def _valid_json(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    return _run_check("valid_json", None)


@_rule(r"(?:validates|conforms|complies|is\s+valid)\s+(?:against|to|with)\s+(?:the\s+)?"
       r"(?:json\s+)?schema\s*:?\s*(?P<schema>`\{.*\}`|\{.*\})$", _SUBJECT)
def _inline_schema(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    try:
        schema = json.loads(m.group("schema").strip("`"))
    except json.JSONDecodeError:
        return None
    if not isinstance(schema, dict):
        return None
    check = _run_check("json_schema", schema)
    return lambda answer, tools: check(embedded_json(answer), tools)


@_rule(r"(?:validates|conforms|complies|is\s+valid)\s+(?:against|to|with)\s+(?:the\s+)?"
       r"(?:json\s+)?(?:schema\s+)?(?:(?:in|of|from|checked\s+by|given\s+by|provided\s+by)\s+"
       rf"(?:the\s+)?)?{_TOOL}$", _SUBJECT)
def _schema_tool(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    return _tool_check(m.group("tool"), code=False) if m.group("tool") in tools else None


@_rule(r"(?:all\s+(?:the\s+)?tests\s+pass(?:es)?\s+(?:in|with|under|using)\s+(?:the\s+)?"
       + _TOOL.replace("<tool>", "<t1>")
       + r"|pass(?:es)?\s+(?:all\s+)?(?:the\s+)?tests\s+(?:in|of|from)\s+(?:the\s+)?"
       + _TOOL.replace("<tool>", "<t2>")
       + r"|(?:all\s+)?(?:the\s+)?tests\s+(?:in|of|from)\s+"
       + _TOOL.replace("<tool>", "<t3>") + r"\s+pass)$", _CODE_FILLER)
def _tests_tool(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    name = m.group("t1") or m.group("t2") or m.group("t3")
    return _tool_check(name, code=True) if name in tools else None


@_rule(r"(?:function|method)\s+(?:is\s+)?(?:named|called)\s+`?(?P<name>[A-Za-z_]\w*)`?"
       r"(?:\s*,?\s*and\s+(?:it\s+)?(?:accepts|takes|has)\s+(?P<count>a\s+single|exactly\s+one|"
       r"only\s+one|one|single|\d|two|three|four)\s+(?:(?P<type>[a-z]+)\s+)?"
       r"(?:argument|parameter|arg|input)s?)?$", _CODE_FILLER)
def _function(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    raw = m.group("count")
    count = None
    if raw:
        word = raw.lower().split()[-1]
        count = 1 if word == "single" else int(word) if word.isdigit() else _NUMBER_WORDS[word]
    return _function_check(m.group("name"), count, m.group("type") and m.group("type").lower())


@_rule(rf"{_NEG}\s+(?:mentions?|refers?\s+to|(?:use|include|contain)s?\s+the\s+"
       r"(?:words?|terms?))\s+(?P<items>.+)$", _MENTION_FILLER)
def _not_mention(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    terms = _items(m.group("items"), max_plain_words=2)
    return _mention_check(terms, plural=True, negate=True) if terms else None


@_rule(rf"{_NEG}\s+contains?\s+(?P<items>.+)$", _MENTION_FILLER)
def _not_contains(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    terms = _items(m.group("items"), max_plain_words=1)
    return _all_checks([_run_check("not_contains", t) for t in terms]) if terms else None


@_rule(r"(?:includes?|uses?|contains?|has)\s+the\s+(?:exact\s+)?(?:words?|terms?|phrases?)\s+"
       r"(?P<items>.+)$", _MENTION_FILLER | _VERBS)
def _words(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    terms = _items(m.group("items"), max_plain_words=1)
    return _mention_check(terms, plural=False, negate=False) if terms else None


@_rule(r"(?:mentions?|references?|refers\s+to|names)\s+(?P<items>.+)$", _MENTION_FILLER)
def _mentions(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    terms = _items(m.group("items"), max_plain_words=2)
    return _mention_check(terms, plural=True, negate=False) if terms else None


@_rule(r"(?:theme|topic|subject)(?:\s+of\s+the\s+\w+)?\s+(?:is|should\s+be|must\s+be)\s+"
       r"(?:about\s+)?(?P<items>.+)$", _SUBJECT | {"main", "central"})
def _theme(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    terms = _items(m.group("items"), max_plain_words=2)
    return _mention_check(terms, plural=True, negate=False) if terms else None


@_rule(r"contains?\s+(?P<items>.+)$", _MENTION_FILLER | _VERBS)
def _contains(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    terms = _items(m.group("items"), max_plain_words=1)
    return _all_checks([_run_check("contains", t) for t in terms]) if terms else None


@_rule(r"matches\s+(?:the\s+)?(?:regex|regexp|regular\s+expression|pattern)?\s*"
       rf"(?P<re>/.+/(?P<flags>[imsx]*)|{_QUOTED})$", _FILLER)
def _regex(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    raw = m.group("re")
    if raw.startswith("/"):
        body = raw[1 : raw.rindex("/")]
        flags = m.group("flags")
        pattern = f"(?{flags}){body}" if flags else body
    else:
        pattern = _unquote(raw) or raw
    try:
        re.compile(pattern)
    except re.error:
        return None
    return _run_check("regex", pattern, label=f"does not match {raw}: ")


@_rule(rf"(?P<which>starts|begins|start|begin|ends|end)\s+with\s+(?P<val>{_QUOTED}|\S+)$",
       _FILLER)
def _affix(m: re.Match[str], tools: frozenset[str]) -> Check | None:
    raw = m.group("val")
    value = _unquote(raw)
    if value is None:
        # An unquoted lowercase word ("starts with capital") describes, it does not quote.
        if re.fullmatch(r"[a-z]+", raw):
            return None
        value = raw
    kind = "starts_with" if m.group("which").lower().startswith(("start", "begin")) else "ends_with"
    return _run_check(kind, value)


def _all_checks(checks: list[Check]) -> Check:
    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        gaps = [g for c in checks if (g := c(answer, tools))]
        return "; ".join(gaps) or None

    return check


_RULES: tuple[_Rule, ...] = (
    _quantity, _syllables, _valid_json, _inline_schema, _schema_tool, _tests_tool, _function,
    _not_mention, _not_contains, _words, _mentions, _theme, _contains, _regex, _affix,
)


def recognise(criterion: str, tool_names: Iterable[str] = ()) -> Check | None:
    """The check for a criterion, or None when no rule recognises it (first match wins)."""
    text = _clean(criterion)
    names = frozenset(tool_names)
    for rule in _RULES:
        for m in rule.pattern.finditer(text):
            if _only_filler(text, m, rule.filler) and (check := rule.build(m, names)):
                return check
    return None


# --------------------------------------------------------------------------- public helpers


def unrecognised_criteria(criteria: list[str], tool_names: Iterable[str] = ()) -> list[str]:
    """The criteria the rules grader cannot check (for the app's rubric lint).

    Args:
        criteria: Criteria as parsed from the rubric.
        tool_names: Names of the grader tools that will be bound.
    """
    names = frozenset(tool_names)
    return [c for c in criteria if recognise(c, names) is None]


def check_criterion(
    criterion: str, answer: str, tools: Mapping[str, BaseTool] | Sequence[BaseTool] = ()
) -> CriterionVerdict | None:
    """Grade one criterion with the rules.

    Args:
        criterion: The criterion as written in the rubric.
        answer: The text to grade.
        tools: Bound evidence tools, by name or as a list (needed by tool criteria).

    Returns:
        The verdict (with a gap when it fails), or None when the criterion is not recognised.
    """
    by_name = tools if isinstance(tools, Mapping) else {t.name: t for t in tools}
    check = recognise(criterion, by_name)
    if check is None:
        return None
    gap = check(answer, by_name)
    return {"name": criterion, "passed": True} if gap is None else {
        "name": criterion, "passed": False, "gap": gap}
