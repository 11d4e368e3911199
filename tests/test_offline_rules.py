"""Criterion recognition: the phrasings the rules check, and the ones they refuse to guess."""

from __future__ import annotations

import pytest
from conftest import CODE_OK, HAIKU_DRAFT, HAIKU_FIXED, ROOT, SUMMARY
from rules_phrasings import PHRASINGS, TOOLS

from rubric_core.offline.rules import check_criterion, partial_reading, read, unrecognised_criteria

TABLE_COUNTS = (251, 137, 114)
"""The phrasing table's size, and how many of its phrasings the rules recognise and decline."""


@pytest.mark.parametrize(
    ("criterion", "answer", "passed"),
    [
        pytest.param("The poem has three lines", HAIKU_DRAFT, True, id="lines_has_word_number"),
        pytest.param("exactly 3 lines", HAIKU_DRAFT, True, id="lines_exactly_digit"),
        pytest.param("It is three lines long.", HAIKU_DRAFT, True, id="lines_long_trailing_dot"),
        pytest.param("The poem has 4 lines", HAIKU_DRAFT, False, id="lines_wrong_count"),
        pytest.param("at most 2 lines", HAIKU_DRAFT, False, id="lines_at_most"),
        pytest.param("Lines follow a 5-7-5 syllable pattern", HAIKU_FIXED, True, id="syl_dashes"),
        pytest.param("syllables 5/7/5", HAIKU_FIXED, True, id="syl_slashes"),
        pytest.param("5-7-5", HAIKU_DRAFT, False, id="syl_bare_pattern"),
        pytest.param("The answer is one sentence", SUMMARY, False, id="sentences_one"),
        pytest.param("a single sentence", "Plants use light.", True, id="sentences_single"),
        pytest.param("At most two sentences", SUMMARY, True, id="sentences_at_most"),
        pytest.param("The answer is at most 50 words", SUMMARY, True, id="words_at_most"),
        pytest.param("no more than 5 words", SUMMARY, False, id="words_no_more_than"),
        pytest.param("50 words or fewer", SUMMARY, True, id="words_or_fewer"),
        pytest.param("at least 30 words", SUMMARY, False, id="words_at_least"),
        pytest.param("Under 200 characters", SUMMARY, True, id="chars_under"),
        pytest.param(
            "The summary must not exceed 20 characters", SUMMARY, False, id="chars_exceed"
        ),
        pytest.param("The answer mentions light and water", SUMMARY, True, id="mentions_two"),
        pytest.param("mentions both light and chlorophyll", SUMMARY, False, id="mentions_both"),
        pytest.param("Mentions `carbon dioxide`", SUMMARY, True, id="mentions_quoted_phrase"),
        pytest.param("mentions plant", SUMMARY, True, id="mentions_plural_allowed"),
        pytest.param("includes the word glucose", SUMMARY, True, id="word_includes"),
        pytest.param("uses the word 'plant'", SUMMARY, False, id="word_whole_only"),
        pytest.param("The theme is spring", HAIKU_FIXED, True, id="theme_is_mentions"),
        pytest.param("The theme is spring", HAIKU_DRAFT, False, id="theme_missing"),
        pytest.param('contains "by-product"', SUMMARY, True, id="contains_quoted"),
        pytest.param("contains chlorophyll", SUMMARY, False, id="contains_plain"),
        pytest.param("does not contain `sugar`", SUMMARY, True, id="not_contains"),
        pytest.param("The answer does not mention oxygen", SUMMARY, False, id="not_mention"),
        pytest.param("never mentions winter", HAIKU_DRAFT, True, id="never_mentions"),
        pytest.param("matches the regex /^photo/i", SUMMARY, True, id="regex_slashes_flag"),
        pytest.param(r"matches regular expression `\d`", SUMMARY, False, id="regex_backticks"),
        pytest.param("starts with Photosynthesis", SUMMARY, True, id="starts_plain"),
        pytest.param('begins with "Oxygen"', SUMMARY, False, id="begins_quoted"),
        pytest.param('ends with "."', SUMMARY, True, id="ends_quoted"),
        pytest.param("is valid JSON", '{"a": 1}', True, id="json_valid"),
        pytest.param("The output is valid JSON", "{'a': 1}", False, id="json_invalid"),
        pytest.param("The answer is valid JSON", '```json\n{"a": 1}\n```', True, id="json_fenced"),
        pytest.param(
            'validates against the JSON schema `{"type": "object", "required": ["a"]}`',
            '{"b": 1}', False, id="inline_schema",
        ),
        pytest.param(
            "The function is named `add` and accepts two arguments", CODE_OK, True,
            id="function_name_and_arity",
        ),
        pytest.param("The function is called sub", CODE_OK, False, id="function_wrong_name"),
    ],
)
def test_recognised_phrasings(criterion: str, answer: str, passed: bool) -> None:
    verdict = check_criterion(criterion, answer)
    assert verdict is not None, f"not recognised: {criterion!r}"
    assert verdict["name"] == criterion
    assert verdict["passed"] is passed
    assert ("gap" in verdict) is (not passed)
    if not passed:
        assert verdict["gap"].strip()


