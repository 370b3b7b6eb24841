"""Limits on what a client can make the gateway hold: header size, slow bodies, CORS.

Why in the app and not only in the server: the server's limits (the request
head bound and deadline of `server_protocol.py`, uvicorn's `timeout_keep_alive`,
set by `hydrant serve`) cover heads still arriving and idle connections, but no
server setting
stops a client that sends its headers and then trickles (or never sends) the
body: the handler would wait on `receive()` for ever, holding a connection, a
task and a database session. So the body is read under a timeout here (408),
and headers are measured here too (431), whatever server runs the app.

CORS is closed unless origins are named: the API is called with bearer keys
from servers, not browsers, and an open CORS policy would let any page a
logged-in admin visits drive the API.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar.config.cors import CORSConfig
from litestar.exceptions import HTTPException
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from hydrant.errors import ConfigurationError
from hydrant.platform.http.ingest import ingest_middleware
from hydrant.platform.quotas.ingest_order import IngestGate
from hydrant.platform.quotas.rate_headers import HEADER_NAMES as RATE_LIMIT_HEADERS
from hydrant.settings import Settings


class RequestHeaderFieldsTooLarge(HTTPException):
    status_code = 431


class RequestTimeout(HTTPException):
    status_code = 408


def header_bytes(scope: Scope) -> int:
    """Bytes of the request line's target and every header, as they came over the wire."""
    target = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
    return target + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))


class _TimedReceive:
    """`receive` under one deadline for the whole body, then unchanged (after the body,
    `receive` only waits for a disconnect, e.g. during a long stream).

    One deadline, not one per message: a client trickling a byte a second would
    reset a per-message timeout for ever.
    """

    def __init__(self, receive: Receive, timeout_s: float) -> None:
        self._receive = receive
        self._timeout_s = timeout_s
        self._deadline: float | None = None
        self._body_done = False

    async def __call__(self) -> ReceiveMessage:
        if self._body_done:
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._timeout_s
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            self._body_done = True
            raise RequestTimeout(
                detail=f"the request body did not arrive within {self._timeout_s:g} s"
            ) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._body_done = True
        return message


def hardening_middleware(settings: Settings) -> list[Any]:
    """The app's ASGI middleware for `settings` (a list for `Litestar(middleware=…)`)."""
    max_header = settings.max_header_bytes
    timeout_s = settings.body_read_timeout_s
    if max_header < 1024:
        raise ConfigurationError("HYDRANT_MAX_HEADER_BYTES must be at least 1024")
    if not timeout_s > 0:
        raise ConfigurationError("HYDRANT_BODY_READ_TIMEOUT_S must be a positive number")
    if settings.ingest_concurrency < 0:
        raise ConfigurationError("HYDRANT_INGEST_CONCURRENCY must be 0 (off) or more")

    def limits(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if header_bytes(scope) > max_header:
                raise RequestHeaderFieldsTooLarge(
                    detail=f"request headers are larger than {max_header} bytes"
                )
            await app(scope, _TimedReceive(receive, timeout_s), send)

        return middleware

    if settings.ingest_concurrency == 0:
        return [limits]
    # inside `limits`: the body it reads first is read under the deadline
    gate = IngestGate(settings.ingest_concurrency)
    return [limits, ingest_middleware(gate, settings.max_request_body_bytes)]


def cors_origins(settings: Settings) -> list[str]:
    origins = [o.strip().rstrip("/") for o in settings.cors_origins.split(",") if o.strip()]
    for origin in origins:
        if origin == "*" or not origin.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"HYDRANT_CORS_ORIGINS: {origin!r} is not an origin like https://app.example.com"
                " (a wildcard is refused: name each origin)"
            )
    return origins


def cors_config(settings: Settings) -> CORSConfig | None:
    """None (no CORS headers: browsers refuse cross-origin reads) unless origins are named."""
    origins = cors_origins(settings)
    if not origins:
        return None
    return CORSConfig(
        allow_origins=origins,
        allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        allow_headers=["authorization", "content-type", "x-request-id"],
        expose_headers=["x-request-id", "retry-after", *RATE_LIMIT_HEADERS],
        allow_credentials=False,
    )
