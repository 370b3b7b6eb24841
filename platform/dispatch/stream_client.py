"""A lean HTTP/1.1 client for the gateway's hot paths: step streams and calls to workers,
and the event streams of upstream pool members (OpenAI-compatible servers).

httpx (with httpcore, h11, anyio and sniffio under it) cost the gateway about
2 ms of CPU per streamed request, most of its event loop's time. This client
does only what that stream needs: a POST written in one `transport.write`,
the response parsed by httptools (llhttp, in C: chunked and Content-Length
bodies), the body handed to one consumer through a small buffer, and
keep-alive connections pooled per worker address. `https://` addresses are
verified against the system trust store (`SSL_CERT_FILE` overrides it, as
for every Python client); `peer` names the other side in error messages.

Connections per worker address are capped (`max_connections_per_address`,
in use and idle together): a request that finds them all busy waits, first in
first served, for one to come back to the pool or to close, and gives up
after `pool_timeout_s`. Why a cap: nothing else bounds what the gateway sends
one worker, and a burst would otherwise open a socket per request on both
sides (httpx, which this replaced, capped at 4096 and waited the same way).

Failures are reported as four exceptions the caller maps to its own terms:
`StreamConnectError` (no connection), `StreamBusy` (every connection the cap
allows stayed busy for `pool_timeout_s`), `StreamSilent` (nothing received for
`idle_timeout_s` while the consumer waited) and `StreamLost` (the connection
broke or the response was malformed). A reused keep-alive connection that
fails before any response byte arrived (the worker closed it while idle) is
retried once on a fresh connection, as httpx does; never after response bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 1024 * 1024  # buffered body bytes above which the socket is not read
_LINGER_S = 5.0  # how long a finished stream may wait for its response's last chunk
_MAX_ERROR_BODY = 1024 * 1024


class StreamClientError(Exception):
    """Base of the client's failures."""


class StreamConnectError(StreamClientError):
    """No connection could be made (refused, unreachable, connect timeout)."""


class StreamBusy(StreamClientError):
    """Every connection the cap allows to the worker stayed in use for the pool timeout."""


class StreamSilent(StreamClientError):
    """Nothing arrived for `idle_timeout_s` while the consumer waited for data."""


class StreamLost(StreamClientError):
    """The connection broke (or the response was not valid HTTP) before the response ended."""


