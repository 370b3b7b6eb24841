"""Runs in a child process (multiprocessing, spawn): many asyncio clients race for one limit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hydrant.platform.quotas import Check, QuotaExceeded
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend


async def race(
    url: str,
    prefix: str,
    checks: Sequence[Check],
    tasks: int,
    clients: int,
    settle: int | None,
    inline: bool = False,
) -> int:
    """`tasks` tasks over `clients` separate clients; returns how many admissions were granted.

    With `settle` set, each task keeps admitting and settling to that amount until a
    refusal says waiting for other reservations will not help. With `inline`, every other
    client calls its scripts inline (quotas/inline_redis.py), the others through the loop.
    """
    backends = [
        RedisQuotaBackend.from_url(
            url, key_prefix=prefix, inline_ceiling_s=1.0 if inline and i % 2 == 0 else 0.0
        )
        for i in range(clients)
    ]
    start = asyncio.Event()

    async def one(index: int) -> int:
        backend = backends[index % clients]
        await start.wait()
        granted = 0
        while True:
            try:
                admission = await backend.admit(checks)
            except QuotaExceeded as exc:
                retry = exc.refusal.retry_after_s
                if settle is not None and retry is not None and retry <= 1.0:
                    await asyncio.sleep(0)
                    continue
                return granted
            granted += 1
            if settle is None:
                return granted
            await backend.settle(admission, {c.name: settle for c in checks})

    runners = [asyncio.create_task(one(i)) for i in range(tasks)]
    await asyncio.sleep(0.05)
    start.set()
    counts = await asyncio.gather(*runners)
    for backend in backends:
        await backend.aclose()
    return sum(counts)


def child(args: tuple[Any, ...], barrier: Any, results: Any) -> None:
    """Process entry point: wait for the sibling, race, report the count."""
    url, prefix, checks, tasks, clients, settle = args
    barrier.wait(timeout=60)
    results.put(asyncio.run(race(url, prefix, checks, tasks, clients, settle)))
