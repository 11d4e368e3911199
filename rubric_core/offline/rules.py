"""Criterion recognition for the offline graders: which phrasings the rules can check, and how.

`read` maps a criterion, as written in a rubric, to a `Reading`: a deterministic check built on
the evidence tools' pure functions, and what it checks in words (``lines == 3``, ``mentions any
of ['spring', 'cherry blossoms']``). `check_criterion` grades one criterion with it,
`unrecognised_criteria` lists the ones no rule reads, and `partial_reading` says what the rules
read of a criterion that joins several checks (for the rubric lint). A criterion that is not
read whole is never guessed. The chat models that use these rules, `RulesGrader` and
`HybridGrader`, live in `rubric_core.offline.graders`.

Why one module of about 800 lines: it is one table of phrasings and the checks they read as,
and a rule's pattern, its check and its words must be read (and reviewed) together.

Recognised criteria (case-insensitive; a trailing period is ignored; a value may be quoted with
`` `...` ``, ``"..."`` or ``'...'`` and must be quoted when it is more than a plain word or two):

========================================  ===================================================
Criterion (examples)                      Check
========================================  ===================================================
The poem has three lines / exactly 3      count of lines, words, sentences or characters;
lines / is three lines long / The answer  comparators: exactly, at most, no more than, up
is one sentence / a single sentence / at  to, under, fewer than, at least, more than, over,
most 50 words / under 200 characters /    "... or fewer", "... or more", "does not exceed",
50 words or fewer / at most fifty words   "no longer than", "shorter than"; a number as
/ twenty-five words / a hundred words     digits (1,000 too) or words up to ninety-nine,
                                          and "a hundred"
Lines follow a 5-7-5 syllable pattern /   syllables per line, and the number of lines
syllables 5/7/5 / 5-7-5
mentions X and Y / both X and Y / all of  all terms appear as words, plural allowed ("a",
X, Y / mentions a cat / The theme is      "an", "the" before a term are dropped: "a cat"
spring (= mentions spring)                matches "cat" and "cats"); a term's last word
                                          matches its -s/-ed/-ing forms (`inflections`:
                                          "programming" matches "programmed", "programs")
mentions X or Y / either X or Y / X, Y    at least one term appears ("and/or" too)
or Z / at least one of (any of) X, Y
mentions neither X nor Y                  none of the terms appears
includes the word X / uses the words X    each term (or one, with "or") appears as a word
contains X / does not contain X           substring, case-insensitive (``run_check``)
does not mention X / never mentions X /   none of the terms appears as a word
does not mention X or Y (any of, nor)
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
examples") is not recognised. A list of terms is read only when the way it joins is exact: a
bare "X, Y", "X and Y or Z", "one of X or Y" and a negated "and" ("does not mention X and Y":
neither? not both?) are declined, and so are vague terms ("mentions a lot", "key points") and a
second predicate ("mentions spring and is cheerful"). The phrasings pinned in
``tests/rules_phrasings.py`` are the reference.

TOOL criteria are recognised only when a tool of that name is bound; such tools take one string
argument and return a dict with ``ok`` (and ``failures``, ``error`` or ``detail`` explaining a
failure). `rubric_core.tools.json_schema_tool` builds one for a schema.
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.tools import BaseTool

from rubric_core.tools.checks import embedded_json, run_check
from rubric_core.tools.fences import extract_python_code
from rubric_core.tools.text import text_stats_data

if TYPE_CHECKING:
    from rubric_core.types import CriterionVerdict

_GAP_LIMIT = 600

Mode = Literal["all", "any", "none"]
"""How a criterion's terms combine: all must appear, at least one, or none."""

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
    "its their they his her not no both either neither nor or and also something things thing "
    # vague amounts and qualities: "mentions a lot", "mentions key points" name no term
    "lot lots bit couple variety range number numbers kind kinds type types sort specific "
    "particular concrete relevant real key important main appropriate suitable proper correct "
    "good various different same such anything everything nothing word words term terms "
    "phrase phrases clear unclear obvious evident apparent consistent coherent present "
    # a word about how or where a term appears ("mentions spring twice"), not part of it
    "only just mainly mostly briefly explicitly clearly even too again once twice often "
    "first last early "
    # a verb starts a second predicate ("mentions spring and is cheerful"), not a term
    "is are was were be been being has have had does do did should must can could will would "
    "may might shall rhymes explains describes uses includes contains mentions avoids follows "
    "lists cites gives provides answers addresses stays remains sounds feels reads flows"
)