@pytest.mark.parametrize(
    "criterion",
    [
        pytest.param("The tone is friendly", id="subjective"),
        pytest.param("Each line has at most 10 words", id="per_line_count"),
        pytest.param("The poem never has three lines", id="negated_count"),
        pytest.param("mentions at least two examples", id="vague_mention"),
        pytest.param("starts with a capital letter", id="described_not_quoted"),
        pytest.param("Lines follow a 5-7-5 syllable pattern and mention spring", id="compound"),
        pytest.param("All tests pass in run_missing_tests", id="tool_not_bound"),
        pytest.param("The record validates against the product schema", id="schema_unnamed"),
    ],
)
def test_unrecognised_criteria_are_not_guessed(criterion: str) -> None:
    assert check_criterion(criterion, HAIKU_DRAFT) is None
    assert unrecognised_criteria([criterion]) == [criterion]


def test_unrecognised_criteria_lists_only_unknown_ones_and_knows_tool_names() -> None:
    criteria = ["The poem has three lines", "The tone is calm", "All tests pass in run_t"]
    assert unrecognised_criteria(criteria) == ["The tone is calm", "All tests pass in run_t"]
    assert unrecognised_criteria(criteria, tool_names=["run_t"]) == ["The tone is calm"]


# --------------------------------------------------------------------------- the phrasing table


def _reading(criterion: str) -> str | None:
    found = read(criterion, TOOLS)
    return found.text if found else None


@pytest.mark.parametrize(
    ("criterion", "expected"),
    [pytest.param(c, r, id=f"{i:03d}:{c[:40]}") for i, (c, r) in enumerate(PHRASINGS)],
)
def test_phrasing_table_row(criterion: str, expected: str | None) -> None:
    assert _reading(criterion) == expected


def test_phrasing_table_is_read_exactly_and_says_how_much_it_declines() -> None:
    criteria = [c for c, _ in PHRASINGS]
    assert len(PHRASINGS) >= 150 and len(set(criteria)) == len(criteria)
    exact = sum(_reading(c) == expected for c, expected in PHRASINGS)
    assert exact / len(PHRASINGS) == 1.0, f"{exact} of {len(PHRASINGS)} read as the table says"
    recognised = sum(expected is not None for _, expected in PHRASINGS)
    # The counts the README quotes: change them there when the table changes.
    assert (len(PHRASINGS), recognised, len(PHRASINGS) - recognised) == TABLE_COUNTS
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    total, read_, declined = TABLE_COUNTS
    assert (f"pins {total} phrasings, {read_} read and {declined} declined, 100% read exactly "
            "as listed") in readme
    # The table's readings and the grader agree on what is declined.
    assert unrecognised_criteria(criteria, TOOLS) == [c for c, r in PHRASINGS if r is None]


# --------------------------------------------------------------------------- all, any, none


POEM = "Pink cherry blossoms\nfall on the quiet river\nthe cats watch them drift"


