from __future__ import annotations

import pytest

from hydrant.platform.errors import InvalidRequest, RateLimited
from hydrant.platform.inference.abuse import AbuseGuard

BOS = 1
SPECIAL = frozenset({BOS, 2})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_normal_and_short_prompts_pass() -> None:
    guard = AbuseGuard()
    guard.check("k", [BOS, *range(10, 100)], SPECIAL)
    guard.check("k", [BOS] * 10, SPECIAL)  # below min_tokens: not worth judging


def test_repeated_bos_is_refused_then_the_source_is_blocked() -> None:
    clock, events = Clock(), []
    guard = AbuseGuard(strikes=3, block_s=300, clock=clock, on_event=events.append)
    attack = [BOS] * 500
    for _ in range(3):
        with pytest.raises(InvalidRequest) as refused:
            guard.check("k", attack, SPECIAL)
        assert refused.value.code == "abusive_prompt"
    with pytest.raises(RateLimited) as blocked:
        guard.check("k", [5, 6, 7], SPECIAL)  # even a fine prompt, while blocked
    assert blocked.value.retry_after == pytest.approx(300)
    guard.check("other", [5, 6, 7], SPECIAL)  # other sources are not affected
    assert guard.blocked_sources() == 1
    clock.now += 301
    guard.check("k", [5, 6, 7], SPECIAL)
    assert guard.blocked_sources() == 0
    assert events.count("special_tokens") == 3 and events.count("source_blocked") == 1


def test_strikes_outside_the_window_do_not_add_up() -> None:
    clock = Clock()
    guard = AbuseGuard(strikes=2, window_s=60, clock=clock)
    for _ in range(3):
        with pytest.raises(InvalidRequest):
            guard.check("k", [BOS] * 100, SPECIAL)
        clock.now += 61
    guard.check("k", [5] * 40, SPECIAL)  # never blocked
