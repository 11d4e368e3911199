"""`DemoWorker`: an offline worker model that answers the bundled examples, flaws first.

It needs no key and no network, so the examples run end to end on a fresh machine and the
rubric loop can be watched live. For each bundled example it knows a few *flaws*; the first
draft has all of them, and each revision fixes the flaws whose criteria the grader's feedback
names as failing. Everything is computed from the conversation it is given (never from a call
count), so the same conversation always gets the same answer.

How a conversation is read:

- the prompt is the latest human message that is not a revision turn; it picks the example
  (exact text first, then keywords such as "haiku" or "photosynthesis"), or a row of the
  bundled dataset (`rubric_core.offline.demo_dataset`, exact text), whose parts are fixed by
  the exact names of its rubric's failing criteria;
- revision turns are human messages named ``rubric_grader`` (or with
  ``additional_kwargs["lc_source"] == "rubric_grader"``) after that prompt; in each, the lines
  under ``Failing criteria:`` (``- <criterion>: <gap>``) name what to fix. A line's criterion is
  matched to a flaw by its exact name in the example's rubric, else by keywords (in the name,
  then in the gap); without that header, the text outside ``Passing criteria`` is scanned for
  keywords;
- the answer fixes every flaw named in any revision turn so far, so a revision never undoes an
  earlier fix and the passing parts stay as they were.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import Field
from typing_extensions import override

from rubric_core.examples import EXAMPLES
from rubric_core.grader import message_text
from rubric_core.offline.demo_dataset import demo_row_for
from rubric_core.rubric import normalize_name, parse_criteria
from rubric_core.types import REVISION_SOURCE

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from langchain_core.callbacks import CallbackManagerForLLMRun


@dataclass(frozen=True)
class _Flaw:
    """A flaw of a first draft, fixed when the criterion it breaks is reported failing."""

    key: str
    """Identifies the flaw inside its script."""
    criterion: int
    """Index of the criterion it breaks in the example's rubric."""
    keywords: tuple[str, ...]
    """Lowercase words that identify that criterion when its wording differs."""


@dataclass(frozen=True)
class _Script:
    """What the demo worker knows about one example."""

    flaws: tuple[_Flaw, ...]
    """Flaws of the first draft."""
    compose: Callable[[frozenset[str]], str]
    """The answer with the given flaws fixed."""
    keywords: tuple[str, ...]
    """Lowercase words that all appear in a prompt about this example."""


# --------------------------------------------------------------------------- the answers


def _haiku(fixed: frozenset[str]) -> str:
    first = "Spring rain on the hill" if "theme" in fixed else "Soft rain on the hill"
    second = "green buds open in warm light" if "syllables" in fixed else (
        "green buds open in the warm light")
    return f"{first}\n{second}\nbirds sing by the pond"


def _photosynthesis(fixed: frozenset[str]) -> str:
    head = (
        "Photosynthesis is the process by which plants use chlorophyll to capture light energy "
        "and turn water and carbon dioxide into glucose"
        if "chlorophyll" in fixed
        else "Photosynthesis is the process by which plants use light energy to turn water and "
        "carbon dioxide into glucose"
    )
    tail = ", releasing oxygen as a by-product." if "one_sentence" in fixed else (
        ". Oxygen is released as a by-product.")
    return head + tail


_DUPLICATES_DRAFT = '''\
def find_duplicates(lst):
    """Return the elements that appear more than once, in the order they repeat."""
    seen = set()
    duplicates = []
    for item in lst:
        if item in seen and item not in duplicates:
            duplicates.append(item)
        seen.add(item)
    return duplicates'''

_DUPLICATES_FIXED = '''\
def find_duplicates(lst):
    """Return the elements that appear more than once, in the order they repeat."""
    seen = []  # a list, not a set: items such as lists are unhashable
    duplicates = []
    for item in lst:
        if item in seen:
            if item not in duplicates:
                duplicates.append(item)
        else:
            seen.append(item)
    return duplicates'''


