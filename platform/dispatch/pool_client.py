"""The `EngineClient` of a pooled model: a request dispatched to a member of its pool.

A request that fails before its first token (the member refused, could not be
reached, drained) is retried on another member, up to `MAX_ATTEMPTS`; once a
token reached the client, a lost member ends the response (`WorkerLost`). In
an upstream pool with fair share, each attempt waits its turn in the pool's
fair queue and the tokens it streams advance its tenant's counter.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from hydrant.engine.protocol import EngineStats, GenerateChunk, GenerateRequest
from hydrant.platform.dispatch.pool import WorkerPool
from hydrant.platform.dispatch.routing import prefix_key
from hydrant.platform.dispatch.worker_http import WorkerUnavailable
from hydrant.platform.errors import ServiceUnavailable

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4  # workers tried for one request before it gets a 503


class WorkerLost(ServiceUnavailable):
    """The worker died or left while the request was streaming: the response is incomplete."""

    default_code = "worker_lost"


class PoolClient:
    """The `EngineClient` of a pooled model: dispatch with retry before the first token."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self._where: dict[str, str] = {}  # request id → worker address

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        pool = self.pool
        adapter = request.adapter.name if request.adapter is not None else None
        key = prefix_key(
            request.tenant_id,
            request.prompt_token_ids,
            pool.options.prefix_blocks,
            adapter=adapter,
        )
        tokens = len(request.prompt_token_ids) + request.sampling.max_tokens * request.sampling.n
        tried: set[str] = set()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            fair = pool.fair
            ticket = fair.enqueue(request.tenant_id, request.tenant_weight) if fair else None
            slot = await pool.acquire(key, tried, tokens, adapter, ticket)
            if fair is not None and ticket is not None:
                fair.served(ticket, len(request.prompt_token_ids))  # its prefill
            produced = False
            self._where[request.request_id] = slot.record.address
            try:
                stream = pool.http.generate(slot.record.address, request)
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        produced = True
                        if fair is not None and ticket is not None:
                            fair.served(ticket, sum(len(c.token_ids) for c in chunk.choices))
                        yield chunk
                return
            except WorkerUnavailable as exc:
                if produced:
                    log.warning(
                        "worker lost mid-stream",
                        extra={
                            "model": pool.model,
                            "request_id": request.request_id,
                            "reason": exc.reason,
                        },
                    )
                    raise WorkerLost(
                        "the worker running this request stopped while it was streaming;"
                        " the response is incomplete",
                        retry_after=1.0,
                    ) from exc
                if exc.reason in ("connect", "lost", "silent"):
                    pool.mark_unreachable(slot, partitioned=exc.reason == "silent")
                tried.add(slot.worker_id)
                pool.metrics.retries.labels(pool.model, exc.reason).inc()
                log.info(
                    "dispatch retry",
                    extra={"model": pool.model, "attempt": attempt, "reason": exc.reason},
                )
            finally:
                pool.release(slot, tokens, ticket)
                self._where.pop(request.request_id, None)
        raise ServiceUnavailable(
            f"no worker of `{pool.model}` could run the request; retry shortly",
            code="no_worker",
            retry_after=1.0,
        )

    async def abort(self, request_id: str) -> None:
        address = self._where.get(request_id)
        if address is not None:
            with contextlib.suppress(WorkerUnavailable):
                await self.pool.http.abort(address, request_id)

    def stats(self) -> EngineStats:
        return self.pool.stats()
