"""What a request costs in tokens: prices per million tokens, applied to a usage record.

Why per million: that is how providers publish prices, so the price book holds
the published numbers unchanged and no conversion error enters at data entry.
Cached input tokens are part of the input count (as OpenAI reports
`prompt_tokens_details.cached_tokens`) and are charged at their own price.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from hydrant.platform.billing.money import MONEY_CONTEXT, require_money, round_money

TOKENS_PER_PRICE_UNIT = 1_000_000


def _require_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


@dataclass(frozen=True)
class Price:
    """Prices per million tokens; cached input defaults to the input price."""

    input_per_million: Decimal
    output_per_million: Decimal
    cached_input_per_million: Decimal | None = None

    def __post_init__(self) -> None:
        for name in ("input_per_million", "output_per_million", "cached_input_per_million"):
            value = getattr(self, name)
            if value is None:
                continue
            if require_money(value, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @property
    def cached_rate(self) -> Decimal:
        if self.cached_input_per_million is None:
            return self.input_per_million
        return self.cached_input_per_million


@dataclass(frozen=True)
class TokenUsage:
    """Tokens of one request; `cached_input_tokens` is the part of `input_tokens` from cache."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0

    def __post_init__(self) -> None:
        _require_count(self.input_tokens, "input_tokens")
        _require_count(self.output_tokens, "output_tokens")
        _require_count(self.cached_input_tokens, "cached_input_tokens")
        if self.cached_input_tokens > self.input_tokens:
            raise ValueError("cached_input_tokens cannot exceed input_tokens")


def charge_for(usage: TokenUsage, price: Price) -> Decimal:
    """The charge for `usage` at `price`, computed exactly and rounded once (`round_money`)."""
    if not isinstance(usage, TokenUsage) or not isinstance(price, Price):
        raise TypeError("charge_for takes a TokenUsage and a Price")
    ctx = MONEY_CONTEXT
    uncached = usage.input_tokens - usage.cached_input_tokens
    total = ctx.add(
        ctx.add(
            ctx.multiply(Decimal(uncached), price.input_per_million),
            ctx.multiply(Decimal(usage.cached_input_tokens), price.cached_rate),
        ),
        ctx.multiply(Decimal(usage.output_tokens), price.output_per_million),
    )
    return round_money(ctx.divide(total, Decimal(TOKENS_PER_PRICE_UNIT)))


# A batch line's default price: half the interactive one (OpenAI's Batch API discount).
# Why a discount at all: batch lines run in capacity interactive traffic leaves idle, at
# the lowest priority, within a day, so they cost the platform less per token served.
BATCH_DISCOUNT = Decimal("0.5")


def batch_price(
    interactive: Price,
    *,
    input_per_million: Decimal | None = None,
    cached_input_per_million: Decimal | None = None,
    output_per_million: Decimal | None = None,
) -> Price:
    """The price of a batch line: each part as the price version sets it, else half the
    interactive part (exact: halving a decimal never rounds)."""

    def half(value: Decimal) -> Decimal:
        return MONEY_CONTEXT.multiply(value, BATCH_DISCOUNT)

    return Price(
        input_per_million=(
            input_per_million
            if input_per_million is not None
            else half(interactive.input_per_million)
        ),
        output_per_million=(
            output_per_million
            if output_per_million is not None
            else half(interactive.output_per_million)
        ),
        cached_input_per_million=(
            cached_input_per_million
            if cached_input_per_million is not None
            else half(interactive.cached_rate)
        ),
    )


def adapter_model_name(model: str, adapter: str | None) -> str:
    """The model name a request is priced and reported under: `base:adapter` for a LoRA
    adapter (its own entry in the price book), the base model's name otherwise."""
    return model if adapter is None else f"{model}:{adapter}"


def price_of(
    prices: Callable[[str], Price | None], model: str, adapter: str | None
) -> Price | None:
    """A request's price: the adapter's own version when it has one, else the base model's."""
    if adapter is not None:
        own = prices(adapter_model_name(model, adapter))
        if own is not None:
            return own
    return prices(model)
