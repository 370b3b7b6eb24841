"""The auth cache: entries die at the TTL (a revoked key stops working), LRU bound."""

from __future__ import annotations

import pytest

from hydrant.platform.keys import KeyCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_entry_lives_until_the_ttl_then_disappears() -> None:
    clock = FakeClock()
    cache: KeyCache[str] = KeyCache(ttl_s=2.0, clock=clock)
    cache.put("digest", "tenant-1")
    clock.now += 1.999
    assert cache.get("digest") == "tenant-1"
    clock.now += 0.001
    assert cache.get("digest") is None
    assert len(cache) == 0


def test_reading_does_not_extend_the_ttl() -> None:
    clock = FakeClock()
    cache: KeyCache[str] = KeyCache(ttl_s=1.0, clock=clock)
    cache.put("d", "v")
    for _ in range(5):
        clock.now += 0.3
        cache.get("d")
    assert cache.get("d") is None


def test_invalidate_drops_one_entry_now() -> None:
    cache: KeyCache[int] = KeyCache(clock=FakeClock())
    cache.put("a", 1)
    cache.put("b", 2)
    cache.invalidate("a")
    cache.invalidate("missing")
    assert cache.get("a") is None
    assert cache.get("b") == 2
    cache.clear()
    assert cache.get("b") is None


def test_least_recently_used_is_evicted_first() -> None:
    cache: KeyCache[int] = KeyCache(max_entries=2, clock=FakeClock())
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None
    assert cache.get("a") == 1
    assert cache.get("c") == 3


@pytest.mark.parametrize("ttl", [0.0, -1.0, 10.5, 60.0])
def test_ttl_must_be_a_few_seconds(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        KeyCache(ttl_s=ttl)


def test_max_entries_must_be_positive() -> None:
    with pytest.raises(ValueError):
        KeyCache(max_entries=0)


def test_an_entry_is_due_for_renewal_once_half_its_ttl_is_gone() -> None:
    clock = FakeClock()
    cache: KeyCache[str] = KeyCache(ttl_s=4.0, clock=clock)
    assert not cache.refresh_due("d")  # absent: nothing to renew
    cache.put("d", "v")
    clock.now += 2.0
    assert not cache.refresh_due("d")
    clock.now += 0.001
    assert cache.refresh_due("d")
    cache.put("d", "v")  # renewed: a whole TTL again
    assert not cache.refresh_due("d")
