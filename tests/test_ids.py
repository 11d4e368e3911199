"""`rubric_core.ids.unique_id`: an id as a person gives it, whole or as a prefix naming one."""

from __future__ import annotations

import pytest

from rubric_core.ids import unique_id


def test_an_ambiguous_prefix_is_refused_and_an_exact_id_always_wins() -> None:
    with pytest.raises(ValueError, match="ambiguous \\(2 match\\)"):
        unique_id("run", "ab", ["abc1", "abd2"])
    assert unique_id("run", "ab", ["ab", "abd2"]) == "ab"
    assert unique_id("run", "abd", ["abc1", "abd2"]) == "abd2"


@pytest.mark.parametrize("key", [pytest.param("zz", id="no_match"),
                                 pytest.param("", id="empty_names_none")])
def test_a_key_naming_no_id_is_refused_with_its_kind(key: str) -> None:
    with pytest.raises(ValueError, match=f"no experiment '{key}' in this database"):
        unique_id("experiment", key, ["abc1", "abd2"])
