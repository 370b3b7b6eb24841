"""A lean Redis client for the quota scripts: EVALSHA over one pipelined connection.

Why not redis-py for these calls: every gateway request runs two scripts
(admit before, settle after), and redis-py's asyncio path (pool checkout,
retry wrapper, command packing, parser plumbing) cost ~0.35 ms of CPU per
call in a profile of the gateway, more than the script itself. Here a call is
one `hiredis.pack_command`, one write and one future completed from
`data_received` by hiredis's C reader: the replies of a RESP connection come
back in the order the commands went out, so any number of concurrent calls
share the connection without a pool. redis-py stays for everything else.
While Redis answers fast enough, a call is made inline instead (a blocking call on a
connection of its own, inline_redis.py: through the loop, the reply waits its turn
behind everything else the loop has queued), and through the loop otherwise.

Failures use redis-py's exception types, so callers keep one vocabulary: a
refused or dropped connection is `ConnectionError`, an unanswered call past
`timeout_s` is `TimeoutError` (the connection is then dropped, failing what
else waited on it, because a late reply would be read as the answer to a
later command). A call that fails that way is retried once on a new
connection, as the redis-py client it replaces was configured to; a lost
reply can hide a script that ran, which the quota scripts tolerate (see
redis_backend.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import hiredis
from redis import exceptions as redis_errors

from hydrant.platform.quotas.inline_redis import InlineRedis, InlineUnavailable
from hydrant.platform.quotas.resp import RedisAddress, pack_command, reply_error

__all__ = ["LuaScript", "RedisAddress", "RedisScriptClient"]

RETRY_DELAY_S = 0.01


@dataclass(frozen=True)
class LuaScript:
    """A script's source and its SHA1, the name EVALSHA calls it by."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False)  # Redis's script name
        object.__setattr__(self, "sha", digest.hexdigest())


class _RespProtocol(asyncio.Protocol):
    """One connection: commands out in order, replies matched to waiting futures in order."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._reader = hiredis.Reader()
        self._waiting: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self._transport: asyncio.Transport | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.lost: BaseException | None = None

    @property
    def usable(self) -> bool:
        return self._transport is not None and self.lost is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Write one packed command; the future gets its reply (or the connection's failure)."""
        if self._transport is None or self.lost is not None:
            raise redis_errors.ConnectionError("the Redis connection is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((time.monotonic(), future))
        self._transport.write(packed)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self._timeout_s, self._check_timeout)
        return future

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self._fail(redis_errors.ConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not self._waiting:  # nobody asked: the stream is out of step
                self._fail(redis_errors.ConnectionError("an unexpected reply from Redis"))
                return
            _, future = self._waiting.popleft()
            if future.done():
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(reply_error(str(reply)))
            else:
                future.set_result(reply)

    def _check_timeout(self) -> None:
        """The oldest call is the next to be answered: only it needs watching."""
        self._watchdog = None
        if not self._waiting or self.lost is not None:
            return
        sent_at, _ = self._waiting[0]
        late_by = time.monotonic() - sent_at - self._timeout_s
        if late_by >= 0:
            self._fail(redis_errors.TimeoutError(f"no reply from Redis in {self._timeout_s:g} s"))
            return
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(-late_by, self._check_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(redis_errors.ConnectionError(f"the Redis connection was lost: {exc}"))

    def _fail(self, error: redis_errors.RedisError) -> None:
        if self.lost is None:
            self.lost = error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        waiting, self._waiting = self._waiting, deque()
        for _, future in waiting:
            if not future.done():
                future.set_exception(error)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(redis_errors.ConnectionError("the Redis client is closed"))


class RedisScriptClient:
    """Runs Lua scripts by SHA (loading them on NOSCRIPT) over one shared connection, or
    inline (a blocking call, inline_redis.py) while `inline_ceiling_s` > 0 and Redis
    answers within it."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 1.0,
        connect_timeout_s: float = 1.0,
        inline_ceiling_s: float = 0.0,
    ) -> None:
        self.address = RedisAddress.from_url(url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.inline: InlineRedis | None = None
        if inline_ceiling_s > 0 and not self.address.tls:
            self.inline = InlineRedis(self.address, ceiling_s=inline_ceiling_s)
        self._protocol: _RespProtocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False

    async def evalsha(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[str | int | float],
        *,
        inline: bool = True,
    ) -> Any:
        """`EVALSHA` (or `EVAL` when the server does not know the script yet). `inline`:
        the call may be made inline, where this client has an inline path; False when
        nobody waits for its answer, or others wait to make theirs (the caller knows)."""
        tail = (len(keys), *keys, *args)
        try:
            return await self._call(("EVALSHA", script.sha, *tail), inline)
        except redis_errors.NoScriptError:  # a new or flushed server: EVAL also caches it
            return await self._call(("EVAL", script.source, *tail), inline)

    async def _call(self, command: Sequence[Any], may_inline: bool) -> Any:
        packed = pack_command(command)
        inline = self.inline if may_inline else None
        if inline is not None and inline.active and not self._closed:
            with contextlib.suppress(InlineUnavailable):  # it paused itself: through the loop
                if not inline.resolved:
                    await inline.resolve()
                return inline.call(packed)
        for attempt in (1, 2):
            try:
                protocol = self._protocol
                if protocol is None or not protocol.usable:
                    protocol = await self._connect()
                return await protocol.send(packed)
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                if attempt == 2 or self._closed:
                    raise
                await asyncio.sleep(RETRY_DELAY_S)
        raise AssertionError("unreachable")

    async def _connect(self) -> _RespProtocol:
        if self._closed:
            raise redis_errors.ConnectionError("the Redis client is closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # concurrent callers share one new connection
            current = self._protocol
            if current is not None and current.usable:
                return current
            protocol = await self._open()
            self._protocol = protocol
            return protocol

    async def _open(self) -> _RespProtocol:
        address = self.address
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _RespProtocol(self.timeout_s),
                    address.host,
                    address.port,
                    ssl=ssl.create_default_context() if address.tls else None,
                ),
                self.connect_timeout_s,
            )
        except TimeoutError as exc:
            raise redis_errors.TimeoutError(
                f"connecting to Redis took over {self.connect_timeout_s:g} s"
            ) from exc
        except OSError as exc:
            raise redis_errors.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        try:
            for command in address.setup_commands():
                await protocol.send(pack_command(command))
        except BaseException:
            protocol.close()
            raise
        return protocol

    async def aclose(self) -> None:
        self._closed = True
        if self.inline is not None:
            self.inline.close()
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            with contextlib.suppress(Exception):
                protocol.close()