class _Target:
    """What is computed once per worker address: where to connect and the request's head."""

    __slots__ = ("head", "host", "port", "tls")

    def __init__(self, address: str, path: str, fields: str) -> None:
        parts = urlsplit(address)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            raise ValueError(f"address must be http(s)://host:port, got {address!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.head = f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\n{fields}content-length: "


class StreamResponse(asyncio.Protocol):
    """One keep-alive connection, and the response being read on it.

    The consumer reads with `read()` and ends with `release(finished)`: the
    connection returns to the pool only if its response ended cleanly and the
    server did not ask to close. A response whose consumer got all it wanted
    (`finished`) but whose final chunk is still in flight lingers briefly for
    it; a consumer that stops early closes the connection.
    """

    def __init__(self, client: StreamClient, key: str) -> None:
        self._client = client
        self._key = key
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._wait_since = 0.0
        self._last_data = 0.0
        self._idle_timeout = 30.0
        self._timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self.lost = False
        self.reused = False
        self._active = False  # an exchange is in progress (not idle in the pool)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.got_bytes = False
        self._began = False
        self._head_done = False
        self._framed = False
        self._complete = False
        self._keep_alive = False
        self._broken = False
        self._exc: StreamClientError | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if not self._active or self._broken:
            self._broken = True  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        self._last_data = self._loop.time()
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(StreamLost(f"malformed HTTP response from the {self._client.peer}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._cancel_timers()
        self._client._slot_freed(self._key)  # whatever its state, a closed one frees its slot
        if not self._active:
            self._client._discard(self)
            return
        if not self._complete and self._exc is None:
            if self._head_done and not self._framed:
                self._complete = True  # a body delimited by the end of the connection
            else:
                peer = self._client.peer
                why = type(exc).__name__ if exc is not None else f"closed by the {peer}"
                self._exc = StreamLost(f"connection to the {peer} broke: {why}")
        self._wake()

    # ---- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._began:
            self._broken = True  # a second response to one request
        self._began = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._linger is not None:
            self._broken = True  # more body after the consumer's last frame
            return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        if self._linger is not None:
            self._finish()  # its last chunk came: the linger ends there (`_cancel_timers`)
        else:
            self._wake()

    # ---- the exchange ----------------------------------------------------------------------

    def _send(self, request: bytes, idle_timeout_s: float) -> None:
        self._reset()
        self._active = True
        self._idle_timeout = idle_timeout_s
        self._last_data = self._loop.time()
        self._timer = self._loop.call_at(self._last_data + idle_timeout_s, self._check_idle)
        cast(asyncio.Transport, self._transport).write(request)

    async def _head(self) -> None:
        while not self._head_done:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def read(self) -> bytes:
        """The body bytes received since the last call; b"" at the end of the body."""
        while True:
            body = self._body
            if body:
                data = body.popleft() if len(body) == 1 else b"".join(body)
                body.clear()
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    cast(asyncio.Transport, self._transport).resume_reading()
                return data
            if self._complete:
                return b""
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def read_all(self) -> bytes:
        """The rest of a (small) body, at most 1 MiB of it."""
        pieces = []
        size = 0
        while size <= _MAX_ERROR_BODY and (data := await self.read()):
            pieces.append(data)
            size += len(data)
        return b"".join(pieces)

    def release(self, finished: bool) -> None:
        """The consumer is done: pool the connection if its response ended cleanly, else close.

        `finished`: the consumer got everything it wanted, so a response whose
        final chunk has not arrived yet may wait briefly for it and be pooled.
        """
        if self._complete or not finished or self._body or self._exc is not None:
            self._finish()
            return
        self._cancel_timers()
        self._linger = self._loop.call_later(_LINGER_S, self.close)
        self._client._lingering.add(self)  # closed by `aclose` if the last chunk never comes

    def _finish(self) -> None:
        self._cancel_timers()
        self._active = False
        if (
            self._complete
            and self._keep_alive
            and not self._body
            and not self._broken
            and not self.lost
            and self._exc is None
        ):
            self._client._pool(self)
        else:
            self.close()

    def close(self) -> None:
        self._cancel_timers()
        self._active = False
        if self._transport is not None:
            self._transport.close()

    # ---- waiting and the idle watchdog -----------------------------------------------------

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        self._wait_since = self._loop.time()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_idle(self) -> None:
        """One timer per connection, re-armed from the last data instead of per read."""
        self._timer = None
        if not self._active or self._complete or self._exc is not None:
            return
        now = self._loop.time()
        if self._waiter is None:  # the consumer is busy, not waiting on the worker
            self._timer = self._loop.call_at(now + self._idle_timeout, self._check_idle)
            return
        deadline = max(self._last_data, self._wait_since) + self._idle_timeout
        if now >= deadline - 0.001:
            self._fail(StreamSilent(f"the {self._client.peer}'s stream went silent"))
        else:
            self._timer = self._loop.call_at(deadline, self._check_idle)

    def _fail(self, exc: StreamClientError) -> None:
        if self._exc is None:
            self._exc = exc
        self._broken = True
        self._wake()
        if self._transport is not None:
            self._transport.abort()

    def _cancel_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
            self._client._lingering.discard(self)


def _closing(conn: StreamResponse) -> bool:
    return cast(asyncio.Transport, conn._transport).is_closing()


class StreamClient:
    """POSTs to one path of many workers, over keep-alive connections pooled per address.

    `fields`: the request's fixed header lines ("name: value\\r\\n" each), so a
    request's head is one string join.
    """

    def __init__(
        self,
        path: str,
        fields: dict[str, str],
        connect_timeout_s: float = 3.0,
        idle_timeout_s: float = 30.0,
        max_idle_per_address: int = 256,
        max_connections_per_address: int = 1024,
        pool_timeout_s: float = 30.0,
        peer: str = "worker",
    ) -> None:
        if max_connections_per_address < 1:
            raise ValueError("max_connections_per_address must be at least 1")
        for name, value in fields.items():
            if any(c in name + value for c in "\r\n\0"):
                raise ValueError(f"header {name!r} has a line break or NUL")
        self.peer = peer
        self._ssl: ssl.SSLContext | None = None  # made at the first https address
        self._path = path
        self._fields = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._max_idle = max_idle_per_address
        self._max_open = max_connections_per_address
        self._pool_timeout_s = pool_timeout_s
        self._targets: dict[str, _Target] = {}
        self._idle: dict[str, list[StreamResponse]] = {}
        # Per address: connections open or being opened (counted until `connection_lost`),
        # and the requests waiting for one, oldest first.
        self._open: dict[str, int] = {}
        self._waiters: dict[str, deque[asyncio.Future[StreamResponse | None]]] = {}
        self._lingering: set[StreamResponse] = set()  # released, waiting for their last chunk
        self._closed = False

    async def post(self, address: str, body: bytes) -> StreamResponse:
        """Send the request; the response once its status line and headers arrived.

        The caller must `release()` it (in a `finally`).
        """
        target = self._targets.get(address)
        if target is None:
            target = self._targets[address] = _Target(address, self._path, self._fields)
        request = f"{target.head}{len(body)}\r\n\r\n".encode() + body
        conn = self._take_idle(address)
        reserved = False
        if conn is None and self._open.get(address, 0) >= self._max_open:
            conn = await self._wait_for_connection(address)  # pooled, or None: a slot freed
            reserved = conn is None  # the freed slot is this request's: still counted
        if conn is not None and (conn.lost or _closing(conn)):
            conn = None  # closed while handed over; its own close freed its slot
        if conn is not None:
            conn.reused = True
            try:
                return await self._exchange(conn, request)
            except StreamLost:
                if conn.got_bytes:
                    raise
                # Closed by the worker while idle: once more on a fresh connection (the
                # dead one's slot frees when asyncio reports its close: one over, briefly).
        return await self._exchange(await self._connect(address, target, reserved), request)

    def _take_idle(self, address: str) -> StreamResponse | None:
        """A pooled connection to `address` that is still open, unless others wait for one."""
        if self._waiters.get(address):
            return None  # first in, first served: the waiters get released connections first
        idle = self._idle.get(address)
        while idle:
            conn = idle.pop()
            if not (conn.lost or _closing(conn)):
                return conn
        return None

    async def _wait_for_connection(self, address: str) -> StreamResponse | None:
        """Wait for a connection released to the pool (returned) or closed (None: open one)."""
        waiter: asyncio.Future[StreamResponse | None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(address, deque())
        waiters.append(waiter)
        handed: StreamResponse | None = None
        try:
            async with asyncio.timeout(self._pool_timeout_s):
                handed = await waiter
            return handed
        except TimeoutError:
            raise StreamBusy(
                f"all {self._max_open} connections to the {self.peer} stayed busy for"
                f" {self._pool_timeout_s:g} s"
            ) from None
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(address, None)
            if handed is None and waiter.done() and not waiter.cancelled():
                # Handed something but leaving anyway (cancelled or timed out as it came):
                # pass it on, so no connection or slot is lost with this caller.
                given = waiter.result()
                if given is None:
                    self._slot_freed(address)
                else:
                    self._pool(given)

    def _hand_over(self, address: str, conn: StreamResponse | None) -> bool:
        """Give a released connection (or a freed slot: None) to the oldest waiter, if any."""
        waiters = self._waiters.get(address)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    async def _exchange(self, conn: StreamResponse, request: bytes) -> StreamResponse:
        conn._send(request, self._idle_timeout_s)
        try:
            await conn._head()
        except BaseException:
            conn.close()
            raise
        return conn

    async def _connect(
        self, address: str, target: _Target, reserved: bool = False
    ) -> StreamResponse:
        """A new connection; `reserved`: its slot was handed over (already counted)."""
        loop = asyncio.get_running_loop()
        conn = StreamResponse(self, address)
        if not reserved:
            self._open[address] = self._open.get(address, 0) + 1  # counted while it opens
        context = None
        if target.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await loop.create_connection(
                    lambda: conn,
                    target.host,
                    target.port,
                    ssl=context,
                    server_hostname=target.host if context is not None else None,
                )
        except BaseException as exc:
            if conn._transport is None:  # never connected: no `connection_lost` will come
                self._slot_freed(address)
            else:  # connected as it was cancelled: close it (its close frees the slot)
                conn.close()
            if isinstance(exc, OSError | TimeoutError):  # ssl.SSLError included
                message = f"cannot reach the {self.peer}: {type(exc).__name__}"
                raise StreamConnectError(message) from exc
            raise
        return conn

    def _pool(self, conn: StreamResponse) -> None:
        if not self._closed and self._hand_over(conn._key, conn):
            return
        idle = self._idle.get(conn._key)
        if idle is None:
            idle = self._idle[conn._key] = []
        if self._closed or len(idle) >= self._max_idle:
            conn.close()
        else:
            idle.append(conn)

    def _slot_freed(self, address: str) -> None:
        """A slot under the cap is free: the oldest waiter takes it over (the count stays),
        else the count drops."""
        if self._hand_over(address, None):
            return
        left = self._open.get(address, 0) - 1
        if left > 0:
            self._open[address] = left
        else:
            self._open.pop(address, None)

    def open_connections(self, address: str) -> int:
        """Connections to `address` open or opening, in use or idle (for tests and metrics)."""
        return self._open.get(address, 0)

    def _discard(self, conn: StreamResponse) -> None:
        """An idle connection closed (by the worker, or by us): out of the pool."""
        idle = self._idle.get(conn._key)
        if idle is not None and conn in idle:
            idle.remove(conn)
            if not idle:
                del self._idle[conn._key]

    def lingering_connections(self) -> int:
        """Connections released whole, waiting for their response's last chunk (for tests)."""
        return len(self._lingering)

    def idle_connections(self, address: str) -> int:
        """How many idle connections to `address` are pooled (for tests and metrics)."""
        return len(self._idle.get(address, ()))

    async def aclose(self) -> None:
        """Close every pooled connection, and those waiting for their response's last chunk;
        connections in use close when released."""
        self._closed = True
        for idle in list(self._idle.values()):
            for conn in list(idle):
                conn.close()
        self._idle.clear()
        for conn in list(self._lingering):
            conn.close()
