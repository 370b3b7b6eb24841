"""What only the Redis store has: the server clock, key expiry, hash tags, outages."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from quota_helpers import closed_port_url, delete_prefix
from redis.asyncio import Redis

from hydrant.platform.quotas import (
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    QuotaBackendUnavailable,
    QuotaExceeded,
    WindowCheck,
)
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend


@pytest.fixture()
async def client(redis_url: str, key_prefix: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url)
    yield redis
    await delete_prefix(redis, key_prefix)
    await redis.aclose()


@pytest.mark.integration
async def test_server_clock_is_used_without_an_injected_clock(
    client: Redis, key_prefix: str
) -> None:
    backend = RedisQuotaBackend(client, key_prefix=key_prefix)
    check = WindowCheck("rpm", "{t}:rpm", 1, 60.0)
    await backend.admit([check])
    with pytest.raises(QuotaExceeded) as info:
        await backend.admit([check])
    assert info.value.refusal.retry_after_s == pytest.approx(60.0, abs=2.0)
    scores = await client.zrange(f"{key_prefix}:{{t}}:rpm:win", 0, -1, withscores=True)
    assert scores[0][1] == pytest.approx(time.time(), abs=5.0)


@pytest.mark.integration
async def test_every_key_expires_and_shares_the_tenant_hash_tag(
    client: Redis, key_prefix: str
) -> None:
    backend = RedisQuotaBackend(client, key_prefix=key_prefix)
    checks: list[Check] = [
        WindowCheck("rpm", "{t9}:rpm", 5, 60.0),
        ConcurrencyCheck("slots", "{t9}:slots", 5, lease_s=30),
        BudgetCheck("spend", "{t9}:spend", 100, 10, time.time() + 7200),
    ]
    admission = await backend.admit(checks)
    await backend.settle(admission, {"spend": 4})
    await backend.admit(checks)
    keys = [k async for k in client.scan_iter(match=f"{key_prefix}:*")]
    assert len(keys) == 5
    for key in keys:
        assert b"{t9}" in key
        ttl = await client.pttl(key)
        assert ttl > 0, key
    assert 7_200_000 < await client.pttl(f"{key_prefix}:{{t9}}:spend:bud") <= 7_270_000


async def test_unreachable_redis_is_a_typed_error_and_fast() -> None:
    backend = RedisQuotaBackend.from_url(closed_port_url())
    started = time.monotonic()
    with pytest.raises(QuotaBackendUnavailable) as info:
        await backend.admit([WindowCheck("rpm", "{t}:rpm", 5, 60.0)])
    assert time.monotonic() - started < 1.5
    assert "ConnectionError" in str(info.value)
    await backend.aclose()


def test_prefix_with_braces_is_refused() -> None:
    with pytest.raises(ValueError):
        RedisQuotaBackend.from_url("redis://127.0.0.1:1/0", key_prefix="{bad}")
