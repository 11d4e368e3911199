"""Model prices: what a call's tokens cost in US dollars, or "unknown", never a guessed 0.

Prices come from `genai-prices` (MIT; prices per provider and model, with cached-input prices
and price changes over time), read from the snapshot bundled with the installed package: this
module never asks the network for newer prices (the package's ``UpdatePrices`` is never
started), so a price is the one of the installed version. A person can set or override a
model's price (`PriceOverride`: input, cached input and output per million tokens), which wins
over the library.

Rules, in order, for a model string (`rubric_core.models` syntax):

1. an override for the model string (or for its model id alone) prices it;
2. the offline models (``demo``, ``rules``) make no provider call and cost 0;
3. ``hybrid:<model>`` is priced as ``<model>`` (its rules cost nothing);
4. a LangChain provider known to genai-prices (``openai``, ``anthropic``, ``google_genai``,
   ``groq``, ``mistralai``…) with a model it lists is priced by it, at the price in force on
   the call's day (UTC; looked up once per model and day);
5. anything else — ``openai-compatible:`` servers, ``ollama:``, a model the library does not
   list — is unknown (`None`): a local or self-hosted model's cost is not ours to guess.

Token counts follow LangChain's ``usage_metadata``: ``input_tokens`` counts every input token,
cached ones included; ``cached_input_tokens`` (``input_token_details.cache_read``) is the part
read from the provider's prompt cache, billed at the cached price; ``cache_creation_tokens``
(``input_token_details.cache_creation``) the part written to it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from rubric_core.models import parse_model_spec
from rubric_core.redact import redact

if TYPE_CHECKING:
    from collections.abc import Iterable

MILLION = Decimal(1_000_000)

FREE_MODELS = frozenset({"demo", "rules"})
"""Offline models: no provider call, so no cost."""

_PROVIDER_IDS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "google_genai": "google",
    "google_vertexai": "google",
    "groq": "groq",
    "mistralai": "mistral",
    "deepseek": "deepseek",
    "xai": "x-ai",
}
"""LangChain provider names → genai-prices provider ids; a provider not here is unknown."""

_MAX_PRICE_PER_M = Decimal(100_000)


class PriceError(ValueError):
    """A price override that cannot be read, with what to write instead."""


@dataclasses.dataclass(frozen=True)
class PriceOverride:
    """A person's price for one model, in US dollars per million tokens."""

    model: str
    """The model string it prices (``openai:gpt-4.1-mini``), or a bare model id (``gpt-4.1``)."""
    input_per_m: Decimal
    """Input tokens that were not read from the cache."""
    cached_per_m: Decimal
    """Input tokens read from the provider's prompt cache."""
    output_per_m: Decimal
    """Output tokens."""

    @classmethod
    def parse(cls, text: str) -> PriceOverride:
        """Read ``MODEL=IN,CACHED,OUT`` (dollars per million tokens), as ``--price`` takes it.

        Raises:
            PriceError: Not that shape, or a price that is negative, not a number or absurd.

        """
        model, sep, prices = (text or "").partition("=")
        model = model.strip()
        parts = [p.strip() for p in prices.split(",")]
        if not sep or not model or len(parts) != 3:
            msg = (f"price {text!r} is not MODEL=IN,CACHED,OUT (US dollars per million tokens, "
                   "e.g. openai:gpt-4.1-mini=0.40,0.10,1.60)")
            raise PriceError(msg)
        if redact(model) != model:
            # A model name is stored with a budget and shown: one holding a key is refused.
            msg = (f"price {redact(text)!r}: the model name holds an API key or a secret (or "
                   "text shaped like one); give the model string, e.g. openai:gpt-4.1-mini")
            raise PriceError(msg)
        values = [_dollars(p, model) for p in parts]
        return cls(model, *values)

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> Decimal:
        """The dollars of one call's tokens at this price."""
        uncached = max(input_tokens - cached_tokens, 0)
        return (uncached * self.input_per_m + cached_tokens * self.cached_per_m
                + output_tokens * self.output_per_m) / MILLION


