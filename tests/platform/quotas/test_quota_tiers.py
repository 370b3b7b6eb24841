"""Tier classification at every boundary of the field's defaults."""

from __future__ import annotations

from typing import Any, cast

import pytest

from hydrant.platform.quotas.tiers import (
    RequestTooLargeError,
    Tier,
    TierPolicy,
    classify,
)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "tier"),
    [
        (0, 1, Tier.FREE),
        (500, 11, Tier.FREE),  # 511
        (500, 12, Tier.LIMITED),  # 512
        (2000, 48, Tier.LIMITED),  # 2048
        (2000, 49, Tier.LONG),  # 2049
        (8192, 0, Tier.LONG),
        (8192, 4096, Tier.LONG),
    ],
)
def test_total_tokens_pick_the_tier(prompt: int, max_tokens: int, tier: Tier) -> None:
    decision = classify(prompt, max_tokens)
    assert decision.tier is tier
    assert decision.total_tokens == prompt + max_tokens


def test_limited_tier_carries_the_per_key_rate_and_long_the_deadline() -> None:
    limited = classify(512, 0)
    assert (limited.requests_per_s, limited.queue_timeout_s) == (10, None)
    long = classify(2049, 0)
    assert (long.requests_per_s, long.queue_timeout_s) == (None, 30.0)
    assert classify(511, 0).requests_per_s is None


def test_prompt_over_8192_is_refused() -> None:
    assert classify(8192, 1).tier is Tier.LONG
    with pytest.raises(RequestTooLargeError) as info:
        classify(8193, 1)
    assert (info.value.reason, info.value.tokens, info.value.limit) == (
        "prompt_too_long",
        8193,
        8192,
    )


def test_prompt_over_a_smaller_model_context_is_refused() -> None:
    with pytest.raises(RequestTooLargeError) as info:
        classify(4097, 1, model_context=4096)
    assert (info.value.reason, info.value.limit) == ("prompt_too_long", 4096)


def test_prompt_plus_max_tokens_over_the_context_is_refused() -> None:
    assert classify(4000, 96, model_context=4096).tier is Tier.LONG
    with pytest.raises(RequestTooLargeError) as info:
        classify(4000, 97, model_context=4096)
    assert (info.value.reason, info.value.tokens) == ("context_exceeded", 4097)


def test_a_custom_policy_moves_the_boundaries() -> None:
    policy = TierPolicy(free_below=100, limited_up_to=200, limited_requests_per_s=3)
    assert classify(99, 0, policy).tier is Tier.FREE
    assert classify(100, 0, policy).requests_per_s == 3
    assert classify(201, 0, policy).tier is Tier.LONG


@pytest.mark.parametrize(
    "kwargs",
    [{"free_below": 0}, {"free_below": 600, "limited_up_to": 500}, {"long_queue_timeout_s": -1}],
)
def test_inconsistent_policy_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        TierPolicy(**kwargs)


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        classify(-1, 10)
    with pytest.raises(TypeError):
        classify(10, cast(Any, 1.5))
    with pytest.raises(ValueError):
        classify(10, 10, model_context=0)
