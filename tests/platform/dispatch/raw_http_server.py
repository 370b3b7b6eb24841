"""A real TCP (or TLS) server whose every connection a test scripts byte by byte.

Shared by the tests of the gateway's lean HTTP client (`test_stream_client`:
worker links and calls) and of its upstream streams (`test_upstream_http`):
what they check is the client's behaviour on the wire, so the server reads the
real request off the socket and answers raw HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

Handler = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request off the socket (head, body); raises IncompleteReadError at EOF."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def chunked(
    *pieces: bytes, end: bool = True, content_type: bytes = b"application/x-hydrant-frames"
) -> bytes:
    """A 200 whose body is `pieces`, one HTTP chunk each; `end`: with the last (empty) chunk."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n" % content_type
    head += b"transfer-encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return head + body + (b"0\r\n\r\n" if end else b"")


def sized(status: int, body: bytes, extra: bytes = b"") -> bytes:
    """A response of `status` whose body is delimited by its content-length."""
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


class RawServer:
    """Counts accepted connections; `handler(index, reader, writer)` scripts each one.

    `tls`: the server's context, for an `https://` address."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.accepted = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.closed_by_client: list[int] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.accepted
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handler(index, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            pass  # the test is over; a cancelled callback task would be logged as an error
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