def _dollars(text: str, model: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0 or value > _MAX_PRICE_PER_M:
        msg = (f"price for {model!r}: {text!r} is not a number of dollars per million tokens "
               f"from 0 to {_MAX_PRICE_PER_M:,}")
        raise PriceError(msg)
    return value


@dataclasses.dataclass(frozen=True)
class Usage:
    """One call's tokens, as the provider reported them (None: not reported)."""

    input_tokens: int | None = None
    """Every input token, cached ones included."""
    cached_input_tokens: int | None = None
    """Input tokens read from the provider's prompt cache."""
    cache_creation_tokens: int | None = None
    """Input tokens written to the provider's prompt cache."""
    output_tokens: int | None = None
    """Output tokens."""


class Prices:
    """Prices calls: the overrides first, then genai-prices' bundled snapshot.

    Args:
        overrides: The person's prices; a later one for the same model wins.

    """

    def __init__(self, overrides: Iterable[PriceOverride] = ()) -> None:
        self.overrides: dict[str, PriceOverride] = {}
        for override in overrides:
            self.overrides[override.model] = override

    def known(self, model: str) -> bool:
        """Whether calls of ``model`` can be priced (see the module docstring)."""
        return self.cost(model, Usage(0, 0, 0, 0)) is not None

    def cost(self, model: str, usage: Usage, *, at: datetime | None = None) -> Decimal | None:
        """The dollars of one call of ``model`` (a model string), or None when unknown.

        Args:
            model: The model string the call was made with (``openai:gpt-4.1-mini``).
            usage: Its tokens; a call whose input or output was not reported is unknown
                (except for the offline models).
            at: When the call was made (prices change over time); now when None.

        """
        spec = model.strip()
        override = self._override(spec)
        if spec in FREE_MODELS and override is None:
            return Decimal(0)
        if usage.input_tokens is None or usage.output_tokens is None:
            return None
        cached = min(usage.cached_input_tokens or 0, usage.input_tokens)
        if override is not None:
            return override.cost(usage.input_tokens, cached, usage.output_tokens)
        parsed = parse_model_spec(spec)
        provider_id = _PROVIDER_IDS.get(parsed.provider)
        if provider_id is None:
            return None
        return _library_cost(provider_id, parsed.model_id, usage.input_tokens, cached,
                             usage.cache_creation_tokens or 0, usage.output_tokens, at)

    def _override(self, spec: str) -> PriceOverride | None:
        if spec in self.overrides:
            return self.overrides[spec]
        inner = spec.removeprefix("hybrid:")
        if inner in self.overrides:
            return self.overrides[inner]
        return self.overrides.get(inner.partition(":")[2] or inner)


def _library_cost(provider_id: str, model_id: str, input_tokens: int, cached: int,
                  creation: int, output_tokens: int, at: datetime | None) -> Decimal | None:
    from genai_prices import Usage as LibraryUsage

    when = at or datetime.now(UTC)
    price = _model_price(provider_id, model_id, when.astimezone(UTC).date())
    if price is None:
        return None
    usage = LibraryUsage(input_tokens=input_tokens, cache_read_tokens=cached or None,
                         cache_write_tokens=creation or None, output_tokens=output_tokens)
    return price.calc_price(usage)["total_price"]


@functools.lru_cache(maxsize=1024)
def _model_price(provider_id: str, model_id: str, day: date) -> Any:
    """genai-prices' price of a model on a day (None: not listed), looked up once per day.

    The lookup (matching the model id, picking the price in force) is most of what a library
    price costs (about 0.3 ms); an experiment prices thousands of calls of a few models.
    """
    from genai_prices import Usage as LibraryUsage
    from genai_prices import calc_price

    noon = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    try:
        found = calc_price(LibraryUsage(input_tokens=0, output_tokens=0), model_id,
                           provider_id=provider_id, genai_request_timestamp=noon)
    except (LookupError, ValueError):  # a model or provider it does not list
        return None
    return found.model_price


def parse_overrides(values: Iterable[str]) -> Prices:
    """`Prices` with ``--price MODEL=IN,CACHED,OUT`` overrides (each refused with its reason).

    Raises:
        PriceError: The first value that cannot be read.

    """
    return Prices(PriceOverride.parse(v) for v in values)


def total(costs: Iterable[Decimal | None]) -> Decimal | None:
    """The sum of some costs; None (unknown) when any of them is unknown or there are none."""
    out = Decimal(0)
    seen = False
    for cost in costs:
        if cost is None:
            return None
        out += cost
        seen = True
    return out if seen else None


_DISPLAY = re.compile(r"\.?0+$")


def format_dollars(cost: Decimal | float | str | None) -> str:
    """``$0.0123`` (four significant decimals below a cent), or ``unknown`` for None."""
    if cost is None or (isinstance(cost, float) and math.isnan(cost)):
        return "unknown"
    value = Decimal(cost)
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    text = f"{value:.6f}" if abs(value) >= Decimal("0.0001") else f"{value:.2e}"
    if "e" not in text:
        text = _DISPLAY.sub("", text) if "." in text else text
    return f"${text}"


__all__ = [
    "FREE_MODELS", "PriceError", "PriceOverride", "Prices", "Usage", "format_dollars",
    "parse_overrides", "total",
]