_UNIT_WORDS = _word_list(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
)
_TENS_WORDS = {w: 10 * i for i, w in enumerate(
    _word_list("twenty thirty forty fifty sixty seventy eighty ninety"), 2)}
_NUMBER_WORDS = {**{w: i for i, w in enumerate(_UNIT_WORDS)}, **_TENS_WORDS}
_NUMBER = (
    r"(?P<num>\d{1,3}(?:,\d{3})+|\d+|a\s+single|single|(?:a|one)\s+hundred|"
    rf"(?:{'|'.join(_TENS_WORDS)})(?:[-\s](?:{'|'.join(_UNIT_WORDS[1:10])}))?|"
    + "|".join(_UNIT_WORDS) + ")"
)
_BEFORE = (
    r"(?P<cmp>exactly|precisely|just|only|at\s+most|(?:no|not)\s+more\s+than|up\s+to|"
    r"(?:a\s+)?max(?:imum)?(?:\s+of)?|at\s+least|(?:no|not)\s+(?:fewer|less)\s+than|"
    r"(?:a\s+)?min(?:imum)?(?:\s+of)?|under|below|fewer\s+than|less\s+than|over|above|"
    r"more\s+than|within|(?:does|do|must|should|will)\s+not\s+exceed|(?:doesn't|don't|"
    r"cannot|can't|won't)\s+exceed|not\s+exceeding|(?:no|not)\s+longer\s+than|"
    r"shorter\s+than|longer\s+than)"
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
    r"\s*(?P<article>(?:a|an|the)\s+)?"
    r"(?:`(?P<bt>[^`]+)`|\"(?P<dq>[^\"]+)\"|“(?P<cq>[^”]+)”|'(?P<sq>[^']+)'|"
    r"(?P<plain>[^,&`\"“]+?))\s*(?P<sep>,\s*(?:(?:and/or|and|or|nor)\s+)?|&\s*|"
    r"\s(?:and/or|and|or|nor)\s+|$)",
    re.IGNORECASE,
)
_LIST_PREFIX = re.compile(
    r"^(?:(?P<both>both)|(?P<either>either)|(?P<neither>neither)|"
    r"(?P<any>(?:at\s+least\s+one|any|one\s+or\s+more)\s+of)|(?P<all>all\s+of))\s+",
    re.IGNORECASE,
)
# A list's opening word: the joiners it allows (exactly, or any subset) and how terms combine.
_PREFIX_MODES: dict[str, tuple[frozenset[str], bool, Mode]] = {
    "both": (frozenset({"and"}), True, "all"),
    "either": (frozenset({"or"}), True, "any"),
    "neither": (frozenset({"nor"}), True, "none"),
    "any": (frozenset({"and", "or"}), False, "any"),
    "all": (frozenset({"and"}), False, "all"),
}
_SEPARATOR = {",": ",", "&": "and", "and": "and", "or": "or", "and/or": "or", "nor": "nor"}
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


def _terms(
    text: str, *, max_plain_words: int, articles: bool = True
) -> tuple[list[str], set[str]] | None:
    """Split "X, Y and Z" into terms and the joiners used (",", "and", "or", "nor").

    An article before a term ("mentions a cat") is not part of it; where `articles` is false
    ("contains a table") it describes rather than quotes, and the list is declined.
    """
    items: list[str] = []
    joiners: set[str] = set()
    pos, sep = 0, ""
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            return None
        pos = m.end()
        if m.group("article") and not articles:
            return None
        sep = _SPACES.sub(" ", m.group("sep")).strip().lower()
        if sep == "," and joiners - {","}:
            return None  # "X and Y, told gently": a comma after the last joiner starts a clause
        if sep:
            joiners.add(_SEPARATOR[sep.lstrip(", ") or ","])
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
    if not items or sep not in ("", ","):  # "mentions X and": the list stops mid-way
        return None
    return items, joiners


