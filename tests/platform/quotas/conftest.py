"""Quota fixtures: a manual clock and the two backends that must behave the same."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from quota_helpers import ManualClock, delete_prefix
from redis.asyncio import Redis

from hydrant.platform.quotas import InMemoryQuotaBackend, QuotaBackend
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend


@pytest.fixture()
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A redis-py client of the test server, to look at what the code under test wrote."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture()
async def acl_user(redis: Redis) -> AsyncIterator[tuple[str, str]]:
    """A Redis ACL user (name, password) that may do anything; deleted afterwards."""
    user, password = f"hydrant_test_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    await redis.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"]
    )
    yield user, password
    await redis.acl_deluser(user)


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture()
def key_prefix() -> str:
    return f"test:quota:{uuid.uuid4().hex}"


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("redis-inline", marks=pytest.mark.integration),
    ]
)
async def backend(
    request: pytest.FixtureRequest, clock: ManualClock, key_prefix: str
) -> AsyncIterator[QuotaBackend]:
    if request.param == "memory":
        memory = InMemoryQuotaBackend(clock=clock)
        yield memory
        await memory.aclose()
        return
    redis_url = request.getfixturevalue("redis_url")
    # redis-inline: the scripts called inline (quotas/inline_redis.py), a ceiling so high
    # that the path never steps aside; the fixture checks at the end that none went round it
    inline = request.param == "redis-inline"
    store = RedisQuotaBackend.from_url(
        redis_url, key_prefix=key_prefix, clock=clock, inline_ceiling_s=10.0 if inline else 0.0
    )
    yield store
    if inline:
        assert store._scripts is not None and store._scripts.inline is not None
        assert store._scripts.inline.stepped_aside == 0
    cleaner = Redis.from_url(redis_url)
    await delete_prefix(cleaner, key_prefix)
    await cleaner.aclose()
    await store.aclose()