def _find_duplicates(fixed: frozenset[str]) -> str:
    if "unhashable" in fixed:
        intro = ("Here is `find_duplicates`, revised to compare items with `==` so that "
                 "unhashable items such as lists work too:")
        code = _DUPLICATES_FIXED
        outro = ("Membership tests on a list make it O(n²), which is fine for the list sizes "
                 "this is meant for.")
    else:
        intro = "Here is `find_duplicates`:"
        code = _DUPLICATES_DRAFT
        outro = "A set keeps the membership tests fast, so this runs in linear time."
    return f"{intro}\n\n```python\n{code}\n```\n\n{outro}"


def _json_product(fixed: frozenset[str]) -> str:
    price = '"price": 24.99,\n  "currency": "EUR",' if "schema" in fixed else '"price": "24.99",'
    record = (
        "{\n"
        '  "name": "Trailhead Insulated Water Bottle",\n'
        '  "sku": "TH-BTL-750",\n'
        f"  {price}\n"
        '  "in_stock": true,\n'
        '  "tags": ["outdoor", "stainless steel", "750 ml"]\n'
        "}"
    )
    if "json_only" in fixed:
        return record
    return f"Here is the product record:\n\n```json\n{record}\n```"


_SCRIPTS: dict[str, _Script] = {
    "haiku": _Script(
        flaws=(
            _Flaw("syllables", 1, ("syllable", "5-7-5", "5/7/5")),
            _Flaw("theme", 2, ("spring", "theme")),
        ),
        compose=_haiku,
        keywords=("haiku",),
    ),
    "photosynthesis": _Script(
        flaws=(
            _Flaw("one_sentence", 0, ("sentence",)),
            _Flaw("chlorophyll", 1, ("chlorophyll", "mention")),
        ),
        compose=_photosynthesis,
        keywords=("photosynthesis",),
    ),
    "find_duplicates": _Script(
        flaws=(_Flaw("unhashable", 0, ("test", "unhashable")),),
        compose=_find_duplicates,
        keywords=("find_duplicates",),
    ),
    "json_product": _Script(
        flaws=(
            _Flaw("json_only", 0, ("valid json", "parse")),
            _Flaw("schema", 1, ("schema", "price", "currency")),
        ),
        compose=_json_product,
        keywords=("json", "product"),
    ),
}


def _unknown_prompt() -> str:
    names = ", ".join(sorted(_SCRIPTS))
    return (
        "I am Rubric Studio's offline demo model: I need no network, and I can only answer "
        f"the bundled examples ({names}). Load one of them, or choose a real model such as "
        "'openai:gpt-4.1-mini' for your own prompt."
    )


# --------------------------------------------------------------------------- reading the chat


def _is_revision(message: BaseMessage) -> bool:
    return isinstance(message, HumanMessage) and (
        message.name == REVISION_SOURCE
        or message.additional_kwargs.get("lc_source") == REVISION_SOURCE
    )


def _split_conversation(messages: Sequence[BaseMessage]) -> tuple[str, list[str]]:
    """The latest user prompt and the texts of the revision turns after it."""
    prompt, feedback = "", []
    for message in messages:
        if _is_revision(message):
            feedback.append(message_text(message))
        elif isinstance(message, HumanMessage):
            prompt, feedback = message_text(message), []
    return prompt, feedback


def _script_for(prompt: str) -> tuple[str, _Script] | None:
    squeezed = " ".join(prompt.split())
    for name, example in EXAMPLES.items():
        if name in _SCRIPTS and " ".join(example.prompt.split()) == squeezed:
            return name, _SCRIPTS[name]
    lowered = squeezed.lower()
    for name, script in _SCRIPTS.items():
        if all(k in lowered for k in script.keywords):
            return name, script
    return None


def _failing_entries(feedback: str) -> list[str] | None:
    """The ``- criterion: gap`` lines under "Failing criteria:"; None without that header."""
    entries: list[str] = []
    section: str | None = None
    found = False
    for line in feedback.splitlines():
        stripped = line.strip()
        lowered = stripped.lower()
        if lowered.startswith("failing criteria"):
            section, found = "failing", True
        elif lowered.startswith("passing criteria"):
            section = "passing"
        elif section == "failing" and re.match(r"[-*•]\s", stripped):
            entries.append(stripped[2:].strip())
        elif section == "failing" and stripped and entries:
            entries[-1] = f"{entries[-1]} {stripped}"  # a gap that runs over several lines
        elif not stripped:
            section = None
    return entries if found else None


