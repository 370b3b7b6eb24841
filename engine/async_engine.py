"""The asyncio front of the engine: `generate()` streams, a background task steps.

`LLMEngine.step()` blocks for the length of a forward, so it runs on one
dedicated worker thread (always the same one: torch state and the engine stay
single-threaded) while the event loop keeps serving HTTP. New requests and
aborts are queued by the loop and applied between steps, on the loop thread,
while no step runs; so the engine is never touched by two threads at once,
and `generate()` still raises a bad request's error at once, because the
validation it runs is read-only. The `Request` it is given is the one the
engine queues: checked here once, then added as it is.

A consumer that stops iterating (a client that disconnected) aborts its
request, so its blocks are freed at the next step boundary.

Sleep mode: `sleep()` stops admitting work at once (new `generate()` calls
raise `EngineSleepingError`), lets the requests already accepted finish, then
frees the KV cache and moves the weights off the device on the engine thread;
`wake()` restores them (no disk read) and admits work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeAlias

from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.output_constraints import raise_if_invalid
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.protocol import EngineStats
from hydrant.engine.sequence import Request
from hydrant.engine.sleep_mode import EngineSleepingError

logger = logging.getLogger(__name__)


class EngineShutdownError(EngineError):
    """The engine was shut down while (or before) the request ran."""


_Item: TypeAlias = RequestOutput | BaseException


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[_Item]] = {}
        self._new: list[Request] = []  # checked, to be added between steps
        self._aborts: list[str] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hydrant-engine")
        self._closed = False
        self._refusing = False  # asleep, falling asleep or waking: no new work
        self._lifecycle = asyncio.Lock()  # one sleep or wake at a time
        self._progress = asyncio.Event()  # set by the loop after each step and when idle

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
        self._new.clear()
        self._dispatch(self.engine.abort_all("abort"))
        for queue in self._queues.values():
            queue.put_nowait(EngineShutdownError("the engine was shut down"))
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

    async def generate(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs step by step; the last one has `finished` set."""
        if self._closed:
            raise EngineShutdownError("the engine has been shut down")
        if self._refusing:
            raise EngineSleepingError("the engine is asleep; it takes no request until woken")
        self.engine.validator.check(request)
        constraint = request.params.structured_output
        if constraint is not None:  # off the loop; the step thread's guide reuses it (cached)
            await asyncio.to_thread(raise_if_invalid, *constraint)
        request_id = request.request_id
        if request_id in self._queues:
            raise InvalidRequestError(f"request id {request_id!r} is already running", None)
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._queues[request_id] = queue
        self._new.append(request)
        self.start()
        self._wakeup.set()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._aborts.append(request_id)
                self._wakeup.set()

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with a finish_reason "abort" output."""
        self._aborts.append(request_id)
        self._wakeup.set()

    # ---- the loop -----------------------------------------------------------------------

    def _apply_pending(self) -> None:
        aborts, self._aborts = set(self._aborts), []
        new, self._new = self._new, []
        for request in new:
            if request.request_id in aborts:
                aborts.discard(request.request_id)
                continue
            try:
                self.engine.add_request(request, checked=True)
            except EngineError as exc:
                self._put(request.request_id, exc)
        for request_id in aborts:
            self.engine.abort(request_id)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._apply_pending()
            if not self.engine.has_unfinished():
                self._progress.set()
                self._wakeup.clear()
                if not (self._new or self._aborts or self._closed):
                    await self._wakeup.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception:
                logger.exception("engine step failed; ending its requests with an error")
                outputs = self.engine.abort_all("error")
            self._dispatch(outputs)
            self._progress.set()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            self._put(output.request_id, output)

    def _put(self, request_id: str, item: _Item) -> None:
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(item)


@contextlib.asynccontextmanager
async def running(engine: LLMEngine) -> AsyncIterator[AsyncLLMEngine]:
    """`async with running(engine) as front:` starts the front and shuts it down after."""
    front = AsyncLLMEngine(engine)
    front.start()
    try:
        yield front
    finally:
        await front.shutdown()
