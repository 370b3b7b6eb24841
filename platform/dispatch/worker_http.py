"""The gateway's HTTP client to one worker: generate as a frame stream, and the control calls.

Failures are sorted into the two cases dispatch must tell apart: the worker
refused or lost the request (`WorkerUnavailable`: connection refused or
reset, a 503, a stream cut short) which may be retried elsewhere if nothing
reached the client yet, and the request itself being bad (the engine's
`InvalidRequestError`, a 400), which no other worker would accept either.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import httpx
import msgspec

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import GenerateChunk, GenerateRequest
from hydrant.engine.worker.wire import (
    MSGPACK_MEDIA_TYPE,
    SECRET_HEADER,
    ErrorBody,
    FrameError,
    FrameReader,
)

_encoder = msgspec.msgpack.Encoder()
_error_decoder = msgspec.json.Decoder(ErrorBody)


class WorkerUnavailable(Exception):
    """The worker did not run (or did not finish) the request; `reason` labels the metric."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class WorkerHttp:
    """`stream_idle_timeout_s`: the longest a generate stream may stay silent.

    A worker sends a keep-alive frame every couple of seconds while a request
    queues or prefills, so a stream silent for longer is a connection that died
    without a reset (a network partition, a half-open socket): the request is
    treated as lost then (retried if nothing was produced), not after minutes.
    """

    def __init__(
        self, secret: str, read_timeout_s: float = 120.0, stream_idle_timeout_s: float = 30.0
    ) -> None:
        self._headers = {SECRET_HEADER: secret}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=3.0, read=read_timeout_s, write=30.0, pool=30.0),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=256),
        )
        self._stream_timeout = httpx.Timeout(
            connect=3.0, read=stream_idle_timeout_s, write=30.0, pool=30.0
        )

    async def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The request's chunks; the last one is `finished`, or an exception says why not."""
        try:
            async with self._client.stream(
                "POST",
                f"{address}/generate",
                content=_encoder.encode(request),
                headers={**self._headers, "content-type": MSGPACK_MEDIA_TYPE},
                timeout=self._stream_timeout,
            ) as response:
                if response.status_code != 200:
                    await _raise_refusal(response)
                reader = FrameReader()
                async for data in response.aiter_raw():
                    for frame in reader.feed(data):
                        if frame.error is not None:
                            if frame.error.kind == "invalid":
                                raise InvalidRequestError(frame.error.message, frame.error.param)
                            raise WorkerUnavailable(frame.error.kind, frame.error.message)
                        if frame.chunk is None:
                            continue
                        yield frame.chunk
                        if frame.chunk.finished:
                            return
                raise WorkerUnavailable(
                    "lost", "the worker's stream ended before the request finished"
                )
        except FrameError as exc:
            raise WorkerUnavailable("lost", f"garbled stream from the worker: {exc}") from exc
        except httpx.ConnectError as exc:
            raise WorkerUnavailable(
                "connect", f"cannot reach the worker: {type(exc).__name__}"
            ) from exc
        except httpx.ReadTimeout as exc:
            raise WorkerUnavailable(
                "silent", "the worker's stream went silent (no keep-alive): connection lost"
            ) from exc
        except httpx.TransportError as exc:
            raise WorkerUnavailable(
                "lost", f"connection to the worker broke: {type(exc).__name__}"
            ) from exc

    async def call(
        self, address: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
    ) -> Any:
        """A control call (`/abort/..`, `/sleep`, `/wake`, `/drain`, `/stats`); its JSON answer."""
        try:
            response = await self._client.request(
                method,
                f"{address}{path}",
                content=None if body is None else msgspec.json.encode(body),
                headers=self._headers,
                timeout=timeout_s,
            )
        except httpx.TransportError as exc:
            raise WorkerUnavailable(
                "connect", f"cannot reach the worker: {type(exc).__name__}"
            ) from exc
        if response.status_code >= 400:
            await _raise_refusal(response)
        return response.json() if response.content else None

    async def aclose(self) -> None:
        await self._client.aclose()


async def _raise_refusal(response: httpx.Response) -> None:
    raw = await response.aread()
    if response.status_code == 401:
        raise WorkerUnavailable("unauthorized", "the worker refused the gateway's secret")
    try:
        error = _error_decoder.decode(raw).error
    except msgspec.DecodeError:
        raise WorkerUnavailable("failed", f"worker answered HTTP {response.status_code}") from None
    if response.status_code == 400 and error.kind == "invalid":
        raise InvalidRequestError(error.message, error.param)
    reason = "unavailable" if response.status_code in (409, 503) else "failed"
    raise WorkerUnavailable(reason, error.message)
