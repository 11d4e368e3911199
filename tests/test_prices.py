"""Prices: genai-prices' bundled snapshot, a person's overrides, and "unknown" (never 0)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from rubric_core.prices import (
    PriceError,
    PriceOverride,
    Prices,
    Usage,
    format_dollars,
    parse_overrides,
    total,
)

CALL = Usage(input_tokens=10_000, cached_input_tokens=4_000, output_tokens=500)


def test_a_listed_model_is_priced_with_its_cached_input_price() -> None:
    cost = Prices().cost("openai:gpt-4.1-mini", CALL, at=datetime(2026, 6, 1, tzinfo=UTC))
    # gpt-4.1-mini: $0.40 input, $0.10 cached input, $1.60 output per million tokens.
    assert cost == Decimal("6000") * Decimal("0.40") / 10**6 + Decimal("4000") * Decimal(
        "0.10") / 10**6 + Decimal("500") * Decimal("1.60") / 10**6
    uncached = Prices().cost("openai:gpt-4.1-mini", Usage(10_000, 0, None, 500))
    assert uncached is not None and cost is not None and cost < uncached


@pytest.mark.parametrize("model", [
    pytest.param("openai-compatible:llama3.1", id="a_local_server_is_not_ours_to_guess"),
    pytest.param("ollama:llama3.1", id="ollama"),
    pytest.param("openai:no-such-model-xyz", id="a_model_the_library_does_not_list"),
    pytest.param("someprovider:model", id="an_unknown_provider"),
])
def test_an_unknown_price_is_none_never_zero(model: str) -> None:
    assert Prices().cost(model, CALL) is None
    assert not Prices().known(model)


def test_offline_models_cost_nothing_and_unreported_usage_is_unknown() -> None:
    assert Prices().cost("demo", Usage()) == 0
    assert Prices().cost("rules", CALL) == 0
    assert Prices().cost("openai:gpt-4.1-mini", Usage(input_tokens=10)) is None


def test_an_override_wins_for_the_model_string_its_id_or_inside_hybrid() -> None:
    prices = parse_overrides(["openai-compatible:llama3.1=1,0.5,2", "gpt-4.1-mini=0,0,0"])
    assert prices.cost("openai-compatible:llama3.1", CALL) == Decimal("0.009")
    assert prices.cost("hybrid:openai-compatible:llama3.1", CALL) == Decimal("0.009")
    assert prices.cost("openai:gpt-4.1-mini", CALL) == 0
    # A later override of the same model replaces the earlier one.
    assert parse_overrides(["m:x=1,1,1", "m:x=2,2,2"]).cost("m:x", Usage(10**6, 0, 0, 0)) == 2


@pytest.mark.parametrize("text", [
    pytest.param("gpt-4.1=1,2", id="two_prices"),
    pytest.param("=1,2,3", id="no_model"),
    pytest.param("gpt-4.1", id="no_prices"),
    pytest.param("gpt-4.1=1,-2,3", id="negative"),
    pytest.param("gpt-4.1=1,nan,3", id="nan"),
    pytest.param("gpt-4.1=1,inf,3", id="infinite"),
    pytest.param("gpt-4.1=1,two,3", id="a_word"),
    pytest.param("gpt-4.1=1,2,1e9", id="absurd"),
])
def test_a_bad_override_is_refused_with_the_shape_to_write(text: str) -> None:
    with pytest.raises(PriceError, match=r"gpt-4\.1|MODEL=IN,CACHED,OUT"):
        PriceOverride.parse(text)


def test_totals_and_display_say_unknown_rather_than_a_partial_sum() -> None:
    assert total([Decimal("0.1"), Decimal("0.2")]) == Decimal("0.3")
    assert total([Decimal("0.1"), None]) is None
    assert total([]) is None
    assert format_dollars(None) == "unknown"
    assert format_dollars(Decimal(0)) == "$0"
    assert format_dollars(Decimal("0.0036")) == "$0.0036"
    assert format_dollars(Decimal("12.346")) == "$12.35"


def test_pricing_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        msg = "no network"
        raise AssertionError(msg)

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert Prices().cost("anthropic:claude-haiku-4-5", CALL) is not None


def test_a_key_shaped_model_name_in_a_price_is_refused_and_never_echoed() -> None:
    # Attack: `eval --price sk-proj-…=1,1,1 --max-cost 5` stored the key with the budget.
    key = "sk-proj-" + "Zq7Xw2Lm" * 5
    with pytest.raises(PriceError, match="holds an API key") as info:
        PriceOverride.parse(f"{key}=1,1,1")
    assert key not in str(info.value)
