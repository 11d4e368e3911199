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
