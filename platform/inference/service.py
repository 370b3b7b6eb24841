"""Run one request against a model's engine with admission before and settlement after.

`start()` does everything that can fail with a clean HTTP error (admission,
the engine's own validation on the first chunk) before a response is
committed; `Generation` then yields the rest and, however it ends, settles
the quota reservation and writes exactly one ledger entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import GenerateChunk, GenerateRequest, RequestUsage
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import InvalidRequest, ServiceUnavailable
from hydrant.platform.inference.accounting import (
    Admission,
    EntryStatus,
    Gatekeeper,
    LedgerWriter,
    Outcome,
    RequestContext,
)
from hydrant.platform.models.registry import ServedModel

log = logging.getLogger(__name__)

_FINISH_STATUS: dict[str | None, EntryStatus] = {
    "stop": "finished",
    "length": "finished",
    "abort": "aborted",
    "error": "failed",
}


@dataclass
class _Tally:
    """What the gateway saw, for requests that end before the engine reports usage."""

    prompt_tokens: int
    completion_tokens: int = 0


class Generation:
    """The chunks of one request; iterate it once (it closes itself and settles)."""

    def __init__(
        self,
        ctx: RequestContext,
        model: ServedModel,
        stream: AsyncIterator[GenerateChunk],
        first: GenerateChunk,
        admission: Admission,
        ledger: LedgerWriter,
    ) -> None:
        self.ctx = ctx
        self._model = model
        self._stream = stream
        self._first: GenerateChunk | None = first
        self._admission = admission
        self._ledger = ledger
        self._tally = _Tally(prompt_tokens=len(ctx.prepared.prompt_token_ids))
        self._usage: RequestUsage | None = None
        self._status: EntryStatus | None = None
        self._settled = False

    def _observe(self, chunk: GenerateChunk) -> None:
        self._tally.completion_tokens += sum(len(c.token_ids) for c in chunk.choices)
        if chunk.usage is not None:
            self._usage = chunk.usage
        if chunk.finished:
            reasons = [c.finish_reason for c in chunk.choices if c.finish_reason]
            if chunk.error:
                self._status = "failed"
            elif "abort" in reasons:
                self._status = "aborted"
            else:
                self._status = "finished"

    async def __aiter__(self) -> AsyncIterator[GenerateChunk]:
        try:
            if self._first is not None:
                first, self._first = self._first, None
                self._observe(first)
                yield first
            async for chunk in self._stream:
                self._observe(chunk)
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            self._status = self._status or "stopped"  # the client went away
            raise
        except Exception:
            self._status = "failed"
            log.exception("generation failed", extra={"request_id": self.ctx.request_id})
            raise
        finally:
            await self._finish()

    async def _finish(self) -> None:
        if self._settled:
            return
        self._settled = True
        if self._status in (None, "stopped", "failed"):
            with contextlib.suppress(Exception):
                await self._model.client.abort(self.ctx.request_id)
        with contextlib.suppress(Exception):
            await self._stream.aclose()  # type: ignore[attr-defined]
        outcome = Outcome(
            status=self._status or "stopped", usage=self.usage(), finished_at=utcnow()
        )
        # Shielded: a cancelled client must not cancel the bookkeeping of what it used.
        await asyncio.shield(self._settle(outcome))

    async def _settle(self, outcome: Outcome) -> None:
        # Both at once: they touch different stores (quota store, ledger), each must happen
        # whatever the other does, and the response waits for both, so one round trip, not two.
        settled, recorded = await asyncio.gather(
            self._admission.settle(outcome),
            self._ledger.record(self.ctx, outcome),
            return_exceptions=True,
        )
        try:
            for result in (recorded, settled):  # the ledger's error first: it is the one to report
                if isinstance(result, BaseException):
                    raise result
        finally:
            usage = outcome.usage
            # One line per request: ids and counts only, never prompt or completion text.
            log.info(
                "request finished",
                extra={
                    "request_id": self.ctx.request_id,
                    "tenant_id": self.ctx.tenant_id,
                    "key_prefix": self.ctx.key_prefix,
                    "model": self.ctx.model,
                    "status": outcome.status,
                    "prompt_tokens": usage.prompt_tokens,
                    "cached_tokens": usage.cached_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "seconds": round(
                        (outcome.finished_at - self.ctx.started_at).total_seconds(), 4
                    ),
                },
            )

    def usage(self) -> RequestUsage:
        """The engine's exact usage when it reported one, else what the gateway counted."""
        if self._usage is not None:
            return self._usage
        return RequestUsage(
            prompt_tokens=self._tally.prompt_tokens,
            cached_tokens=0,
            completion_tokens=self._tally.completion_tokens,
            device_ns=0,
        )


class InferenceService:
    def __init__(
        self,
        gatekeeper: Gatekeeper,
        ledger: LedgerWriter,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.gatekeeper = gatekeeper
        self.ledger = ledger
        self._ready = ready  # raises when the request could not be metered (spool full)

    async def start(self, ctx: RequestContext, model: ServedModel) -> Generation:
        """Admit, dispatch and wait for the first chunk; errors here are clean HTTP errors."""
        if self._ready is not None:
            await self._ready()
        admission = await self.gatekeeper.admit(ctx)
        prepared = ctx.prepared
        request = GenerateRequest(
            request_id=ctx.request_id,
            prompt_token_ids=prepared.prompt_token_ids,
            sampling=prepared.sampling,
            tenant_id=ctx.tenant_id,
            tenant_weight=ctx.tenant_weight,
            priority=ctx.priority,
        )
        stream = model.client.generate(request)
        try:
            first = await stream.__anext__()
        except BaseException as exc:
            empty = RequestUsage(prompt_tokens=0, cached_tokens=0, completion_tokens=0, device_ns=0)
            outcome = Outcome(status="failed", usage=empty, finished_at=utcnow())
            await asyncio.shield(admission.settle(outcome))
            if isinstance(exc, InvalidRequestError):
                raise InvalidRequest(exc.message, param=exc.param) from exc
            if isinstance(exc, StopAsyncIteration):
                raise ServiceUnavailable("the engine closed the request without output") from exc
            raise
        return Generation(ctx, model, stream, first, admission, self.ledger)
