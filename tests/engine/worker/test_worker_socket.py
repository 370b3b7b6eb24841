"""The worker's listening socket: connections accepted on it must not use Nagle's algorithm.

Why it matters: the worker writes a response head and then one small frame per
step; with Nagle on, each small write after the first waits for the gateway's
delayed ACK (~40 ms on Linux) on a keep-alive connection. asyncio turns Nagle
off only for sockets whose protocol is TCP, and accepted sockets inherit it
from the listening one.
"""

from __future__ import annotations

import asyncio
import socket

from hydrant.engine.worker.process import _bind


async def test_connections_accepted_by_the_worker_socket_have_nodelay() -> None:
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = writer.get_extra_info("socket")
        seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    listening = _bind("127.0.0.1", 0)
    server = await asyncio.start_server(handle, sock=listening)
    port = listening.getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert seen and seen[0] != 0, "Nagle is on for connections the worker accepts"
