"""Rubric parsing, validation and lint."""

from __future__ import annotations

import pytest

from rubric_core.rubric import (
    MAX_RUBRIC_CHARS,
    RubricError,
    lint_rubric,
    normalize_name,
    parse_criteria,
    validate_rubric,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("- a\n- b", ["a", "b"], id="dash_bullets"),
        pytest.param("* a\n+ b\n• c", ["a", "b", "c"], id="other_bullets"),
        pytest.param("1. a\n2) b\n(3) c", ["a", "b", "c"], id="numbering"),
        pytest.param("- [ ] a\n- [x] b", ["a", "b"], id="checkboxes"),
        pytest.param("a\n\n\n b is long\nc", ["a b is long", "c"], id="indent_continues"),
        pytest.param("- a\n  continued here\n- b", ["a continued here", "b"], id="bullet_cont"),
        pytest.param("- a\n  - nested bullet", ["a", "nested bullet"], id="indented_bullet"),
        pytest.param("plain line\nanother", ["plain line", "another"], id="no_markers"),
        pytest.param("   \n\n-\n- \n", [], id="only_blank_and_bare_markers"),
        pytest.param("- 5-7-5 pattern", ["5-7-5 pattern"], id="dash_inside_kept"),
        pytest.param("- e.g. this", ["e.g. this"], id="abbreviation_not_marker"),
    ],
)
def test_parse_criteria(text: str, expected: list[str]) -> None:
    assert parse_criteria(text) == expected


def test_normalize_name_ignores_case_markers_and_quotes() -> None:
    assert normalize_name("1. The function is named `find_duplicates`.") == normalize_name(
        "the function is  named find_duplicates"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(123, "must be a string", id="not_a_string"),
        pytest.param(["- a"], "must be a string", id="list"),
        pytest.param("x" * (MAX_RUBRIC_CHARS + 1), "limit is", id="too_large"),
        pytest.param("\n".join(f"- c{i}" for i in range(300)), "300 criteria", id="too_many"),
    ],
)
def test_validate_rubric_rejects(value: object, message: str) -> None:
    with pytest.raises(RubricError, match=message):
        validate_rubric(value)


def test_lint_flags_duplicates_compound_and_empty() -> None:
    issues = lint_rubric("- The poem has three lines\n- the poem has three lines.\n"
                         "- The poem has three lines and the theme is spring")
    kinds = [(i.level, i.message.split(":")[0]) for i in issues]
    assert ("error", "Duplicate criterion") in kinds
    assert any("several checks" in i.message for i in issues)
    assert lint_rubric("") [0].level == "error"
    assert lint_rubric("- The poem has three lines") == []


def test_lint_warns_on_long_rubric() -> None:
    issues = lint_rubric("\n".join(f"- criterion number {i}" for i in range(45)))
    assert any("45 criteria" in i.message for i in issues)


@pytest.mark.parametrize(
    ("criterion", "says"),
    [
        pytest.param("The poem mentions spring and is cheerful",
                     ["reads only part", "mentions ['spring']", "“is cheerful”", "Split it"],
                     id="recognised_in_part"),
        pytest.param("Lines follow a 5-7-5 syllable pattern and mention spring",
                     ["several checks", "syllables 5-7-5; mentions ['spring']",
                      "one criterion per check"], id="two_readable_checks"),
        pytest.param("Is short and funny and rhymes", ["several checks", "split it"],
                     id="qualities_chained_by_and"),
        pytest.param("The summary is clear, concise and accurate", ["several checks"],
                     id="qualities_listed"),
        pytest.param("Lines 1 and 2 rhyme, and line 3 is short", ["several checks"],
                     id="numbers_listed_then_another_check"),
        pytest.param("mentions spring and summer or autumn", ["mixes “and” with “or”",
                     "at least one of"], id="and_or_mixed"),
    ],
)
def test_lint_warns_on_joined_checks_saying_what_to_do(criterion: str, says: list[str]) -> None:
    [issue] = lint_rubric(f"- {criterion}")
    assert issue.level == "warning" and issue.criterion == criterion
    for text in says:
        assert text in issue.message


@pytest.mark.parametrize(
    "criterion",
    [
        pytest.param("The poem mentions spring or cherry blossoms", id="or_read_as_one_check"),
        pytest.param("mentions light, water and carbon dioxide", id="and_list_is_one_check"),
        pytest.param("The function is named `add` and accepts two arguments", id="function"),
        pytest.param("The tone is warm and inviting", id="two_qualities_left_alone"),
        pytest.param('mentions "salt, pepper and oil"', id="quoted_list_ignored"),
        pytest.param("50 words or fewer", id="or_fewer_is_no_disjunction"),
        pytest.param("Lines 1, 2 and 5 rhyme", id="numbered_lines_are_one_check"),
        pytest.param("The first, second and last lines rhyme", id="ordinal_lines_one_check"),
    ],
)
def test_lint_leaves_single_checks_alone(criterion: str) -> None:
    assert lint_rubric(f"- {criterion}") == []


def test_lint_reads_tool_criteria_with_the_tools_it_is_told_of() -> None:
    rubric = "- All tests pass in run_t and the code is documented"
    [unbound] = lint_rubric(rubric)
    assert "seems to join several checks" in unbound.message
    [bound] = lint_rubric(rubric, tool_names=["run_t"])
    assert "reads only part" in bound.message and "tests tool run_t" in bound.message
