"""Criterion recognition: the phrasings the rules check, and the ones they refuse to guess."""

from __future__ import annotations

import pytest
from conftest import CODE_OK, HAIKU_DRAFT, HAIKU_FIXED, SUMMARY

from rubric_core.offline.rules import check_criterion, unrecognised_criteria


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
