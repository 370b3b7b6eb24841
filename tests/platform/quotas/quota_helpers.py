"""Helpers shared by the quota tests (a module, not conftest, so tests can import it by name)."""

from __future__ import annotations

from redis.asyncio import Redis

START = 1_750_000_000.0


class ManualClock:
    """Epoch seconds that only move when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def delete_prefix(client: Redis, prefix: str) -> None:
    """Remove every key a test created under its private prefix."""
    async for key in client.scan_iter(match=f"{prefix}:*", count=500):
        await client.delete(key)
