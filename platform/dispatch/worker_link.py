"""The gateway's end of a step stream: one held-open link per worker, split per request.

A worker writes one frame per engine step on the link (see
`hydrant.engine.worker.step_link`); the link's reader task parses it once and
hands each request's entry to that request's `Feed`, which the request's
generator reads. A link that fails (the worker died, the connection broke,
it went silent past the idle timeout, a garbled frame) fails every request it
carries with the same `WorkerUnavailable` a lost per-request stream gave, and
is forgotten, so the next request opens a fresh link.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from hydrant.engine.protocol import ChoiceDelta, GenerateChunk
from hydrant.engine.worker.wire import Entry, FrameError, FrameReader
from hydrant.platform.dispatch.stream_client import StreamClientError, StreamResponse


class WorkerUnavailable(Exception):
    """The worker did not run (or did not finish) the request; `reason` labels the metric."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Feed:
    """One request's entries as its link delivers them.

    A reader that falls behind (a slow client) gets what piled up as one
    chunk (`merge_chunks`): fewer, larger events, every token once, in order.
    """

    __slots__ = ("_entries", "_failure", "_waiter", "cancelled")

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self._failure: WorkerUnavailable | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.cancelled = False  # an abort was sent for it

    def put(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._wake()

    def fail(self, failure: WorkerUnavailable) -> None:
        if self._failure is None:
            self._failure = failure
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Entry:
        """The next entry (pending chunks merged); raises the link's failure once drained."""
        entries = self._entries
        while not entries:
            if self._failure is not None:
                raise self._failure
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        entry = entries.popleft()
        if entry.chunk is None or not entries or entries[0].chunk is None:
            return entry
        chunks = [entry.chunk]
        while entries and (chunk := entries[0].chunk) is not None:
            entries.popleft()
            chunks.append(chunk)
        return Entry(request_id=entry.request_id, chunk=merge_chunks(chunks))


def merge_chunks(chunks: list[GenerateChunk]) -> GenerateChunk:
    """Consecutive chunks of one request as one: deltas joined, the last one's ending."""
    choices: dict[int, ChoiceDelta] = {}
    for chunk in chunks:
        for delta in chunk.choices:
            seen = choices.get(delta.index)
            if seen is None:
                choices[delta.index] = delta
                continue
            logprobs = seen.logprobs
            if delta.logprobs is not None:
                logprobs = (logprobs or []) + delta.logprobs
            choices[delta.index] = ChoiceDelta(
                index=delta.index,
                token_ids=seen.token_ids + delta.token_ids,
                text=seen.text + delta.text,
                finish_reason=delta.finish_reason or seen.finish_reason,
                logprobs=logprobs,
            )
    last = chunks[-1]
    return GenerateChunk(
        request_id=last.request_id,
        choices=list(choices.values()),
        finished=last.finished,
        prompt_logprobs=next((c.prompt_logprobs for c in chunks if c.prompt_logprobs), None),
        embedding=last.embedding,
        usage=last.usage,
        error=last.error,
    )


class WorkerLink:
    """One open `POST /steps` response to a worker and the requests it carries."""

    def __init__(
        self,
        address: str,
        link_id: str,
        response: StreamResponse,
        failure_of: Callable[[StreamClientError], WorkerUnavailable],
        on_end: Callable[[WorkerLink], None],
    ) -> None:
        self.address = address
        self.link_id = link_id
        self.feeds: dict[str, Feed] = {}
        self.failure: WorkerUnavailable | None = None
        self._response = response
        self._failure_of = failure_of
        self._on_end = on_end
        self._task = asyncio.get_running_loop().create_task(
            self._read(), name=f"worker-link {address}"
        )

    def register(self, request_id: str) -> Feed:
        if self.failure is not None:
            raise self.failure
        feed = self.feeds[request_id] = Feed()
        return feed

    def unregister(self, request_id: str) -> None:
        self.feeds.pop(request_id, None)

    async def _read(self) -> None:
        failure = WorkerUnavailable("lost", "the gateway closed its link to the worker")
        reader = FrameReader()
        feeds = self.feeds
        try:
            response = self._response
            while data := await response.read():
                for frame in reader.feed(data):
                    for entry in frame.entries:
                        feed = feeds.get(entry.request_id)
                        if feed is not None:  # else: given up by the gateway already
                            feed.put(entry)
            failure = WorkerUnavailable("lost", "the worker ended its step stream")
        except FrameError as exc:
            failure = WorkerUnavailable("lost", f"garbled stream from the worker: {exc}")
        except StreamClientError as exc:
            failure = self._failure_of(exc)
        finally:
            self._end(failure)

    def _end(self, failure: WorkerUnavailable) -> None:
        if self.failure is not None:
            return
        self.failure = failure
        self._response.release(False)
        self._on_end(self)
        for feed in self.feeds.values():
            feed.fail(failure)

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