def _items(
    text: str, *, max_plain_words: int, negated: bool = False, articles: bool = True
) -> tuple[list[str], Mode] | None:
    """The terms of "X, Y and Z" and how they combine; None when that is not exact.

    "X and Y" / "both X and Y" / "all of X, Y" need all; "X or Y" / "either X or Y" / "at
    least one of X, Y" need any; "neither X nor Y" needs none. Under a negation ("does not
    mention X or Y") any becomes none; a negated "and" (none? not both?) and a bare "X, Y"
    list are ambiguous, and declined.
    """
    text = text.strip()
    prefix = _LIST_PREFIX.match(text)
    kind = prefix.lastgroup if prefix else None
    parsed = _terms(text[prefix.end() :] if prefix else text, max_plain_words=max_plain_words,
                    articles=articles)
    if parsed is None:
        return None
    items, joiners = parsed
    conj = joiners - {","}
    several = len(items) > 1
    mode: Mode | None
    if kind is None:
        mode = ("all" if not several or conj == {"and"}
                else "any" if conj == {"or"} or (negated and conj == {"nor"}) else None)
    else:
        joined, exact, mode = _PREFIX_MODES[kind]
        if (negated and kind == "neither") or not (
            conj == joined and several if exact else conj <= joined
        ):
            return None
    if mode is None:
        return None
    if negated:
        if several and mode == "all":
            return None
        mode = "none"
    return items, mode


_VOWELS = frozenset("aeiouy")
_MIN_STEM = 5
"""Shortest stem an -ing or -ed ending is taken off (with a doubled last consonant, 3 letters
after undoubling): "evening" keeps its "ing", so it never matches "even"."""


def _stem(word: str) -> str:
    """The stem of an -ing or -ed form, or the word itself when it is not clearly one.

    "programming" → "program", "painted" → "paint"; "spring", "evening", "bed" stay whole.
    """
    lower = word.lower()
    for ending in ("ing", "ed"):
        if not lower.endswith(ending):
            continue
        stem = lower[: -len(ending)]
        if len(stem) >= 4 and stem[-1] == stem[-2] and stem[-1] not in _VOWELS | {"l", "s"}:
            return stem[:-1]  # programm-ing → program, plann-ed → plan
        if len(stem) >= _MIN_STEM and _VOWELS & set(stem):
            return stem
    return lower


def inflections(word: str) -> tuple[str, ...]:
    """The forms a ``mentions`` term's last word matches: plural and -ed/-ing inflections.

    A careful, documented rule, not a stemmer: "programming" matches program, programs,
    programmed and programming (not "programmer": another word); "rain" matches rains, rained
    and raining (not "rainbow"); "code" coded and coding; "study" studies and studied. An
    -ing or -ed is taken off only when a clear stem is left (`_stem`): "evening" never
    matches "even", nor "spring" "spr".
    """
    stem = _stem(word)
    forms = {word.lower(), stem, stem + "s", stem + "es", stem + "ed", stem + "ing"}
    if stem.endswith("e"):
        forms |= {stem + "d", stem[:-1] + "ing"}
    elif len(stem) >= 3 and stem[-1] not in _VOWELS | {"w", "x"} and stem[-2] in _VOWELS and (
            stem[-3] not in _VOWELS):
        forms |= {stem + stem[-1] + "ed", stem + stem[-1] + "ing"}  # plan → planned
    if stem.endswith("y") and len(stem) > 2 and stem[-2] not in _VOWELS:
        forms |= {stem[:-1] + "ies", stem[:-1] + "ied"}
    return tuple(sorted(forms, key=lambda f: (-len(f), f)))


def _word_pattern(term: str, *, plural: bool) -> re.Pattern[str]:
    words = term.split()
    head = "".join(re.escape(w) + r"\s+" for w in words[:-1])
    if plural:  # ``mentions``: the last word's inflections too
        last = "(?:" + "|".join(re.escape(f) for f in inflections(words[-1])) + ")"
    else:
        last = re.escape(words[-1])
    return re.compile(rf"(?<!\w){head}{last}(?!\w)", re.IGNORECASE)


