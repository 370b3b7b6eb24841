"""The gateway's HTTP client to one worker: generate as a frame stream, and the control calls.

Failures are sorted into the two cases dispatch must tell apart: the worker
refused or lost the request (`WorkerUnavailable`: connection refused or
reset, a 503, a stream cut short) which may be retried elsewhere if nothing
reached the client yet, and the request itself being bad (the engine's
`InvalidRequestError`, a 400), which no other worker would accept either.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any, NoReturn

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
from hydrant.platform.dispatch.stream_client import (
    StreamBusy,
    StreamClient,
    StreamClientError,
    StreamConnectError,
    StreamSilent,
)

_encoder = msgspec.msgpack.Encoder()
_error_decoder = msgspec.json.Decoder(ErrorBody)
_SILENT = "the worker's stream went silent (no keep-alive): connection lost"


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

    `max_streams_per_worker`: generate streams open to one worker at once; more
    wait up to `pool_timeout_s` for one to end, then fail as `busy` (tried on
    another worker, and the worker is not marked unreachable).
    """

    def __init__(
        self,
        secret: str,
        read_timeout_s: float = 120.0,
        stream_idle_timeout_s: float = 30.0,
        max_streams_per_worker: int = 1024,
        pool_timeout_s: float = 30.0,
    ) -> None:
        self._headers = {SECRET_HEADER: secret}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=3.0, read=read_timeout_s, write=30.0, pool=30.0),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=256),
        )
        self._stream = StreamClient(
            "/generate",
            {SECRET_HEADER: secret, "content-type": MSGPACK_MEDIA_TYPE},
            connect_timeout_s=3.0,
            idle_timeout_s=stream_idle_timeout_s,
            max_idle_per_address=256,
            max_connections_per_address=max_streams_per_worker,
            pool_timeout_s=pool_timeout_s,
        )

    async def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The request's chunks; the last one is `finished`, or an exception says why not."""
        finished = False
        try:
            response = await self._stream.post(address, _encoder.encode(request))
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        try:
            if response.status != 200:
                _raise_refusal(response.status, await response.read_all())
            reader = FrameReader()
            while data := await response.read():
                for frame in reader.feed(data):
                    if frame.error is not None:
                        if frame.error.kind == "invalid":
                            raise InvalidRequestError(frame.error.message, frame.error.param)
                        raise WorkerUnavailable(frame.error.kind, frame.error.message)
                    if frame.chunk is None:
                        continue
                    if frame.chunk.finished:
                        finished = True
                    yield frame.chunk
                    if finished:
                        return
            raise WorkerUnavailable("lost", "the worker's stream ended before the request finished")
        except FrameError as exc:
            raise WorkerUnavailable("lost", f"garbled stream from the worker: {exc}") from exc
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        finally:
            response.release(finished)

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
            _raise_refusal(response.status_code, response.content)
        return response.json() if response.content else None

    async def abort(self, address: str, request_id: str) -> None:
        """Stop a request on the worker; one that already ended or a worker gone: nothing."""
        with contextlib.suppress(WorkerUnavailable):
            await self.call(address, "POST", f"/abort/{request_id}", timeout_s=5.0)

    async def aclose(self) -> None:
        await self._stream.aclose()
        await self._client.aclose()


def _stream_failure(exc: StreamClientError) -> WorkerUnavailable:
    """The stream client's failure in dispatch's terms (the reason labels the retry metric)."""
    if isinstance(exc, StreamConnectError):
        return WorkerUnavailable("connect", str(exc))
    if isinstance(exc, StreamBusy):  # the worker is not at fault: not marked unreachable
        return WorkerUnavailable("busy", str(exc))
    if isinstance(exc, StreamSilent):
        return WorkerUnavailable("silent", _SILENT)
    return WorkerUnavailable("lost", str(exc))


def _raise_refusal(status: int, body: bytes) -> NoReturn:
    """A worker's non-2xx answer as the error dispatch acts on."""
    if status == 401:
        raise WorkerUnavailable("unauthorized", "the worker refused the gateway's secret")
    try:
        error = _error_decoder.decode(body).error
    except msgspec.DecodeError:
        raise WorkerUnavailable("failed", f"worker answered HTTP {status}") from None
    if status == 400 and error.kind == "invalid":
        raise InvalidRequestError(error.message, error.param)
    reason = "unavailable" if status in (409, 503) else "failed"
    raise WorkerUnavailable(reason, error.message)