def _flaws_named(feedback: str, name: str, script: _Script) -> set[str]:
    """Keys of the flaws whose criteria `feedback` reports as failing."""
    criteria = [normalize_name(c) for c in parse_criteria(EXAMPLES[name].rubric)]
    entries = _failing_entries(feedback)
    if entries is None:
        kept = re.split(r"(?im)^\s*passing criteria", feedback)[0].lower()
        return {f.key for f in script.flaws if any(k in kept for k in f.keywords)}
    named: set[str] = set()
    for entry in entries:
        criterion = normalize_name(entry.partition(": ")[0])
        exact = {f.key for f in script.flaws
                 if f.criterion < len(criteria) and criteria[f.criterion] == criterion}
        by_name = {f.key for f in script.flaws if any(k in criterion for k in f.keywords)}
        by_line = {f.key for f in script.flaws if any(k in entry.lower() for k in f.keywords)}
        named |= exact or by_name or by_line
    return named


def _row_fixes(feedback: str, rubric: str) -> set[int]:
    """0-based indexes of the row's criteria that `feedback` reports as failing."""
    criteria = [normalize_name(c) for c in parse_criteria(rubric)]
    entries = _failing_entries(feedback) or []
    named: set[int] = set()
    for entry in entries:
        criterion = normalize_name(entry.partition(": ")[0])
        named |= {i for i, c in enumerate(criteria) if c == criterion}
    return named


def demo_answer(messages: Sequence[BaseMessage]) -> str:
    """The demo worker's answer to a conversation (what `DemoWorker` replies)."""
    prompt, feedback = _split_conversation(messages)
    row = demo_row_for(prompt)
    if row is not None:
        fixed_rows: set[int] = set()
        for text in feedback:
            fixed_rows |= _row_fixes(text, row.rubric)
        return row.answer(frozenset(fixed_rows))
    found = _script_for(prompt)
    if found is None:
        return _unknown_prompt()
    name, script = found
    fixed: set[str] = set()
    for text in feedback:
        fixed |= _flaws_named(text, name, script)
    return script.compose(frozenset(fixed))


def _pieces(text: str) -> list[str]:
    """Word-sized pieces (each word with the whitespace after it) that join back to `text`."""
    return re.findall(r"\S+\s*|\s+", text)


# --------------------------------------------------------------------------- the model


class DemoWorker(BaseChatModel):
    """An offline worker for the bundled examples: flawed drafts, feedback-driven revisions.

    It never calls tools (`bind_tools` returns the model itself) and streams its answer word by
    word. See the module docstring for how it reads a conversation.

    Args:
        token_delay_s: Seconds to sleep between streamed pieces (for a visibly live UI).

    """

    token_delay_s: float = Field(default=0.0, ge=0.0)
    """Delay between streamed chunks, in seconds."""

    @property
    def _llm_type(self) -> str:
        return "demo-worker"

    @override
    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> DemoWorker:
        """The model itself: the demo worker answers without tools."""
        return self

    @override
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        message = AIMessage(content=demo_answer(messages), response_metadata={
            "model_name": "demo"})
        return ChatResult(generations=[ChatGeneration(message=message)])

    @override
    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for i, piece in enumerate(_pieces(demo_answer(messages))):
            if i and self.token_delay_s:
                time.sleep(self.token_delay_s)
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
            if run_manager:
                run_manager.on_llm_new_token(piece, chunk=chunk)
            yield chunk


def demo_knows(prompt: str) -> bool:
    """Whether the demo worker has a real answer for this prompt.

    True for a bundled example (its exact text or keywords) or a bundled dataset row (exact
    text), the prompts `demo_answer` answers; any other prompt only gets the reply that it
    can answer the bundled examples alone.
    """
    return demo_row_for(prompt) is not None or _script_for(prompt) is not None