def _plural(n: int, unit: str) -> str:
    return unit if n == 1 else f"{unit}s"


def _shorten(text: str) -> str:
    text = _SPACES.sub(" ", text).strip()
    return text if len(text) <= _GAP_LIMIT else text[: _GAP_LIMIT - 1] + "…"


# --------------------------------------------------------------------------- checks

Check = Callable[[str, Mapping[str, BaseTool]], str | None]
"""A recognised criterion: given the answer and the bound tools, the gap, or None if it passes."""


@dataclass(frozen=True)
class Reading:
    """How the rules read one criterion: the check, and what it checks in words."""

    text: str
    """What is checked, e.g. ``lines == 3`` or ``mentions any of ['spring', 'rain']``."""
    check: Check
    """The check itself: answer and bound tools in, the gap (None when it passes) out."""


_UNITS = {"line": "lines", "word": "words", "sentence": "sentences", "character": "characters",
          "char": "characters"}
_CMP_TEXT = {"eq": "exactly", "le": "at most", "lt": "fewer than", "ge": "at least",
             "gt": "more than"}
_CMP_SIGN = {"eq": "==", "le": "<=", "lt": "<", "ge": ">=", "gt": ">"}


def _comparator(before: str | None, after: str | None) -> str:
    for phrase in (p.lower() for p in (before, after) if p):
        if re.search(r"exceed|most|up to|max|within|(?:no|not) (?:more|longer)|or (?:fewer|less)",
                     phrase):
            return "le"
        if re.search(r"least|min|no (?:fewer|less)|not (?:fewer|less)|or (?:more|above)", phrase):
            return "ge"
        if re.search(r"under|below|fewer|less|shorter|or (?:under|below)", phrase):
            return "lt"
        if re.search(r"over|above|more than|longer than", phrase):
            return "gt"
    return "eq"


def _number(raw: str) -> int:
    """The value of a count as written: "3", "1,000", "three", "twenty-five", "a single"."""
    words = re.split(r"[-\s]+", raw.lower().replace(",", ""))
    if words[0].isdigit():
        return int(words[0])
    if words[-1] == "hundred":
        return 100
    return sum(_NUMBER_WORDS.get(w, 0) for w in words) if words[-1] != "single" else 1


def _quantity_reading(m: re.Match[str]) -> Reading:
    n = _number(m.group("num"))
    unit = m.group("unit").lower().rstrip("s")
    key = _UNITS[unit]
    cmp = _comparator(m.group("cmp"), m.group("after"))
    ok: Callable[[int, int], bool] = {
        "eq": operator.eq, "le": operator.le, "lt": operator.lt, "ge": operator.ge,
        "gt": operator.gt}[cmp]
    noun = "character" if unit == "char" else unit

    def check(answer: str, _tools: Mapping[str, BaseTool]) -> str | None:
        actual = int(text_stats_data(answer)[key])
        if ok(actual, n):
            return None
        return f"the answer has {actual} {_plural(actual, noun)}, needs {_CMP_TEXT[cmp]} {n}"

    return Reading(f"{key} {_CMP_SIGN[cmp]} {n}", check)


def _syllable_check(pattern: list[int]) -> Check:
    shown = "-".join(map(str, pattern))

    def check(answer: str, _tools: Mapping[str, BaseTool]) -> str | None:
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


def _mention_check(terms: list[str], *, plural: bool, mode: Mode) -> Check:
    patterns = [(t, _word_pattern(t, plural=plural)) for t in terms]

    def check(answer: str, _tools: Mapping[str, BaseTool]) -> str | None:
        found = [t for t, p in patterns if p.search(answer)]
        if mode == "none":
            return f"mentions: {', '.join(found)}" if found else None
        if mode == "any":
            return None if found else f"missing: {', '.join(terms)} (needs at least one)"
        missing = [t for t, _ in patterns if t not in found]
        return f"missing: {', '.join(missing)}" if missing else None

    return check


