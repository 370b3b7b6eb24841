"""Real Redis under contention: 50 clients, across connections and OS processes, never overshoot."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import AsyncIterator

import pytest
from quota_helpers import delete_prefix
from quota_mp_worker import child, race
from redis.asyncio import Redis

from hydrant.platform.quotas import (
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    LimitUsage,
    WindowCheck,
)
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend

pytestmark = pytest.mark.integration

TASKS = 50


@pytest.fixture()
async def prefix(redis_url: str, key_prefix: str) -> AsyncIterator[str]:
    yield key_prefix
    client = Redis.from_url(redis_url)
    await delete_prefix(client, key_prefix)
    await client.aclose()


def cases() -> list[tuple[Check, int]]:
    period_end = time.time() + 3600
    return [
        (WindowCheck("rpm", "{t}:rpm", 17, 60.0), 17),
        (ConcurrencyCheck("slots", "{t}:slots", 7, lease_s=60), 7),
        (BudgetCheck("spend", "{t}:spend", 1000, 30, period_end), 33),  # floor(1000 / 30)
        (WindowCheck("tpm", "{t}:tpm", 1000, 60.0, amount=45), 22),
    ]


async def usage(url: str, prefix: str, check: Check) -> LimitUsage:
    backend = RedisQuotaBackend.from_url(url, key_prefix=prefix)
    try:
        return await backend.usage(check)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("case", range(4))
async def test_fifty_tasks_over_five_clients_admit_exactly_the_limit(
    redis_url: str, prefix: str, case: int
) -> None:
    check, expected = cases()[case]
    assert await race(redis_url, prefix, [check], TASKS, clients=5, settle=None) == expected


@pytest.mark.parametrize("case", range(4))
async def test_clients_calling_inline_and_through_the_loop_share_the_limit_exactly(
    redis_url: str, prefix: str, case: int
) -> None:
    check, expected = cases()[case]
    granted = await race(redis_url, prefix, [check], TASKS, clients=4, settle=None, inline=True)
    assert granted == expected


async def test_reserve_and_settle_under_contention_never_overspends(
    redis_url: str, prefix: str
) -> None:
    """Reserve 30, settle 25, repeat: exactly 39 fit (39 × 25 = 975; a 40th reserve overshoots)."""
    spend = BudgetCheck("spend", "{t}:spend", 1000, 30, time.time() + 3600)
    granted = await race(redis_url, prefix, [spend], TASKS, clients=5, settle=25)
    assert granted == 39
    assert await usage(redis_url, prefix, spend) == LimitUsage(used=975, reserved=0)


def _run_processes(args: tuple[object, ...]) -> list[int]:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=child, args=(args, barrier, results)) for _ in range(2)]
    for proc in procs:
        proc.start()
    counts = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return counts


@pytest.mark.slow
async def test_two_processes_share_every_limit_exactly(redis_url: str, prefix: str) -> None:
    """Each process runs 25 tasks over 3 clients; the limits hold across both together."""
    checks = [check for check, _ in cases()]
    # One admission holds all four limits; the tightest (7 slots) binds the total.
    args = (redis_url, prefix, checks, TASKS // 2, 3, None)
    counts = await asyncio.to_thread(_run_processes, args)
    assert sum(counts) == 7
    for check in checks:
        used = await usage(redis_url, prefix, check)
        expected = 7 * (check.amount if isinstance(check, BudgetCheck | WindowCheck) else 1)
        assert used.used + used.reserved == expected


@pytest.mark.slow
async def test_two_processes_reserve_and_settle_without_overspending(
    redis_url: str, prefix: str
) -> None:
    spend = BudgetCheck("spend", "{t}:spend", 1000, 30, time.time() + 3600)
    counts = await asyncio.to_thread(
        _run_processes, (redis_url, prefix, [spend], TASKS // 2, 3, 25)
    )
    assert sum(counts) == 39
    assert await usage(redis_url, prefix, spend) == LimitUsage(used=975, reserved=0)
