"""Helpers shared by the quota tests (a module, not conftest, so tests can import it by name)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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


async def closed_port_url() -> str:
    """A `redis://` URL where nothing listens (a port just freed)."""
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    return f"redis://127.0.0.1:{port}/0"


@asynccontextmanager
async def silent_redis() -> AsyncIterator[tuple[str, list[int]]]:
    """A server that accepts and reads but never answers (a hung Redis): its `redis://` URL
    and how many connections it took (a list of one int, as it grows)."""
    connections = [0]
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        writers.append(writer)
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0", connections
    finally:
        server.close()
        for writer in writers:  # closed before the test's loop is: no warning from their GC
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await server.wait_closed()
