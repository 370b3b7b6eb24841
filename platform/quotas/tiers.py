"""Length tiers: how a request is treated by the size of what it can cost.

The defaults come from the field (a team that ran this in production): below
512 tokens requests flow freely; 512-2048 at most 10 requests/s per key;
above 2048 they go to a long lane where they queue and are dropped after 30 s;
a prompt above 8192 tokens (or above the model's context) is refused with 422
before it can tie up a device. Why classify by prompt + max_tokens rather than
the prompt alone: max_tokens is what the request may cost, and it is known
before anything is generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from hydrant.errors import HydrantError


class Tier(StrEnum):
    FREE = "free"
    LIMITED = "limited"
    LONG = "long"


TooLargeReason = Literal["prompt_too_long", "context_exceeded"]


class RequestTooLargeError(HydrantError):
    """The request cannot be served at any rate (HTTP 422)."""

    def __init__(self, reason: TooLargeReason, tokens: int, limit: int) -> None:
        self.reason: TooLargeReason = reason
        self.tokens = tokens
        self.limit = limit
        what = "prompt" if reason == "prompt_too_long" else "prompt + max_tokens"
        super().__init__(f"{what} is {tokens} tokens; the limit is {limit}")


def _require_positive(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number")


@dataclass(frozen=True)
class TierPolicy:
    """Tier boundaries: total < `free_below` is FREE, ≤ `limited_up_to` is LIMITED, else LONG."""

    free_below: int = 512
    limited_up_to: int = 2048
    limited_requests_per_s: int = 10
    long_queue_timeout_s: float = 30.0
    max_prompt_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in (
            "free_below",
            "limited_up_to",
            "limited_requests_per_s",
            "long_queue_timeout_s",
            "max_prompt_tokens",
        ):
            _require_positive(getattr(self, name), name)
        if self.free_below > self.limited_up_to:
            raise ValueError("free_below must not exceed limited_up_to")


@dataclass(frozen=True)
class TierDecision:
    """The tier and what it implies: a per-key rate (LIMITED) or a queue deadline (LONG)."""

    tier: Tier
    total_tokens: int
    requests_per_s: int | None = None
    queue_timeout_s: float | None = None


def _require_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


def classify(
    prompt_tokens: int,
    max_tokens: int,
    policy: TierPolicy | None = None,
    *,
    model_context: int | None = None,
) -> TierDecision:
    """Tier of a request, or `RequestTooLargeError` when it can never be served."""
    rules = policy or TierPolicy()
    _require_count(prompt_tokens, "prompt_tokens")
    _require_count(max_tokens, "max_tokens")
    prompt_limit = rules.max_prompt_tokens
    if model_context is not None:
        _require_positive(model_context, "model_context")
        prompt_limit = min(prompt_limit, model_context)
    if prompt_tokens > prompt_limit:
        raise RequestTooLargeError("prompt_too_long", prompt_tokens, prompt_limit)
    total = prompt_tokens + max_tokens
    if model_context is not None and total > model_context:
        raise RequestTooLargeError("context_exceeded", total, model_context)
    if total < rules.free_below:
        return TierDecision(Tier.FREE, total)
    if total <= rules.limited_up_to:
        return TierDecision(Tier.LIMITED, total, requests_per_s=rules.limited_requests_per_s)
    return TierDecision(Tier.LONG, total, queue_timeout_s=rules.long_queue_timeout_s)
