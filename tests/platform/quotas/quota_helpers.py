"""Helpers shared by the quota tests (a module, not conftest, so tests can import it by name)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio import Redis

from hydrant.platform.quotas.script_client import LuaScript

START = 1_750_000_000.0

# Scripts for the script clients' tests (test_script_client.py, test_inline_redis.py)
ECHO = LuaScript("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) * 2}")
SET_AND_GET = LuaScript(
    "redis.call('SET', KEYS[1], ARGV[1], 'EX', 60) return redis.call('GET', KEYS[1])"
)
FAILING = LuaScript("return redis.error_reply('quota script says no')")


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


def closed_port_url() -> str:
    """A `redis://` URL where nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
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
