"""The gateway's HTTP client to workers: generate over one step stream per worker, and the
control calls.

Per worker this gateway holds one link (`WorkerLink`: a `POST /steps`
response kept open, on which the worker writes one frame per engine step for
all of this gateway's requests) and admits each request with a short `POST
/admit`; a request the gateway gives up on is aborted with `POST /cancel`.

Failures are sorted into the two cases dispatch must tell apart: the worker
refused or lost the request (`WorkerUnavailable`: connection refused or
reset, a 503, a link cut short or gone silent) which may be retried elsewhere
if nothing reached the client yet, and the request itself being bad (the
engine's `InvalidRequestError`, a 400), which no other worker would accept
either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncGenerator
from typing import Any, NoReturn

import httpx
import msgspec

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import GenerateChunk, GenerateRequest
from hydrant.engine.worker.wire import (
    MSGPACK_MEDIA_TYPE,
    SECRET_HEADER,
    Admission,
    Cancellation,
    ErrorBody,
    LinkOpening,
)
from hydrant.platform.dispatch.stream_client import (
    StreamBusy,
    StreamClient,
    StreamClientError,
    StreamConnectError,
    StreamSilent,
)
from hydrant.platform.dispatch.worker_link import WorkerLink, WorkerUnavailable

__all__ = ["WorkerHttp", "WorkerUnavailable"]

log = logging.getLogger(__name__)

_encoder = msgspec.msgpack.Encoder()
_error_decoder = msgspec.json.Decoder(ErrorBody)
_SILENT = "the worker's stream went silent (no keep-alive): connection lost"
_MAX_LINKS_PER_WORKER = 8  # one in use; a few more while a broken one is still closing


class WorkerHttp:
    """`stream_idle_timeout_s`: the longest a worker's link may stay silent.

    A worker sends a keep-alive frame every couple of seconds on an idle link,
    so a link silent for longer is a connection that died without a reset (a
    network partition, a half-open socket): every request on it is treated as
    lost then (retried if nothing was produced), not after minutes.

    `max_streams_per_worker`: admit and cancel calls open to one worker at
    once; more wait up to `pool_timeout_s` for one to end, then fail as `busy`
    (tried on another worker, and the worker is not marked unreachable).
    """

    # The control calls that put a worker to sleep and wake it (`MemberHttp`'s paths).
    sleep_path = "/sleep"
    wake_path = "/wake"

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
        fields = {SECRET_HEADER: secret, "content-type": MSGPACK_MEDIA_TYPE}
        self._steps = StreamClient(
            "/steps",
            fields,
            idle_timeout_s=stream_idle_timeout_s,
            max_idle_per_address=0,
            max_connections_per_address=_MAX_LINKS_PER_WORKER,
            pool_timeout_s=pool_timeout_s,
        )
        self._admit = self._short_calls("/admit", fields, max_streams_per_worker, pool_timeout_s)
        self._cancel = self._short_calls("/cancel", fields, max_streams_per_worker, pool_timeout_s)
        self._links: dict[str, WorkerLink] = {}
        self._opening: dict[str, asyncio.Task[WorkerLink]] = {}
        self._background: set[asyncio.Task[None]] = set()

    @staticmethod
    def _short_calls(
        path: str, fields: dict[str, str], cap: int, pool_timeout_s: float
    ) -> StreamClient:
        return StreamClient(
            path,
            fields,
            idle_timeout_s=30.0,
            max_idle_per_address=256,
            max_connections_per_address=cap,
            pool_timeout_s=pool_timeout_s,
        )

    async def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The request's chunks; the last one is `finished`, or an exception says why not."""
        link = await self._link(address)
        request_id = request.request_id
        feed = link.register(request_id)
        settled = False  # the worker holds nothing of it any more: no abort needed
        try:
            try:
                await self._post(self._admit, address, Admission(link.link_id, request))
            except InvalidRequestError:
                settled = True  # refused: nothing runs (an admission whose answer was lost
                raise  # may have started, so other failures still send a cancel)
            while True:
                entry = await feed.get()
                if entry.error is not None:
                    settled = True
                    if entry.error.kind == "invalid":
                        raise InvalidRequestError(entry.error.message, entry.error.param)
                    raise WorkerUnavailable(entry.error.kind, entry.error.message)
                chunk = entry.chunk
                if chunk is None:
                    continue
                if chunk.finished:
                    settled = True
                yield chunk
                if settled:
                    return
        except WorkerUnavailable as exc:
            settled = settled or exc is link.failure  # the link is gone: so is the request
            raise
        finally:
            link.unregister(request_id)
            if not settled and not feed.cancelled and link.failure is None:
                self._send_cancel(link, request_id)

    async def abort(self, address: str, request_id: str) -> None:
        """Abort a running request (the client went away); its stream ends with "abort"."""
        link = self._links.get(address)
        feed = None if link is None else link.feeds.get(request_id)
        if link is not None and feed is not None and not feed.cancelled:
            feed.cancelled = True
            await self._post(self._cancel, address, Cancellation(link.link_id, request_id))

    def _send_cancel(self, link: WorkerLink, request_id: str) -> None:
        async def cancel() -> None:
            with contextlib.suppress(WorkerUnavailable, InvalidRequestError):
                await self._post(self._cancel, link.address, Cancellation(link.link_id, request_id))

        task = asyncio.get_running_loop().create_task(cancel())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _link(self, address: str) -> WorkerLink:
        """This gateway's open link to the worker; opened (once for all waiters) if none."""
        link = self._links.get(address)
        if link is not None and link.failure is None:
            return link
        opening = self._opening.get(address)
        if opening is None:
            opening = asyncio.get_running_loop().create_task(self._open_link(address))
            self._opening[address] = opening
            opening.add_done_callback(lambda _: self._opening.pop(address, None))
        return await asyncio.shield(opening)

    async def _open_link(self, address: str) -> WorkerLink:
        link_id = secrets.token_hex(8)
        try:
            response = await self._steps.post(address, _encoder.encode(LinkOpening(link_id)))
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        if response.status != 200:
            try:
                body = await response.read_all()
            except StreamClientError as exc:
                raise _stream_failure(exc) from exc
            finally:
                response.release(False)
            _raise_refusal(response.status, body)
        link = WorkerLink(address, link_id, response, _stream_failure, self._forget)
        self._links[address] = link
        return link

    def _forget(self, link: WorkerLink) -> None:
        if self._links.get(link.address) is link:
            del self._links[link.address]

    def open_links(self) -> int:
        """Links open to workers (for tests and metrics)."""
        return len(self._links)

    async def _post(self, client: StreamClient, address: str, body: Any) -> None:
        """A short msgpack POST whose 200 answer carries nothing dispatch needs."""
        try:
            response = await client.post(address, _encoder.encode(body))
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        released = False
        try:
            data = await response.read_all()
            response.release(True)
            released = True
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        finally:
            if not released:
                response.release(False)
        if response.status != 200:
            _raise_refusal(response.status, data)

    async def call(
        self, address: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
    ) -> Any:
        """A control call (`/sleep`, `/wake`, `/drain`, `/stats`); its JSON answer."""
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

    async def aclose(self) -> None:
        for task in list(self._background) + list(self._opening.values()):
            task.cancel()
        for link in list(self._links.values()):
            await link.aclose()
        await self._steps.aclose()
        await self._admit.aclose()
        await self._cancel.aclose()
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