@pytest.mark.parametrize(
    ("criterion", "passed", "gap"),
    [
        pytest.param("The poem mentions spring or cherry blossoms", True, None,
                     id="or_one_of_two_is_enough"),
        pytest.param("mentions either spring or river", True, None, id="either_or"),
        pytest.param("mentions at least one of spring, summer, river", True, None,
                     id="at_least_one_of"),
        pytest.param("mentions spring or summer", False,
                     "missing: spring, summer (needs at least one)", id="or_none_present"),
        pytest.param("mentions spring and cherry blossoms", False, "missing: spring",
                     id="and_still_needs_all"),
        pytest.param("mentions river and cherry blossoms", True, None, id="and_all_present"),
        pytest.param("Mentions a cat", True, None, id="article_dropped_plural_allowed"),
        pytest.param("Mentions the moon", False, "missing: moon", id="article_dropped_missing"),
        pytest.param("does not mention river or sea", False, "mentions: river",
                     id="negated_or_is_none_of"),
        pytest.param("mentions neither sea nor summer", True, None, id="neither_nor"),
        pytest.param('contains "blossom" or "petal"', True, None, id="contains_any"),
        pytest.param('contains "petal" or "leaf"', False,
                     "contains none of: 'petal', 'leaf' (needs at least one)",
                     id="contains_any_gap"),
    ],
)
def test_terms_combine_as_written(criterion: str, passed: bool, gap: str | None) -> None:
    verdict = check_criterion(criterion, POEM)
    assert verdict is not None
    assert verdict["passed"] is passed
    assert verdict.get("gap") == gap


# --------------------------------------------------------------------------- partial readings


@pytest.mark.parametrize(
    ("criterion", "read_texts", "unread"),
    [
        pytest.param("The poem mentions spring and is cheerful", ["mentions ['spring']"],
                     ["is cheerful"], id="one_check_and_a_quality"),
        pytest.param("is cheerful and mentions spring", ["mentions ['spring']"],
                     ["is cheerful"], id="quality_first"),
        pytest.param("Lines follow a 5-7-5 syllable pattern and mention spring",
                     ["syllables 5-7-5", "mentions ['spring']"], [], id="two_checks"),
        pytest.param("mentions light, water and carbon dioxide, and is short",
                     ["mentions all of ['light', 'water', 'carbon dioxide']"], ["is short"],
                     id="longest_list_kept_whole"),
    ],
)
def test_partial_reading_names_what_is_read_and_what_is_not(
    criterion: str, read_texts: list[str], unread: list[str]
) -> None:
    assert read(criterion) is None
    found = partial_reading(criterion)
    assert found is not None
    assert [r.text for r in found[0]] == read_texts
    assert found[1] == unread


@pytest.mark.parametrize(
    "criterion",
    [
        pytest.param("The poem mentions spring or cherry blossoms", id="read_whole"),
        pytest.param("The tone is warm and inviting", id="nothing_read"),
        pytest.param("mentions spring and summer or autumn", id="cut_inside_a_list"),
        pytest.param("does not mention spring and summer", id="negated_and_list"),
    ],
)
def test_partial_reading_is_none_when_there_is_no_part_to_name(criterion: str) -> None:
    assert partial_reading(criterion) is None


LIMERICK = ("A coder who programmed all night\nin Python, by lamp and by light,\n"
            "said my programs compile\nbut it took me a while\nto get all the indentation right.")


@pytest.mark.parametrize(
    ("criterion", "answer", "passed"),
    [
        # Issue 24.6: "mentions programming" failed a limerick with "programmed" and "Python".
        pytest.param("Mentions programming", LIMERICK, True, id="programmed_is_programming"),
        pytest.param("Mentions programming", "My programs run.", True, id="programs"),
        pytest.param("Mentions programming", "I write a program.", True, id="program"),
        pytest.param("Mentions program", "We were programming.", True, id="ing_of_the_term"),
        pytest.param("Mentions rain", "It rained and kept raining.", True, id="rained"),
        pytest.param("Mentions code", "We were coding; it is coded.", True, id="e_dropped"),
        pytest.param("Mentions a study", "Two studies agree.", True, id="ies"),
        pytest.param("Mentions planning", "We planned it.", True, id="doubled_consonant"),
        # ...and never more: other words that only share letters stay misses.
        pytest.param("Mentions programming", "A programmer wrote it.", False,
                     id="programmer_is_another_word"),
        pytest.param("Mentions evening", "It was even better.", False, id="evening_not_even"),
        pytest.param("Mentions spring", "Sprinkle the sprig.", False, id="spring_kept_whole"),
        pytest.param("Mentions rain", "A rainbow over the train.", False, id="rain_in_words"),
        pytest.param("Mentions a cat", "A category of catalogs.", False, id="cat_prefix"),
        pytest.param("Does not mention programming", LIMERICK, False,
                     id="negated_mentions_inflect_too"),
    ],
)
def test_mentions_accept_inflections_and_nothing_else(
    criterion: str, answer: str, passed: bool
) -> None:
    verdict = check_criterion(criterion, answer)
    assert verdict is not None and verdict["passed"] is passed, verdict
