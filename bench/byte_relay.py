"""A TCP relay that forwards bytes both ways and does nothing else: a front's floor.

    .venv/bin/python bench/byte_relay.py --port 9000 --target 127.0.0.1:8000

bench/upstream.py puts it in front of `vllm serve` as one more front: any HTTP
front written in Python (LiteLLM's proxy, Hydrant's gateway) must at least
read each streamed chunk off one socket and write it to another, in an event
loop on the same cores, so what this relay costs vLLM's latencies is the least
such a front can cost on that host. uvloop, one `asyncio.Protocol` per side,
reads handed straight to the other side's transport (paused while it is full).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket

import uvloop


class _Side(asyncio.Protocol):
    """One socket of a relayed connection; what it reads goes to `peer`'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # read before the peer connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def relay(port: int, host: str, target_port: int) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references

    def accepted() -> _Side:
        client = _Side()

        async def connect() -> None:
            try:
                _, upstream = await loop.create_connection(_Side, host, target_port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            assert upstream.transport is not None and client.transport is not None
            if client.transport.is_closing():  # the client left while this connected
                upstream.transport.close()
                return
            client.peer, upstream.peer = upstream, client
            for data in client.pending:
                upstream.transport.write(data)
            client.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accepted, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True, help="host:port to relay to")
    args = parser.parse_args()
    host, _, target_port = args.target.rpartition(":")
    uvloop.run(relay(args.port, host, int(target_port)))


if __name__ == "__main__":
    main()
