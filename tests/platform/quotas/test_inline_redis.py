"""Inline quota calls (quotas/inline_redis.py) against the real Redis server.

What must hold: a call made inline answers without giving the event loop a turn, with
the reply the loop's client gives; a script Redis forgot still runs; an error reply
fails that call alone and keeps the path; a kept connection Redis dropped is replaced
on the spot; the path steps aside (the calls go through the loop, and still succeed)
when the median call passes the ceiling, when Redis stops answering within the timeout,
or when nothing listens, and comes back after its pause; the URL's credentials and
database are used; `rediss://` and a ceiling of 0 never block. The quota store asks for
inline calls for admissions alone in the admission path, never for settlements.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from quota_helpers import ECHO, FAILING, SET_AND_GET, ManualClock, closed_port_url, silent_redis
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from hydrant.errors import ConfigurationError
from hydrant.platform.quotas.checks import WindowCheck
from hydrant.platform.quotas.ingest_order import IngestGate, drop_place, hold_place
from hydrant.platform.quotas.inline_redis import InlineRedis, InlineUnavailable
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend
from hydrant.platform.quotas.script_client import RedisAddress, RedisScriptClient
from hydrant.platform.services import make_quota_backend
from hydrant.settings import load_settings


def inline_client(url: str, clock: ManualClock, ceiling_s: float = 1.0) -> RedisScriptClient:
    """A client whose inline path has a manual clock (its pauses end when the test says)."""
    client = RedisScriptClient(url, timeout_s=0.5)
    client.inline = InlineRedis(RedisAddress.from_url(url), ceiling_s=ceiling_s, clock=clock)
    return client


async def answered_without_a_loop_turn(call: asyncio.Future[object] | object) -> bool:
    """Whether awaiting `call` (a coroutine) let a callback queued before it run."""
    turns: list[int] = []
    asyncio.get_running_loop().call_soon(turns.append, 1)
    await call  # type: ignore[misc]
    return not turns


@pytest.mark.integration
async def test_an_inline_call_answers_without_a_loop_turn_and_as_the_loop_client_does(
    redis_url: str,
) -> None:
    inline = inline_client(redis_url, ManualClock())
    through_loop = RedisScriptClient(redis_url)
    try:
        await inline.evalsha(ECHO, ["k"], ["v", 1])  # resolves the host (through the loop)
        assert await answered_without_a_loop_turn(inline.evalsha(ECHO, ["k"], ["v", 2]))
        assert not await answered_without_a_loop_turn(through_loop.evalsha(ECHO, ["k"], ["v", 2]))
        for i in range(20):
            expected = await through_loop.evalsha(ECHO, [f"k{i}"], [f"v{i}", i])
            assert await inline.evalsha(ECHO, [f"k{i}"], [f"v{i}", i]) == expected
        assert inline.inline is not None and inline.inline.stepped_aside == 0
    finally:
        await inline.aclose()
        await through_loop.aclose()


@pytest.mark.integration
async def test_a_flushed_script_still_runs_inline(redis_url: str, redis: Redis) -> None:
    client = inline_client(redis_url, ManualClock())
    key = f"test:inline:{uuid.uuid4().hex}"
    try:
        await client.evalsha(ECHO, ["k"], ["v", 1])
        await redis.script_flush()
        call = client.evalsha(SET_AND_GET, [key], ["one"])
        assert await answered_without_a_loop_turn(call)  # NOSCRIPT, then EVAL: both inline
        assert await redis.get(key) == b"one"
        assert await redis.script_exists(SET_AND_GET.sha) == [True]
    finally:
        await redis.delete(key)
        await client.aclose()


@pytest.mark.integration
async def test_an_error_reply_fails_that_call_only_and_keeps_the_path(redis_url: str) -> None:
    client = inline_client(redis_url, ManualClock())
    try:
        with pytest.raises(redis_errors.ResponseError, match="quota script says no"):
            await client.evalsha(FAILING, [], [])
        assert await answered_without_a_loop_turn(client.evalsha(ECHO, ["a"], ["b", 1]))
        assert client.inline is not None and client.inline.stepped_aside == 0
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_a_kept_connection_redis_dropped_is_replaced_inline(
    redis_url: str, redis: Redis
) -> None:
    client = inline_client(redis_url, ManualClock())
    try:
        await client.evalsha(ECHO, ["before"], ["kill", 1])
        inline = client.inline
        assert inline is not None and inline._sock is not None
        host, port = inline._sock.getsockname()[:2]
        assert await redis.client_kill_filter(_type=None, addr=f"{host}:{port}") == 1
        call = client.evalsha(ECHO, ["after"], ["kill", 3])
        assert await answered_without_a_loop_turn(call)
        assert inline.stepped_aside == 0
        assert await client.evalsha(ECHO, ["again"], ["kill", 4]) == [b"again", b"kill", 8]
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_calls_over_the_ceiling_go_through_the_loop_until_the_pause_ends(
    redis_url: str,
) -> None:
    clock = ManualClock()
    client = inline_client(redis_url, clock, ceiling_s=1e-9)  # every call is "too slow"
    try:
        await client.evalsha(ECHO, ["k"], ["v", 0])  # resolves the host; the sample's first
        for i in range(1, 16):  # the sample's other 15: its median is over the ceiling
            assert await answered_without_a_loop_turn(client.evalsha(ECHO, ["k"], ["v", i]))
        inline = client.inline
        assert inline is not None and inline.stepped_aside == 1 and not inline.active
        call = client.evalsha(ECHO, ["k"], ["v", 21])
        assert not await answered_without_a_loop_turn(call)  # through the loop, answered
        assert await client.evalsha(ECHO, ["k"], ["v", 21]) == [b"k", b"v", 42]
        clock.advance(inline.pause_s)
        assert inline.active
        assert await answered_without_a_loop_turn(client.evalsha(ECHO, ["k"], ["v", 22]))
    finally:
        await client.aclose()


async def test_a_silent_server_holds_the_loop_once_for_the_timeout_then_not_again() -> None:
    """A server that accepts and reads but never answers (a hung Redis): the inline call
    gives up after its short timeout, the call goes through the loop (and times out
    there, as before), and later calls do not block until the pause ends."""
    async with silent_redis() as (url, _):
        client = RedisScriptClient(url, timeout_s=0.2)
        inline = client.inline = InlineRedis(
            RedisAddress.from_url(url), ceiling_s=1.0, timeout_s=0.05, clock=ManualClock()
        )
        try:
            with pytest.raises(redis_errors.TimeoutError):  # the loop's client's, after its own
                await client.evalsha(ECHO, ["k"], ["v", 1])
            assert inline.stepped_aside == 1 and not inline.active
            assert inline._sock is None  # the silent connection is closed
            with pytest.raises(redis_errors.TimeoutError):
                await client.evalsha(ECHO, ["k"], ["v", 2])
            assert inline.stepped_aside == 1  # paused: not tried again
        finally:
            await client.aclose()


async def test_nothing_listening_steps_aside_and_is_a_connection_error() -> None:
    client = inline_client(closed_port_url(), ManualClock())
    try:
        with pytest.raises(redis_errors.ConnectionError):
            await client.evalsha(ECHO, ["k"], ["v", 1])
        assert client.inline is not None and client.inline.stepped_aside == 1
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_admissions_go_inline_only_alone_in_the_path_and_settling_never(
    redis_url: str,
) -> None:
    """The quota store asks for an inline call for an admission alone: with another
    request in the admission path (a place beside it in the ingest gate), the calls go out
    together through the loop; a settlement, which nobody waits for, always does."""
    store = RedisQuotaBackend.from_url(
        redis_url, key_prefix=f"test:inline:{uuid.uuid4().hex}", inline_ceiling_s=10.0
    )
    checks = [WindowCheck("rpm", "tenant:rpm", 100, 60.0)]
    gate = IngestGate(4)
    token = hold_place(await gate.acquire())
    try:
        await store.settle(await store.admit(checks))  # the host looked up, through the loop
        admitted = store.admit(checks)
        assert await answered_without_a_loop_turn(admitted)  # alone: inline
        beside = await gate.acquire()
        assert not await answered_without_a_loop_turn(store.admit(checks))
        beside.release()
        admission = await store.admit(checks)
        assert not await answered_without_a_loop_turn(store.settle(admission))
        assert (await store.usage(checks[0])).used == 4  # all counted, wherever they went
        assert store._scripts is not None and store._scripts.inline is not None
        assert store._scripts.inline.stepped_aside == 0
    finally:
        drop_place(token)
        await store.aclose()


def test_an_unresolved_path_takes_no_call() -> None:
    inline = InlineRedis(RedisAddress.from_url("redis://127.0.0.1:6379/0"), ceiling_s=1.0)
    with pytest.raises(InlineUnavailable, match="not resolved"):
        inline.call(b"*1\r\n$4\r\nPING\r\n")


@pytest.mark.integration
async def test_the_database_and_credentials_of_the_url_are_used_inline(
    redis: Redis, acl_user: tuple[str, str]
) -> None:
    user, password = acl_user
    key = f"test:inline:{uuid.uuid4().hex}"
    client = inline_client(f"redis://{user}:{password}@127.0.0.1:6379/5", ManualClock())
    wrong = inline_client(f"redis://{user}:not-{password}@127.0.0.1:6379/5", ManualClock())
    in_five = Redis.from_url("redis://127.0.0.1:6379/5")
    try:
        await client.evalsha(ECHO, ["k"], ["v", 1])
        assert await answered_without_a_loop_turn(client.evalsha(SET_AND_GET, [key], ["5"]))
        assert await in_five.get(key) == b"5"
        assert await redis.get(key) is None  # not in database 0
        with pytest.raises(redis_errors.AuthenticationError):
            await wrong.evalsha(ECHO, ["k"], ["v", 1])
        assert wrong.inline is not None and wrong.inline.stepped_aside == 1
    finally:
        await in_five.delete(key)
        await in_five.aclose()
        await client.aclose()
        await wrong.aclose()


async def test_the_setting_picks_inline_calls_and_0_or_tls_never_blocks() -> None:
    made: list[RedisQuotaBackend] = []

    def scripts(**environ: str) -> RedisScriptClient | None:
        backend = make_quota_backend(load_settings(environ=environ))
        inner = backend._inner  # type: ignore[attr-defined]
        assert isinstance(inner, RedisQuotaBackend)
        made.append(inner)
        return inner._scripts

    default = scripts(HYDRANT_REDIS_URL="redis://127.0.0.1:6379/0")
    assert default is not None and default.inline is not None
    assert default.inline.ceiling_s == pytest.approx(0.001)
    off = scripts(HYDRANT_REDIS_URL="redis://127.0.0.1:6379/0", HYDRANT_QUOTA_INLINE_MS="0")
    assert off is not None and off.inline is None
    wider = scripts(HYDRANT_REDIS_URL="redis://127.0.0.1:6379/0", HYDRANT_QUOTA_INLINE_MS="2.5")
    assert wider is not None and wider.inline is not None
    assert wider.inline.ceiling_s == pytest.approx(0.0025)
    tls = scripts(HYDRANT_REDIS_URL="rediss://cache.internal:6380/0")
    assert tls is not None and tls.inline is None
    with pytest.raises(ConfigurationError, match="HYDRANT_QUOTA_INLINE_MS"):
        scripts(HYDRANT_REDIS_URL="redis://127.0.0.1:6379/0", HYDRANT_QUOTA_INLINE_MS="-1")
    for backend in made:
        await backend.aclose()