def _contains_check(terms: list[str], mode: Mode) -> Check:
    checks = [_run_check("not_contains" if mode == "none" else "contains", t) for t in terms]
    if mode != "any":
        return _all_checks(checks)

    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        if any(c(answer, tools) is None for c in checks):
            return None
        return _shorten(f"contains none of: {', '.join(map(repr, terms))} (needs at least one)")

    return check


_TERM_KINDS = {"mentions": "mentions", "words": "exact words", "contains": "contains"}


def _terms_reading(kind: str, parsed: tuple[list[str], Mode] | None) -> Reading | None:
    """A term criterion's reading: ``mentions``, ``words`` or ``contains``.

    ``mentions`` matches words (plural allowed), ``words`` exact words, ``contains`` substrings.
    """
    if parsed is None:
        return None
    terms, mode = parsed
    quantifier = "" if len(terms) == 1 and mode != "none" else f"{mode} of "
    check = (_contains_check(terms, mode) if kind == "contains"
             else _mention_check(terms, plural=kind == "mentions", mode=mode))
    return Reading(f"{_TERM_KINDS[kind]} {quantifier}{terms!r}", check)


def _run_check(name: str, value: Any, *, label: str = "") -> Check:
    def check(answer: str, _tools: Mapping[str, BaseTool]) -> str | None:
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
    def check(answer: str, _tools: Mapping[str, BaseTool]) -> str | None:
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


Build = Callable[[re.Match[str], frozenset[str]], Reading | None]


@dataclass(frozen=True)
class _Rule:
    """A criterion shape: a core pattern, the filler allowed around it, and a reading builder."""

    pattern: re.Pattern[str]
    filler: frozenset[str]
    build: Build


def _rule(pattern: str, filler: frozenset[str]) -> Callable[[Build], _Rule]:
    def wrap(build: Build) -> _Rule:
        return _Rule(re.compile(pattern, re.IGNORECASE), filler, build)

    return wrap


