"""Text statistics: the syllable heuristic's measured accuracy, sentence splitting and the tool."""

from __future__ import annotations

from typing import Any

import pytest

from rubric_core.tools.text import (
    count_sentences,
    count_syllables,
    count_words,
    text_stats,
    text_stats_data,
)

HAIKU = "Cherry blossoms fall\nsoft petals drift on the breeze\nspring wakes the still pond"

# Hand-labelled syllable counts (dictionary hyphenation; "fire" and "every" as usually spoken,
# 1 and 2). REFERENCE_WORDS holds the words the brief names, the haiku's words and the words the
# rules were written against; HELD_OUT_WORDS were labelled before the heuristic was run on them.
REFERENCE_WORDS = {
    # the haiku
    "cherry": 2, "blossoms": 2, "fall": 1, "soft": 1, "petals": 2, "drift": 1, "on": 1,
    "the": 1, "breeze": 1, "spring": 1, "wakes": 1, "still": 1, "pond": 1,
    # named in the brief
    "morning": 2, "fire": 1, "every": 2, "beautiful": 3, "quiet": 2, "poem": 2, "awakens": 3,
    "gentle": 2, "rain": 1, "little": 2, "orange": 2,
    # common and tricky words
    "water": 2, "river": 2, "mountain": 2, "autumn": 2, "winter": 2, "summer": 2, "silence": 2,
    "moon": 1, "snow": 1, "leaves": 1, "tree": 1, "flower": 2, "butterfly": 3, "whisper": 2,
    "evening": 2, "sunlight": 2, "shadow": 2, "yellow": 2, "golden": 2, "ocean": 2, "forest": 2,
    "frozen": 2, "silver": 2, "dream": 1, "light": 1, "night": 1, "sky": 1, "cloud": 1,
    "wind": 1, "falling": 2, "dancing": 2, "walked": 1, "wanted": 2, "needed": 2, "played": 1,
    "tables": 2, "horses": 2, "apple": 2, "table": 2, "people": 2, "family": 3, "happy": 2,
    "hello": 2, "today": 2, "tomorrow": 3, "yesterday": 3, "children": 2, "garden": 2,
    "window": 2, "animal": 3, "banana": 3, "computer": 3, "elephant": 3, "important": 3,
    "different": 3, "education": 4, "university": 5, "lion": 2, "piano": 3, "idea": 3,
    "area": 3, "radio": 3, "create": 2, "being": 2, "going": 2, "eyes": 1, "lonely": 2,
    "lovely": 2, "careful": 2, "something": 2, "someone": 2, "homework": 2, "hundred": 2,
    "simple": 2, "purple": 2, "violet": 3, "journey": 2, "valley": 2, "honey": 2,
    "moonlight": 2, "ancient": 2, "nation": 2, "special": 2, "question": 2, "language": 2,
    "usual": 3, "fruit": 1, "ruin": 2, "cruel": 2, "cried": 1, "tried": 1, "studied": 2,
    "happiest": 3, "curious": 3, "video": 3, "science": 2, "house": 1, "horse": 1, "world": 1,
    "school": 1, "music": 2, "number": 2, "problem": 2, "picture": 2, "paper": 2, "second": 2,
    "open": 2, "story": 2, "above": 2, "again": 2, "always": 2, "because": 2, "between": 2,
    "country": 2, "nature": 2, "heart": 1, "colour": 2, "hours": 1, "everything": 3,
    "nothing": 2, "business": 2, "wonderful": 3, "remember": 3, "together": 3, "another": 3,
    "beginning": 3, "umbrella": 3, "delicious": 3, "imagine": 3, "december": 3, "saturday": 3,
    "hospital": 3, "potato": 3, "tomato": 3, "energy": 3, "library": 3, "memory": 3,
    "holiday": 3, "difficult": 3, "vegetable": 4, "dictionary": 4, "caterpillar": 4,
    "information": 4, "watermelon": 4, "america": 4,
}
HELD_OUT_WORDS = {
    "able": 2, "about": 2, "across": 2, "action": 2, "active": 2, "actually": 4, "address": 2,
    "afraid": 2, "afternoon": 3, "agree": 2, "airport": 2, "alive": 2, "already": 3,
    "angry": 2, "answer": 2, "anything": 3, "appear": 2, "arrive": 2, "art": 1, "asleep": 2,
    "attention": 3, "audience": 3, "average": 3, "baby": 2, "balance": 2, "basket": 2,
    "battle": 2, "beach": 1, "beneath": 2, "bicycle": 3, "birthday": 2, "blanket": 2,
    "bottle": 2, "brother": 2, "bubble": 2, "candle": 2, "capital": 3, "careless": 2,
    "celebrate": 3, "century": 3, "certain": 2, "chance": 1, "cheese": 1, "chicken": 2,
    "circle": 2, "city": 2, "climate": 2, "coffee": 2, "company": 3, "continue": 3,
    "courage": 2, "cousin": 2, "crowded": 2, "culture": 2, "danger": 2, "daughter": 2,
    "decide": 2, "desire": 2, "dinner": 2, "distance": 2, "doctor": 2, "double": 2, "early": 2,
    "earth": 1, "easy": 2, "engine": 2, "enough": 2, "entire": 2, "escape": 2, "exercise": 3,
    "famous": 2, "feather": 2, "finally": 3, "finger": 2, "follow": 2, "fortune": 2,
    "freedom": 2, "friendly": 2, "future": 2, "giant": 2, "glasses": 2, "government": 3,
    "guitar": 2, "handle": 2, "harvest": 2, "heavy": 2, "history": 3, "hungry": 2, "island": 2,
    "journal": 2, "jungle": 2, "kitchen": 2, "knowledge": 2, "lazy": 2, "lemon": 2,
    "letter": 2, "lightning": 2, "listen": 2, "machine": 2, "market": 2, "meadow": 2,
    "medicine": 3, "message": 2, "middle": 2, "minute": 2, "moment": 2, "monkey": 2,
    "mother": 2, "narrow": 2, "natural": 3, "neighbor": 2, "nervous": 2, "noble": 2,
    "notice": 2, "office": 2, "orchard": 2, "pattern": 2, "peaceful": 2, "pencil": 2,
    "perhaps": 2, "planet": 2, "pleasure": 2, "poetry": 3, "police": 2, "possible": 3,
    "practice": 2, "pretty": 2, "promise": 2, "purpose": 2, "rabbit": 2, "reason": 2,
    "rescue": 2, "riddle": 2, "rocket": 2, "sadness": 2, "season": 2, "secret": 2,
    "shoulder": 2, "signal": 2, "sleepy": 2, "smiled": 1, "sometimes": 2, "sparkle": 2,
    "station": 2, "strange": 1, "student": 2, "sudden": 2, "sugar": 2, "surprise": 2,
    "teacher": 2, "thousand": 2, "thunder": 2, "tiger": 2, "travel": 2, "trouble": 2,
    "turtle": 2, "unless": 2, "useful": 2, "village": 2, "violin": 3, "visit": 2, "voices": 2,
    "wander": 2, "weather": 2, "whether": 2, "whistle": 2, "wisdom": 2, "wooden": 2,
    "worried": 2, "written": 2, "young": 1, "zebra": 2,
}
# Irregular words the heuristic is known to get wrong (documented, not counted above).
KNOWN_MISSES = {"element": 3, "alien": 3, "naive": 2, "chaos": 2, "reality": 4, "react": 2}


