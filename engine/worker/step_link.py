"""One gateway's step stream on a worker: per engine step, one frame for all its requests.

A gateway holds one `POST /steps` response open per worker (its link) and
admits requests on it with short `POST /admit` calls. The worker writes on
the link, whenever the engine produced anything for that gateway, ONE frame
with every delta, finish, usage and error of that gateway's requests: per
step one write in the worker and one parse in the gateway, instead of one
per running request. A link that has nothing to say for `keepalive_s` sends
an empty frame, so the gateway can tell a silent (dead) link from an idle one.

Request ids are the gateway's: two gateways may use the same one. So the
engine runs each request under `<request id>@<link id>`, and a link only ever
sees (and aborts) its own. When the link's connection goes away (the gateway
closed it, or died) every request it still holds is aborted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec

from hydrant.engine.async_engine import EngineShutdownError, RequestStream
from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.inprocess import to_chunk
from hydrant.engine.protocol import GenerateChunk, GenerateRequest
from hydrant.engine.sleep_mode import EngineSleepingError
from hydrant.engine.worker.runtime import WorkerRuntime, WorkerUnavailableError
from hydrant.engine.worker.wire import (
    KEEPALIVE_FRAME,
    Entry,
    ErrorKind,
    Frame,
    StreamError,
    encode_frame,
)

log = logging.getLogger(__name__)

# The engine's "not now" answers: the gateway may run the request elsewhere.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    WorkerUnavailableError,
    EngineShutdownError,
    EngineSleepingError,
)


class _Admitted:
    """A request a link holds; called by its engine stream whenever output is waiting."""

    __slots__ = ("link", "request_id", "started", "stream")

    def __init__(self, link: StepLink, request_id: str, stream: RequestStream) -> None:
        self.link = link
        self.request_id = request_id
        self.stream = stream
        self.started = False

    def __call__(self) -> None:
        link = self.link
        link._ready[self.request_id] = self
        link._wake.set()


class StepLink:
    def __init__(self, link_id: str, runtime: WorkerRuntime, links: StepLinks) -> None:
        self.link_id = link_id
        self._runtime = runtime
        self._links = links
        self._admitted: dict[str, _Admitted] = {}
        self._ready: dict[str, _Admitted] = {}  # ordered set: output waiting to be framed
        self._wake = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._admitted)

    async def admit(self, request: GenerateRequest) -> None:
        """Start the request; a refusal (bad request, worker away) raises here, at once."""
        if self.closed:
            raise WorkerUnavailableError("the gateway's link to this worker is closed")
        request_id = request.request_id
        if request_id in self._admitted:
            raise InvalidRequestError(f"request id {request_id!r} is already running", None)
        engine_request = msgspec.structs.replace(request, request_id=f"{request_id}@{self.link_id}")
        stream = await self._runtime.open(engine_request)
        if self.closed or request_id in self._admitted:  # while it was checked
            stream.close()
            raise WorkerUnavailableError("the gateway's link to this worker is closed")
        admitted = _Admitted(self, request_id, stream)
        self._admitted[request_id] = admitted
        self._runtime.enter()
        stream.on_ready = admitted

    async def abort(self, request_id: str) -> None:
        """The gateway gave up on the request: it ends with finish reason "abort"."""
        if request_id in self._admitted:
            await self._runtime.abort(f"{request_id}@{self.link_id}")

    async def frames(self) -> AsyncIterator[bytes]:
        """The link's frames until it closes: one per wake-up, holding all that is ready."""
        keepalive_s = self._runtime.options.keepalive_s
        loop = asyncio.get_running_loop()
        try:
            yield KEEPALIVE_FRAME  # the gateway knows at once that the link is up
            while not self.closed:
                if not self._ready:
                    self._wake.clear()
                    timer = loop.call_later(keepalive_s, self._wake.set)
                    try:
                        await self._wake.wait()
                    finally:
                        timer.cancel()
                if self._ready:
                    yield self._frame()
                elif not self.closed:
                    yield KEEPALIVE_FRAME
        finally:
            self.close()

    def _frame(self) -> bytes:
        ready, self._ready = self._ready, {}
        entries = []
        for admitted in ready.values():
            entry = self._take(admitted)
            if entry is not None:
                entries.append(entry)
        return encode_frame(Frame(entries=entries)) if entries else KEEPALIVE_FRAME

    def _take(self, admitted: _Admitted) -> Entry | None:
        request_id = admitted.request_id
        try:
            output = admitted.stream.take()
        except Exception as exc:
            self._end(admitted)
            return Entry(request_id=request_id, error=_stream_error(exc, admitted.started))
        if output is None:
            return None
        chunk = to_chunk(output, request_id)
        if not admitted.started and _given_back(self._runtime, chunk):
            self._end(admitted)
            message = "the worker drained before running the request"
            return Entry(
                request_id=request_id, error=StreamError(kind="unavailable", message=message)
            )
        admitted.started = True
        if chunk.finished:
            self._end(admitted)
        return Entry(request_id=request_id, chunk=chunk)

    def _end(self, admitted: _Admitted) -> None:
        if self._admitted.pop(admitted.request_id, None) is admitted:
            admitted.stream.close()
            self._runtime.leave()

    def close(self) -> None:
        """The link is gone: abort what it still holds (idempotent)."""
        if not self.closed:
            self.closed = True
            self._wake.set()
            self._links.forget(self)
        for admitted in list(self._admitted.values()):
            self._end(admitted)  # an unfinished stream's close aborts its request
        self._ready.clear()


class StepLinks:
    """The worker's open links by id; a reconnecting gateway brings a fresh id."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self._runtime = runtime
        self._links: dict[str, StepLink] = {}

    def open(self, link_id: str) -> StepLink:
        if link_id in self._links:
            raise InvalidRequestError(f"link {link_id!r} is already open", "link_id")
        link = self._links[link_id] = StepLink(link_id, self._runtime, self)
        return link

    def get(self, link_id: str) -> StepLink | None:
        return self._links.get(link_id)

    def forget(self, link: StepLink) -> None:
        if self._links.get(link.link_id) is link:
            del self._links[link.link_id]

    def close(self) -> None:
        """End every link (the worker stops): their responses end, connections close."""
        for link in list(self._links.values()):
            link.close()

    def __len__(self) -> int:
        return len(self._links)


def _given_back(runtime: WorkerRuntime, first: GenerateChunk) -> bool:
    """A request a draining worker aborted before it ran: nothing was produced, so retry it."""
    produced = any(c.token_ids for c in first.choices)
    reasons = {c.finish_reason for c in first.choices}
    return runtime.state == "draining" and first.finished and not produced and reasons == {"abort"}


def _stream_error(exc: Exception, started: bool) -> StreamError:
    """Why a request's part of the link ended without a finished chunk."""
    if isinstance(exc, InvalidRequestError):
        kind: ErrorKind = "failed" if started else "invalid"  # refused at the start
        return StreamError(kind=kind, message=exc.message, param=exc.param)
    if isinstance(exc, UNAVAILABLE):
        return StreamError(kind="unavailable", message=str(exc) or "the worker stopped")
    log.error("generation failed in the worker", exc_info=exc)
    return StreamError(kind="failed", message=type(exc).__name__)
