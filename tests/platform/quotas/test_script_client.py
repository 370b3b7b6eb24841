"""The lean script client (quotas/script_client.py) against the real Redis server.

What must hold: many concurrent calls on one pipelined connection each get
their own reply; a server that forgot the script (SCRIPT FLUSH) still runs it;
an error reply is an error of that call only; a dropped connection is replaced
on the next call; a silent server is a `TimeoutError` for every call waiting
on it; credentials and the database number of the URL are used.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import uvloop
from quota_helpers import ECHO, FAILING, SET_AND_GET, closed_port_url, silent_redis
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from hydrant.platform.quotas.redis_backend import RedisQuotaBackend
from hydrant.platform.quotas.script_client import LuaScript, RedisAddress, RedisScriptClient


@pytest.fixture()
async def scripts(redis_url: str) -> AsyncIterator[RedisScriptClient]:
    client = RedisScriptClient(redis_url, timeout_s=2.0)
    yield client
    await client.aclose()


def test_urls_are_read_like_redis_py() -> None:
    assert RedisAddress.from_url("redis://127.0.0.1:6380/4") == RedisAddress(
        "127.0.0.1", 6380, 4, None, None, False
    )
    assert RedisAddress.from_url("rediss://us%40r:p%3Ass@cache.internal") == RedisAddress(
        "cache.internal", 6379, 0, "us@r", "p:ss", True
    )
    with pytest.raises(ValueError, match="unix"):
        RedisAddress.from_url("unix:///run/redis.sock")


def test_the_script_name_is_redis_own_sha1() -> None:
    # SHA1("return 1"), as `SCRIPT LOAD "return 1"` answers
    assert LuaScript("return 1").sha == "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"


@pytest.mark.integration
async def test_concurrent_calls_on_one_connection_each_get_their_own_reply(
    scripts: RedisScriptClient,
) -> None:
    replies = await asyncio.gather(
        *(scripts.evalsha(ECHO, [f"k{i}"], [f"v{i}", i]) for i in range(300))
    )
    assert replies == [[f"k{i}".encode(), f"v{i}".encode(), 2 * i] for i in range(300)]


@pytest.mark.integration
async def test_a_flushed_script_cache_still_runs_the_script(
    scripts: RedisScriptClient, redis: Redis
) -> None:
    key = f"test:scripts:{uuid.uuid4().hex}"
    await redis.script_flush()
    assert await redis.script_exists(SET_AND_GET.sha) == [False]
    assert await scripts.evalsha(SET_AND_GET, [key], ["one"]) == b"one"
    assert await redis.script_exists(SET_AND_GET.sha) == [True]  # EVAL cached it
    assert await scripts.evalsha(SET_AND_GET, [key], ["two"]) == b"two"
    await redis.delete(key)


@pytest.mark.integration
async def test_an_error_reply_fails_that_call_only(scripts: RedisScriptClient) -> None:
    results = await asyncio.gather(
        scripts.evalsha(ECHO, ["a"], ["b", 1]),
        scripts.evalsha(FAILING, [], []),
        scripts.evalsha(ECHO, ["c"], ["d", 2]),
        return_exceptions=True,
    )
    assert results[0] == [b"a", b"b", 2]
    assert isinstance(results[1], redis_errors.ResponseError)
    assert "quota script says no" in str(results[1])
    assert results[2] == [b"c", b"d", 4]


@pytest.mark.integration
async def test_a_killed_connection_is_replaced_on_the_next_call(
    scripts: RedisScriptClient, redis: Redis
) -> None:
    await scripts.evalsha(ECHO, ["before"], ["kill", 1])
    protocol = scripts._protocol
    assert protocol is not None and protocol._transport is not None
    host, port = protocol._transport.get_extra_info("sockname")[:2]
    killed = await redis.client_kill_filter(_type=None, addr=f"{host}:{port}")
    assert killed == 1
    assert await scripts.evalsha(ECHO, ["after"], ["kill", 3]) == [b"after", b"kill", 6]


@pytest.mark.integration
async def test_the_database_and_credentials_of_the_url_are_used(
    redis: Redis, acl_user: tuple[str, str]
) -> None:
    user, password = acl_user
    key = f"test:scripts:{uuid.uuid4().hex}"
    client = RedisScriptClient(f"redis://{user}:{password}@127.0.0.1:6379/5")
    wrong = RedisScriptClient(f"redis://{user}:not-{password}@127.0.0.1:6379/5")
    try:
        assert await client.evalsha(SET_AND_GET, [key], ["in five"]) == b"in five"
        in_five = Redis.from_url("redis://127.0.0.1:6379/5")
        assert await in_five.get(key) == b"in five"
        assert await redis.get(key) is None  # not in database 0
        await in_five.delete(key)
        await in_five.aclose()
        with pytest.raises(redis_errors.AuthenticationError):
            await wrong.evalsha(ECHO, ["k"], ["v", 1])
    finally:
        await client.aclose()
        await wrong.aclose()


async def test_a_silent_server_times_out_every_waiting_call() -> None:
    """A server that accepts and reads but never answers (a hung Redis)."""
    async with silent_redis() as (url, connections):
        client = RedisScriptClient(url, timeout_s=0.2)
        try:
            results = await asyncio.gather(
                *(client.evalsha(ECHO, ["k"], ["v", i]) for i in range(5)),
                return_exceptions=True,
            )
            assert all(isinstance(r, redis_errors.TimeoutError) for r in results), results
            assert connections == [2]  # the first connection and the one retry
        finally:
            await client.aclose()


async def test_nothing_listening_is_a_connection_error() -> None:
    client = RedisScriptClient(closed_port_url())
    with pytest.raises(redis_errors.ConnectionError):
        await client.evalsha(ECHO, ["k"], ["v", 1])
    await client.aclose()


async def test_only_tcp_urls_get_the_lean_client() -> None:
    """It speaks TCP only: a `unix://` URL keeps the scripts on redis-py instead of failing."""
    unix = RedisQuotaBackend.from_url("unix:///run/redis/redis.sock")
    tcp = RedisQuotaBackend.from_url("redis://127.0.0.1:6379/0")
    assert unix._scripts is None
    assert isinstance(tcp._scripts, RedisScriptClient)
    await unix.aclose()
    await tcp.aclose()


@pytest.mark.integration
def test_calls_work_on_uvloop(redis_url: str) -> None:
    """uvicorn runs the gateway on uvloop wherever it is installed; its transports differ."""

    async def scenario() -> list[object]:
        client = RedisScriptClient(redis_url)
        try:
            return list(
                await asyncio.gather(*(client.evalsha(ECHO, ["k"], ["v", i]) for i in range(50)))
            )
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        replies = runner.run(scenario())
    assert replies == [[b"k", b"v", 2 * i] for i in range(50)]