def _accuracy(labelled: dict[str, int]) -> tuple[float, list[tuple[str, int, int]]]:
    wrong = [(w, n, count_syllables(w)) for w, n in labelled.items() if count_syllables(w) != n]
    return 1 - len(wrong) / len(labelled), wrong


def test_syllable_accuracy_on_hand_labelled_words() -> None:
    required = set(HAIKU.lower().split()) | {
        "spring", "morning", "fire", "every", "beautiful", "quiet", "poem", "petals", "blossoms",
        "awakens", "gentle", "rain", "little", "the", "orange",
    }
    assert required <= set(REFERENCE_WORDS)
    everything = REFERENCE_WORDS | HELD_OUT_WORDS
    accuracy, wrong = _accuracy(everything)
    held_out, _ = _accuracy(HELD_OUT_WORDS)
    report = (
        f"syllable accuracy {accuracy:.1%} on {len(everything)} hand-labelled words "
        f"(held-out {held_out:.1%} on {len(HELD_OUT_WORDS)}); wrong: {wrong}"
    )
    print(report)
    assert accuracy >= 0.9, report
    assert held_out >= 0.9, report


def test_known_misses_are_still_close() -> None:
    # These irregular words are off by one; pinning that keeps the documentation honest.
    for word, syllables in KNOWN_MISSES.items():
        assert abs(count_syllables(word) - syllables) == 1, word


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("42", 0, id="digits_not_counted"),
        pytest.param("don't", 1, id="apostrophe"),
        pytest.param("snow-white", 2, id="hyphenated_parts_summed"),
        pytest.param("The quiet pond.", 4, id="phrase_summed"),
        pytest.param("QUIET", 2, id="case_insensitive"),
        pytest.param("hmm", 1, id="no_vowel_still_one"),
    ],
)
def test_count_syllables_edges(text: str, expected: int) -> None:
    assert count_syllables(text) == expected


