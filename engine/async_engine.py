"""The asyncio front of the engine: `generate()` streams, a background task steps.

`LLMEngine.step()` blocks for the length of a forward, so it runs on one
dedicated worker thread (always the same one: torch state and the engine stay
single-threaded) while the event loop keeps serving HTTP. That thread steps
back to back while there is work (`_steps`): it hands each step's outputs to
the loop (`call_soon_threadsafe`) and goes straight on to the next step, so
the loop's other work (writing frames, admitting requests) overlaps the next
forward instead of sitting between two steps. Measured in a worker under
bench/serving.py, a round trip through the loop between steps took 0.9 ms at
the median beside a 4.3 ms decode step, more under load. New requests and
aborts are queued by the loop (under a lock) and applied by the step thread
between its steps, so the engine is only ever touched by that thread, and
`generate()` still raises a bad request's error at once, because the
validation it runs is read-only. The `Request` it is given is the one the
engine queues: checked here once, then added as it is.

A consumer that stops iterating (a client that disconnected) aborts its
request, so its blocks are freed at the next step boundary.

Each request has one slot, not a queue: outputs its reader has not taken yet
are merged into one (`merge_outputs`), so the engine loop never waits for
readers and a slow one (a slow HTTP client, a busy gateway) reads one output
with everything new instead of a backlog of one per step. `open()` hands out
the slot as a `RequestStream`: `next()` waits for it, `take()` reads what is
there without waiting, and `on_ready` tells a reader that serves many streams
(a worker's link to a gateway) when to take; `generate()` is `next()` as an
async iterator.

Sleep mode: `sleep()` stops admitting work at once (new `generate()` calls
raise `EngineSleepingError`), lets the requests already accepted finish, then
frees the KV cache and moves the weights off the device on the engine thread;
`wake()` restores them (no disk read) and admits work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.output_constraints import raise_if_invalid
from hydrant.engine.outputs import RequestOutput, merge_outputs
from hydrant.engine.protocol import AdapterRef, EngineStats
from hydrant.engine.sequence import Request
from hydrant.engine.sleep_mode import EngineSleepingError

logger = logging.getLogger(__name__)


class EngineShutdownError(EngineError):
    """The engine was shut down while (or before) the request ran."""


class RequestStream:
    """One running request's outputs, read as they come, merged while unread.

    The engine loop `put`s every step's output and never blocks: what the
    reader has not taken yet is merged into one output. `next()` returns it
    (and raises the request's error once no output is left); `close()` aborts
    the request if it has not finished. One reader per stream.
    """

    __slots__ = (
        "_closed",
        "_error",
        "_event",
        "_front",
        "_output",
        "finished",
        "on_ready",
        "request_id",
    )

    def __init__(self, front: AsyncLLMEngine, request_id: str) -> None:
        self._front = front
        self.request_id = request_id
        self._event = asyncio.Event()
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.finished = False  # the reader has taken the final output (or the error)
        # Called when output (or the error) arrives, for a reader that serves many streams
        # and waits on one event of its own (a worker's step link) instead of on `next`.
        self.on_ready: Callable[[], None] | None = None

    def put(self, output: RequestOutput) -> None:
        pending = self._output
        self._output = output if pending is None else merge_outputs(pending, output)
        self._event.set()
        if self.on_ready is not None:
            self.on_ready()

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            self._event.set()
            if self.on_ready is not None:
                self.on_ready()

    async def next(self) -> RequestOutput:
        """Everything produced since the last call, as one output (waits for some).
        Raises the request's error once its outputs are read."""
        while True:
            if self._output is None and self._error is None:
                self._event.clear()
                await self._event.wait()
            output = self.take()
            if output is not None:
                return output

    def take(self) -> RequestOutput | None:
        """What is waiting, without waiting: the merged output, None if nothing; raises the
        request's error once its outputs are read."""
        output, self._output = self._output, None
        if output is not None:
            self.finished = output.finished
            return output
        if self._error is not None:
            self.finished = True
            raise self._error
        return None

    def close(self) -> None:
        """Stop reading: an unfinished request is aborted (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._front._release(self)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._streams: dict[str, RequestStream] = {}
        # Checked requests to add and ids to abort, taken by the step thread between steps.
        self._queued = threading.Lock()
        self._new: list[Request] = []
        self._aborts: list[str] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hydrant-engine")
        self._closed = False
        self._refusing = False  # asleep, falling asleep or waking: no new work
        self._lifecycle = asyncio.Lock()  # one sleep or wake at a time
        self._progress = asyncio.Event()  # set as each step's outputs arrive and when idle

    def start(self) -> None:
        """Start the stepping task (idempotent; needs a running event loop)."""
        if self._closed:
            raise EngineShutdownError("the engine has been shut down")
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="hydrant-engine")

    async def shutdown(self) -> None:
        """Stop stepping, end every request with "abort", release the worker thread."""
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        with self._queued:
            self._new.clear()
        self._dispatch(self.engine.abort_all("abort"))
        for stream in self._streams.values():
            stream.fail(EngineShutdownError("the engine was shut down"))
        self._executor.shutdown(wait=False)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    # ---- sleep mode -----------------------------------------------------------------------

    @property
    def is_sleeping(self) -> bool:
        """True from the moment `sleep()` is called until `wake()` has finished:
        exactly the span in which `generate()` refuses work."""
        return self._refusing

    async def sleep(self) -> None:
        """Refuse new work, wait for the accepted requests, then free KV and device weights."""
        async with self._lifecycle:
            if self._closed:
                raise EngineShutdownError("the engine has been shut down")
            self._refusing = True
            if self.engine.is_sleeping:
                return
            started = False
            try:
                await self._drain()
                started = True
                loop = asyncio.get_running_loop()
                # the engine thread cannot be interrupted: once it sleeps, it finishes
                await asyncio.shield(loop.run_in_executor(self._executor, self.engine.sleep))
            except asyncio.CancelledError:
                # cancelled while draining: still awake, keep serving; cancelled while the
                # thread puts the engine to sleep: it will be asleep, keep refusing
                self._refusing = started
                raise
            except BaseException:
                self._refusing = self.engine.is_sleeping  # the sleep failed: serve on
                raise

    async def wake(self) -> None:
        """Weights back on the device from the host copy, KV re-allocated, work admitted."""
        async with self._lifecycle:
            if self._closed:
                raise EngineShutdownError("the engine has been shut down")
            if self.engine.is_sleeping:
                loop = asyncio.get_running_loop()
                # not interruptible either; a wake cancelled here leaves the engine awake
                # but refusing until the next wake() (which then only admits work)
                await asyncio.shield(loop.run_in_executor(self._executor, self.engine.wake))
            self._refusing = False

    async def _drain(self) -> None:
        """Return once every accepted request has finished (their outputs are queued)."""
        while self._new or self.engine.has_unfinished():
            self._progress.clear()
            self.start()
            self._wakeup.set()
            await self._progress.wait()

    async def open(self, request: Request) -> RequestStream:
        """Queue the request and return its stream; a bad request raises here, at once."""
        if self._closed:
            raise EngineShutdownError("the engine has been shut down")
        if self._refusing:
            raise EngineSleepingError("the engine is asleep; it takes no request until woken")
        self.engine.validator.check(request)
        constraint = request.params.structured_output
        if constraint is not None:  # off the loop; the step thread's guide reuses it (cached)
            await asyncio.to_thread(raise_if_invalid, *constraint)
        if request.adapter is not None:  # read from disk now, off the step loop; a bad one
            await self._load_adapter(request.adapter)  # is this request's 400, nobody else's
        request_id = request.request_id
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already running", None)
        stream = RequestStream(self, request_id)
        self._streams[request_id] = stream
        with self._queued:
            self._new.append(request)
        self.start()
        self._wakeup.set()
        return stream

    async def _load_adapter(self, ref: AdapterRef) -> None:
        adapters = self.engine.adapters
        if adapters is None:
            raise InvalidRequestError("this engine serves no LoRA adapters", "model")
        await asyncio.wrap_future(adapters.loader.load(ref))

    async def generate(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs (each one merges the steps since the previous read);
        the last one has `finished` set."""
        stream = await self.open(request)
        try:
            while not stream.finished:
                yield await stream.next()
        finally:
            stream.close()

    def _release(self, stream: RequestStream) -> None:
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]
        if not stream.finished:
            with self._queued:
                self._aborts.append(stream.request_id)
            self._wakeup.set()

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with a finish_reason "abort" output."""
        with self._queued:
            self._aborts.append(request_id)
        self._wakeup.set()

    # ---- the loop -----------------------------------------------------------------------

    def _apply_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        """Add the queued requests and apply the aborts (on the step thread, between steps)."""
        with self._queued:
            aborts, self._aborts = set(self._aborts), []
            new, self._new = self._new, []
        for request in new:
            # Aborted before it was added: dropped if nobody reads it any more; else added
            # and aborted below, so its reader still gets the final "abort" output.
            if request.request_id in aborts and request.request_id not in self._streams:
                aborts.discard(request.request_id)
                continue
            try:
                self.engine.add_request(request, checked=True)
            except EngineError as exc:
                stream = self._streams.get(request.request_id)
                if stream is not None:  # its reader lives on the loop
                    loop.call_soon_threadsafe(stream.fail, exc)
        for request_id in aborts:
            self.engine.abort(request_id)

    def _has_work(self) -> bool:
        return bool(self._new or self._aborts) or self.engine.has_unfinished()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self._has_work():
                self._progress.set()
                self._wakeup.clear()
                if not (self._new or self._aborts or self._closed):
                    await self._wakeup.wait()
                continue
            try:
                await loop.run_in_executor(self._executor, self._steps, loop)
            except Exception:
                logger.exception("engine step failed; ending its requests with an error")
                self._dispatch(self.engine.abort_all("error"))
            self._progress.set()

    def _steps(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the step thread: step back to back until there is no work (or shutdown), each
        step's outputs handed to the loop without waiting for it."""
        while not self._closed:
            self._apply_pending(loop)
            if not self.engine.has_unfinished():
                return
            outputs = self.engine.step()
            loop.call_soon_threadsafe(self._deliver, outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        self._dispatch(outputs)
        self._progress.set()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        streams = self._streams
        for output in outputs:
            stream = streams.get(output.request_id)
            if stream is not None:
                stream.put(output)


@contextlib.asynccontextmanager
async def running(engine: LLMEngine) -> AsyncIterator[AsyncLLMEngine]:
    """`async with running(engine) as front:` starts the front and shuts it down after."""
    front = AsyncLLMEngine(engine)
    front.start()
    try:
        yield front
    finally:
        await front.shutdown()
