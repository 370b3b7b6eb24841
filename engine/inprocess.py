"""The in-process `EngineClient`: the embedded default's engine, behind the gateway's interface.

It converts between the wire structs of `hydrant.engine.protocol` and the
engine's own objects, the same conversion a worker's HTTP API does (a worker
serves through this client), so the gateway cannot tell an in-process engine
from a remote one. A `GenerateRequest` becomes one engine `Request` here
(`to_request`), which then travels unchanged to the scheduler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from hydrant.engine.async_engine import AsyncLLMEngine, RequestStream
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.protocol import (
    ChoiceDelta,
    EngineStats,
    GenerateChunk,
    GenerateRequest,
    RequestUsage,
    TokenLogprob,
)
from hydrant.engine.sequence import Request

NANOS = 1_000_000_000


def to_request(request: GenerateRequest) -> Request:
    """The wire request → the engine's one request object (arriving now)."""
    return Request(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        params=request.sampling.to_params(),
        tenant_id=request.tenant_id,
        tenant_weight=request.tenant_weight,
        priority=request.priority,
        adapter=request.adapter,
    )


def to_chunk(output: RequestOutput, request_id: str | None = None) -> GenerateChunk:
    """One engine output → the wire chunk (deltas only, usage on the last); `request_id`:
    the caller's name for it, where the engine ran it under another (a worker's link)."""
    choices = []
    for choice in output.outputs:
        new = len(choice.new_token_ids)
        logprobs = None
        if choice.logprobs is not None:
            fresh = choice.logprobs[len(choice.logprobs) - new :] if new else []
            logprobs = [TokenLogprob(e.token_id, e.logprob, list(e.top)) for e in fresh]
        choices.append(
            ChoiceDelta(
                index=choice.index,
                token_ids=list(choice.new_token_ids),
                text=choice.new_text,
                finish_reason=choice.finish_reason,
                logprobs=logprobs,
            )
        )
    usage = None
    if output.finished:
        m = output.metrics
        usage = RequestUsage(
            prompt_tokens=m.prompt_tokens,
            cached_tokens=m.cached_tokens,
            completion_tokens=m.completion_tokens,
            device_ns=round(m.device_seconds * NANOS),
            queue_seconds=_delta(m.arrival_time, m.first_scheduled_time),
            first_token_seconds=_delta(m.arrival_time, m.first_token_time),
            e2e_seconds=_delta(m.arrival_time, m.finish_time),
        )
    prompt_logprobs = None
    if output.prompt_logprobs is not None:
        prompt_logprobs = [
            None if e is None else TokenLogprob(e.token_id, e.logprob, list(e.top))
            for e in output.prompt_logprobs
        ]
    return GenerateChunk(
        request_id=output.request_id if request_id is None else request_id,
        choices=choices,
        finished=output.finished,
        usage=usage,
        prompt_logprobs=prompt_logprobs,
        embedding=output.embedding,
    )


def _delta(start: float, end: float | None) -> float | None:
    return None if end is None else max(0.0, end - start)


class InProcessEngineClient:
    def __init__(self, engine: AsyncLLMEngine) -> None:
        self.engine = engine

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        async for output in self.engine.generate(to_request(request)):
            yield to_chunk(output)

    async def open(self, request: GenerateRequest) -> RequestStream:
        """The request's engine stream, for a reader that waits with a deadline (the
        worker's keep-alive frames); `to_chunk` turns each output into a wire chunk."""
        return await self.engine.open(to_request(request))

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()