@_rule(_QUANTITY.pattern, _QUANTITY_FILLER)
def _quantity(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _quantity_reading(m)


@_rule(_SYLLABLES.pattern, _SYLLABLE_FILLER)
def _syllables(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    text = m.string
    if "syllable" not in text.lower():
        rest = f"{text[: m.start()]} {text[m.end() :]}".lower().split()
        if not set(rest) <= _BARE_PATTERN_FILLER:
            return None
    pattern = [int(n) for n in re.findall(r"\d+", m.group("pat"))]
    return Reading(f"syllables {'-'.join(map(str, pattern))}", _syllable_check(pattern))


@_rule(r"(?:is\s+)?(?:a\s+)?valid\s+json(?:\s+(?:object|document|value|text))?"
       r"|parses\s+as\s+(?:valid\s+)?json", _FILLER)
def _valid_json(_m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return Reading("valid JSON", _run_check("valid_json", None))


@_rule(r"(?:validates|conforms|complies|is\s+valid)\s+(?:against|to|with)\s+(?:the\s+)?"
       r"(?:json\s+)?schema\s*:?\s*(?P<schema>`\{.*\}`|\{.*\})$", _SUBJECT)
def _inline_schema(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    try:
        schema = json.loads(m.group("schema").strip("`"))
    except json.JSONDecodeError:
        return None
    if not isinstance(schema, dict):
        return None
    check = _run_check("json_schema", schema)
    return Reading(f"JSON schema {json.dumps(schema)}",
                   lambda answer, tools: check(embedded_json(answer), tools))


@_rule(r"(?:validates|conforms|complies|is\s+valid)\s+(?:against|to|with)\s+(?:the\s+)?"
       r"(?:json\s+)?(?:schema\s+)?(?:(?:in|of|from|checked\s+by|given\s+by|provided\s+by)\s+"
       rf"(?:the\s+)?)?{_TOOL}$", _SUBJECT)
def _schema_tool(m: re.Match[str], tools: frozenset[str]) -> Reading | None:
    name = m.group("tool")
    return Reading(f"schema tool {name}", _tool_check(name, code=False)) if name in tools else None


@_rule(r"(?:all\s+(?:the\s+)?tests\s+pass(?:es)?\s+(?:in|with|under|using)\s+(?:the\s+)?"
       + _TOOL.replace("<tool>", "<t1>")
       + r"|pass(?:es)?\s+(?:all\s+)?(?:the\s+)?tests\s+(?:in|of|from)\s+(?:the\s+)?"
       + _TOOL.replace("<tool>", "<t2>")
       + r"|(?:all\s+)?(?:the\s+)?tests\s+(?:in|of|from)\s+"
       + _TOOL.replace("<tool>", "<t3>") + r"\s+pass)$", _CODE_FILLER)
def _tests_tool(m: re.Match[str], tools: frozenset[str]) -> Reading | None:
    name = m.group("t1") or m.group("t2") or m.group("t3")
    return Reading(f"tests tool {name}", _tool_check(name, code=True)) if name in tools else None


@_rule(r"(?:function|method)\s+(?:is\s+)?(?:named|called)\s+`?(?P<name>[A-Za-z_]\w*)`?"
       r"(?:\s*,?\s*and\s+(?:it\s+)?(?:accepts|takes|has)\s+(?P<count>a\s+single|exactly\s+one|"
       r"only\s+one|one|single|\d|two|three|four)\s+(?:(?P<type>[a-z]+)\s+)?"
       r"(?:argument|parameter|arg|input)s?)?$", _CODE_FILLER)
def _function(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    raw = m.group("count")
    count = None
    if raw:
        word = raw.lower().split()[-1]
        count = 1 if word == "single" else int(word) if word.isdigit() else _NUMBER_WORDS[word]
    type_word = m.group("type") and m.group("type").lower()
    name = m.group("name")
    text = f"function {name}"
    if count is not None:
        text += f" with {count} {type_word + ' ' if type_word else ''}{_plural(count, 'parameter')}"
    return Reading(text, _function_check(name, count, type_word))


@_rule(rf"{_NEG}\s+(?:mentions?|refers?\s+to|(?:use|include|contain)s?\s+the\s+"
       r"(?:words?|terms?))\s+(?P<items>.+)$", _MENTION_FILLER)
def _not_mention(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _terms_reading("mentions", _items(m.group("items"), max_plain_words=2, negated=True))


@_rule(rf"{_NEG}\s+contains?\s+(?P<items>.+)$", _MENTION_FILLER)
def _not_contains(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _terms_reading("contains", _items(m.group("items"), max_plain_words=1, negated=True,
                                                 articles=False))


@_rule(r"(?:includes?|uses?|contains?|has)\s+the\s+(?:exact\s+)?(?:words?|terms?|phrases?)\s+"
       r"(?P<items>.+)$", _MENTION_FILLER | _VERBS)
def _words(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _terms_reading("words", _items(m.group("items"), max_plain_words=1, articles=False))


@_rule(r"(?:mentions?|references?|refers\s+to|names)\s+(?P<items>.+)$", _MENTION_FILLER)
def _mentions(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _terms_reading("mentions", _items(m.group("items"), max_plain_words=2))


@_rule(r"(?:theme|topic|subject)(?:\s+of\s+the\s+\w+)?\s+(?:is|should\s+be|must\s+be)\s+"
       r"(?:about\s+)?(?P<items>.+)$", _SUBJECT | {"main", "central"})
def _theme(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _terms_reading("mentions", _items(m.group("items"), max_plain_words=2))


@_rule(r"contains?\s+(?P<items>.+)$", _MENTION_FILLER | _VERBS)
def _contains(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    return _terms_reading("contains", _items(m.group("items"), max_plain_words=1,
                                             articles=False))


@_rule(r"matches\s+(?:the\s+)?(?:regex|regexp|regular\s+expression|pattern)?\s*"
       rf"(?P<re>/.+/(?P<flags>[imsx]*)|{_QUOTED})$", _FILLER)
def _regex(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
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
    return Reading(f"matches regex {pattern!r}",
                   _run_check("regex", pattern, label=f"does not match {raw}: "))


@_rule(rf"(?P<which>starts|begins|start|begin|ends|end)\s+with\s+(?P<val>{_QUOTED}|\S+)$",
       _FILLER)
def _affix(m: re.Match[str], _tools: frozenset[str]) -> Reading | None:
    raw = m.group("val")
    value = _unquote(raw)
    if value is None:
        # An unquoted lowercase word ("starts with capital") describes, it does not quote.
        if re.fullmatch(r"[a-z]+", raw):
            return None
        value = raw
    kind = "starts_with" if m.group("which").lower().startswith(("start", "begin")) else "ends_with"
    return Reading(f"{kind.replace('_', ' ')} {value!r}", _run_check(kind, value))


def _all_checks(checks: list[Check]) -> Check:
    def check(answer: str, tools: Mapping[str, BaseTool]) -> str | None:
        gaps = [g for c in checks if (g := c(answer, tools))]
        return "; ".join(gaps) or None

    return check


_RULES: tuple[_Rule, ...] = (
    _quantity, _syllables, _valid_json, _inline_schema, _schema_tool, _tests_tool, _function,
    _not_mention, _not_contains, _words, _mentions, _theme, _contains, _regex, _affix,
)
_JOINT = re.compile(
    r",?\s+(?:and\s+also|and\s+then|as\s+well\s+as|and|but|while)\s+|\s*;\s*|,\s+",
    re.IGNORECASE,
)
_MAX_PARTS = 8


def _read(text: str, names: frozenset[str]) -> Reading | None:
    for rule in _RULES:
        for m in rule.pattern.finditer(text):
            if _only_filler(text, m, rule.filler) and (reading := rule.build(m, names)):
                return reading
    return None


def read(criterion: str, tool_names: Iterable[str] = ()) -> Reading | None:
    """How the rules read a criterion, or None when no rule reads all of it (first match wins).

    Args:
        criterion: The criterion as written in the rubric.
        tool_names: Names of the grader tools that will be bound (tool criteria need them).
    """
    return _read(_clean(criterion), frozenset(tool_names))


def recognise(criterion: str, tool_names: Iterable[str] = ()) -> Check | None:
    """The check for a criterion, or None when no rule recognises it (first match wins)."""
    reading = read(criterion, tool_names)
    return reading.check if reading else None


def partial_reading(
    criterion: str, tool_names: Iterable[str] = ()
) -> tuple[list[Reading], list[str]] | None:
    """What the rules can read of a criterion they cannot read whole (for the rubric lint).

    The criterion is cut at "and", "but", commas and semicolons (outside quotes); from the left,
    the longest run of parts the rules read is taken each time.

    Returns:
        The readings of the parts that are read and the text of the parts that are not (empty
        when every part is read: several checks joined), or None when the rules read the whole
        criterion or none of its parts.
    """
    text = _clean(criterion)
    names = frozenset(tool_names)
    if _read(text, names):
        return None
    quoted = [q.span() for q in re.finditer(_QUOTED, text)]
    cuts = [c for c in _JOINT.finditer(text) if not any(a <= c.start() < b for a, b in quoted)]
    if not cuts or len(cuts) >= _MAX_PARTS:
        return None
    starts = [0, *(c.end() for c in cuts)]
    ends = [*(c.start() for c in cuts), len(text)]
    readings: list[Reading] = []
    unread: list[str] = []
    i, pending = 0, -1
    while i < len(starts):
        found = next(((j, r) for j in range(len(starts), i, -1)
                      if (r := _read(text[starts[i] : ends[j - 1]], names))), None)
        if found is None:
            pending = i if pending < 0 else pending
            i += 1
            continue
        if pending >= 0:
            unread.append(text[starts[pending] : ends[i - 1]])
            pending = -1
        readings.append(found[1])
        i = found[0]
    if pending >= 0:
        unread.append(text[starts[pending] :])
    if any(_terms(part, max_plain_words=2) for part in unread):
        return None  # a cut inside a list of terms ("X and Y or Z"): not a second check
    return (readings, unread) if readings else None


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