def test_haiku_stats() -> None:
    stats = text_stats_data(HAIKU + "\n\n")
    assert stats == {
        "lines": 3,
        "words": 14,
        "sentences": 1,
        "characters": len(HAIKU),
        "syllables_per_line": [5, 7, 5],
        "line_texts": HAIKU.splitlines(),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("   \n ", 0, id="whitespace"),
        pytest.param("One. Two! Three?", 3, id="three_terminators"),
        pytest.param("No terminator here", 1, id="fragment_counts"),
        pytest.param("Done. And a trailing fragment", 2, id="trailing_fragment"),
        pytest.param("It costs 3.5 dollars. Cheap.", 2, id="decimal_ignored"),
        pytest.param("Use tools, e.g. a hammer, i.e. this one. Fine.", 2, id="eg_ie"),
        pytest.param("Dr. Smith met Mr. Jones. They talked.", 2, id="titles"),
        pytest.param("J. R. R. Tolkien wrote books.", 1, id="initials"),
        pytest.param("The U.S. is large. Yes.", 2, id="dotted_initialism"),
        pytest.param("Wait... what?! Really.", 3, id="runs_count_once"),
        pytest.param('He said "Hi." Then left.', 2, id="closing_quote"),
        pytest.param("See example.com for more. Bye", 2, id="dot_inside_word"),
        pytest.param("...", 0, id="only_punctuation"),
    ],
)
def test_count_sentences(text: str, expected: int) -> None:
    assert count_sentences(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("one two  three\nfour", 4, id="whitespace_separated"),
        pytest.param("don't stop, well-known!", 3, id="inner_apostrophe_and_hyphen"),
        pytest.param("café déjà vu", 3, id="accents"),
        pytest.param("3.5 items - ok", 4, id="digits_and_lone_dash"),
    ],
)
def test_count_words(text: str, expected: int) -> None:
    assert count_words(text) == expected


def test_characters_ignore_surrounding_whitespace() -> None:
    assert text_stats_data("  hi there \n")["characters"] == len("hi there")


def test_text_stats_tool() -> None:
    assert text_stats.name == "text_stats"
    assert list(text_stats.args) == ["text"]
    result: dict[str, Any] = text_stats.invoke({"text": HAIKU})
    assert result["syllables_per_line"] == [5, 7, 5]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param({"text": None}, id="none"),
        pytest.param({"text": ["a"]}, id="list"),
        pytest.param({}, id="missing"),
    ],
)
def test_text_stats_tool_reports_invalid_arguments(args: dict[str, Any]) -> None:
    out = text_stats.invoke(args)
    assert isinstance(out, str) and out.startswith("Invalid arguments for text_stats: text: ")
