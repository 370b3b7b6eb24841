"""Quota scripts answered inline: a blocking socket call while Redis answers fast enough.

Why block an event loop: every generation request waits for its ADMIT script before
it is dispatched, and through the loop that wait is not the script's (60-160 µs in
Redis) but the loop's queue. Measured in the gateway in front of an upstream vLLM at
20 requests/s (bench/upstream.py, 2 cores): the admission step took 0.9 ms at the
median and 6.8-11.8 ms at p90, because the reply, long arrived, waited behind the
streams' token writes the loop had queued meanwhile. Called inline, the gateway sleeps
in `recv` for the round trip alone (the core goes to Redis at once) and the loop is
held for that long: the step took 0.6 ms at the median and 1.2 ms at p90, its Python
work (the checks, the reply's rate-limit headers) included.

Blocking is only worth it while the round trip is short, so this stays a fast path
with a ceiling: `InlineRedis` times its calls and steps aside (the async client takes
the calls) when the median of 16 passes `ceiling_s` (a median: a call the scheduler
held up now and then is no reason), or at once when a call fails or times out
(`timeout_s`, short: the loop is held meanwhile); it tries again after `pause_s`. A
far or busy Redis is thus served through the loop as before. The host is looked up
through the loop (`resolve`), never inline. Only calls a request waits on before its
first token come here, and only while nobody else would wait on them: the quota store
asks for an admission inline while its request is alone in the admission path
(ingest_order.py); in a burst, inline calls made the admissions one after another where
the loop sends them together, and settlements, which nobody waits for, held the loop for
nothing.

Plain TCP only (`redis://`): a TLS handshake and records would hold the loop longer
than they save, so `rediss://` stays on the async client.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import hiredis
from redis import exceptions as redis_errors

from hydrant.platform.quotas.resp import RedisAddress, pack_command, reply_error

log = logging.getLogger(__name__)

_SAMPLE = 16  # the ceiling applies to the median of this many calls


class InlineRedis:
    """One blocking connection for quota scripts, used while its calls stay under the
    ceiling. `call` raises `InlineUnavailable` when the caller should go through the loop
    instead; `resolve` (async, before a call) looks the host up, so no name lookup ever
    blocks the loop."""

    def __init__(
        self,
        address: RedisAddress,
        *,
        ceiling_s: float,
        timeout_s: float = 0.05,
        pause_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if address.tls:
            raise ValueError("inline Redis calls are plain TCP only")
        self.address = address
        self.ceiling_s = ceiling_s
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self._clock = clock
        self._sock: socket.socket | None = None
        self._reader = hiredis.Reader()
        self._peer: tuple[int, Any] | None = None  # (family, sockaddr), once resolved
        self._took: list[float] = []  # the current sample's call times
        self._paused_until = 0.0
        self.stepped_aside = 0  # how often it gave the calls back to the loop

    @property
    def active(self) -> bool:
        """Whether calls may come here now (not within a pause)."""
        return self._clock() >= self._paused_until

    @property
    def resolved(self) -> bool:
        return self._peer is not None

    async def resolve(self) -> None:
        """The host's address, looked up through the loop (a name lookup may take seconds)."""
        loop = asyncio.get_running_loop()
        try:
            found = await loop.getaddrinfo(
                self.address.host, self.address.port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            self._step_aside(f"the host was not found: {exc}")
            raise InlineUnavailable(str(exc)) from exc
        family, _, _, _, sockaddr = found[0]
        self._peer = (family, sockaddr)

    def call(self, packed: bytes) -> Any:
        """The reply to one packed command. A Redis error reply is raised as redis-py's
        exception (the connection stays good); anything else that goes wrong raises
        `InlineUnavailable`, with this path paused. A kept connection that fails (Redis
        closed it while idle) is replaced once, as the loop's client does."""
        if not self.active or self._peer is None:
            raise InlineUnavailable("paused" if self._peer is not None else "not resolved")
        started = time.perf_counter()
        for attempt in (1, 2):
            kept = self._sock is not None
            try:
                reply = self._exchange(packed)
                break
            except TimeoutError as exc:  # the loop was held for timeout_s: no second try
                self._step_aside(f"no reply in {self.timeout_s * 1000:g} ms")
                raise InlineUnavailable(str(exc)) from exc
            except (OSError, redis_errors.RedisError) as exc:
                self.close()
                if not kept or attempt == 2:
                    self._peer = None  # looked up again after the pause: Redis may have moved
                    self._step_aside(f"the call failed: {type(exc).__name__}: {exc}")
                    raise InlineUnavailable(str(exc)) from exc
        took = self._took
        took.append(time.perf_counter() - started)
        if len(took) == _SAMPLE:
            median = statistics.median(took)
            took.clear()
            if median > self.ceiling_s:
                self._step_aside(f"its calls took {median * 1000:.2f} ms (median of {_SAMPLE})")
        if isinstance(reply, hiredis.ReplyError):
            raise reply_error(str(reply))
        return reply

    def _exchange(self, packed: bytes) -> Any:
        sock = self._sock if self._sock is not None else self._connect()
        sock.sendall(packed)
        return self._read_reply(sock)

    def _read_reply(self, sock: socket.socket) -> Any:
        while (reply := self._reader.gets()) is False:
            data = sock.recv(65536)
            if not data:
                raise redis_errors.ConnectionError("Redis closed the connection")
            self._reader.feed(data)
        return reply

    def _connect(self) -> socket.socket:
        assert self._peer is not None
        family, sockaddr = self._peer
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(sockaddr)
            self._reader = hiredis.Reader()
            for setup in self.address.setup_commands():
                sock.sendall(pack_command(setup))
                reply = self._read_reply(sock)
                if isinstance(reply, hiredis.ReplyError):
                    raise reply_error(str(reply))
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return sock

    def _step_aside(self, why: str) -> None:
        """Calls go through the loop for `pause_s`; the next try starts afresh."""
        log.info(
            "quota calls go through the event loop for a while",
            extra={"why": why, "pause_s": self.pause_s},
        )
        self.close()
        self.stepped_aside += 1
        self._paused_until = self._clock() + self.pause_s
        self._took.clear()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


class InlineUnavailable(Exception):
    """The inline path cannot take this call: make it through the event loop."""
