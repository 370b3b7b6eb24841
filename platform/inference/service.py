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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import GenerateChunk, GenerateRequest, RequestUsage
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import InvalidRequest, ServiceUnavailable
from hydrant.platform.ledger.accounting import EntryStatus, LedgerWriter, Outcome
from hydrant.platform.models.registry import ServedModel
from hydrant.platform.quotas.admission import Admission, Gatekeeper, RequestContext
from hydrant.platform.quotas.ingest_order import leave_ingest_gate

log = logging.getLogger(__name__)


@dataclass
class _Prompt:
    """One engine request of a generation: a batched completion has one per prompt."""

    request_id: str
    stream: AsyncIterator[GenerateChunk]
    first: GenerateChunk | None
    # What the gateway saw, for a request that ends before the engine reports its usage.
    prompt_tokens: int
    completion_tokens: int = 0
    usage: RequestUsage | None = None
    status: EntryStatus | None = None

    def observe(self, chunk: GenerateChunk) -> None:
        self.completion_tokens += sum(len(c.token_ids) for c in chunk.choices)
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.finished:
            reasons = [c.finish_reason for c in chunk.choices if c.finish_reason]
            if chunk.error:
                self.status = "failed"
            elif "abort" in reasons:
                self.status = "aborted"
            else:
                self.status = "finished"

    def reported(self) -> RequestUsage:
        """The engine's exact usage when it reported one, else what the gateway counted."""
        if self.usage is not None:
            return self.usage
        return RequestUsage(
            prompt_tokens=self.prompt_tokens,
            cached_tokens=0,
            completion_tokens=self.completion_tokens,
            device_ns=0,
        )


def _combined(usages: list[RequestUsage]) -> RequestUsage:
    """A batch's usage: counts and device time add up; the prompts ran side by side, so its
    engine time is the longest one's (None when any prompt's is unknown)."""

    def slowest(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else max(v for v in values if v is not None)

    first = [u.first_token_seconds for u in usages]
    return RequestUsage(
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        cached_tokens=sum(u.cached_tokens for u in usages),
        completion_tokens=sum(u.completion_tokens for u in usages),
        device_ns=sum(u.device_ns for u in usages),
        queue_seconds=slowest([u.queue_seconds for u in usages]),
        first_token_seconds=None if None in first else min(v for v in first if v is not None),
        e2e_seconds=slowest([u.e2e_seconds for u in usages]),
    )


# Run once a request's ledger entry is recorded (the credits domain pays it from grants).
AfterRecord = Callable[[RequestContext[Any]], Awaitable[None]]

_END = object()  # a prompt's stream is over (in the merge queue)


class Generation:
    """The chunks of one request, as `(prompt index, chunk)`; iterate it once (it closes
    itself and settles). A batched completion runs one engine request per prompt, merged here
    as their chunks arrive, and settles once, with one ledger entry for all of them."""

    def __init__(
        self,
        ctx: RequestContext,
        model: ServedModel,
        prompts: list[_Prompt],
        admission: Admission,
        ledger: LedgerWriter,
        after_record: AfterRecord | None = None,
    ) -> None:
        self.ctx = ctx
        self._model = model
        self._prompts = prompts
        self._admission = admission
        self._ledger = ledger
        self._after_record = after_record
        self._status: EntryStatus | None = None
        self._settled = False
        self._pumps: list[asyncio.Task[None]] = []

    def _overall(self) -> EntryStatus | None:
        statuses = [p.status for p in self._prompts]
        if "failed" in statuses:
            return "failed"
        if "aborted" in statuses:
            return "aborted"
        return "finished" if all(s == "finished" for s in statuses) else None

    async def __aiter__(self) -> AsyncIterator[tuple[int, GenerateChunk]]:
        try:
            for index, prompt in enumerate(self._prompts):
                if prompt.first is not None:
                    first, prompt.first = prompt.first, None
                    prompt.observe(first)
                    yield index, first
            if len(self._prompts) == 1:  # the common case: no merge, no tasks
                only = self._prompts[0]
                async for chunk in only.stream:
                    only.observe(chunk)
                    yield 0, chunk
            else:
                async for index, chunk in self._merged():
                    self._prompts[index].observe(chunk)
                    yield index, chunk
            self._status = self._overall()  # None: a stream ended before its last chunk
        except (asyncio.CancelledError, GeneratorExit):
            self._status = self._overall() or "stopped"  # the client went away
            raise
        except Exception:
            self._status = "failed"
            log.exception("generation failed", extra={"request_id": self.ctx.request_id})
            raise
        finally:
            await self._finish()

    async def aclose(self) -> None:
        """Settle now if iterating did not: a response that ends without running its iterator
        to the end or into an exception (Litestar's `Stream` abandons it when the client
        leaves before the first event, or while the event loop is past the iterator) would
        otherwise hold the engine request, an upstream one still generating, until the
        garbage collector finalizes the generators, at no set time."""
        if not self._settled:
            self._status = self._overall() or "stopped"
            await self._finish()

    async def _merged(self) -> AsyncIterator[tuple[int, GenerateChunk]]:
        """The prompts' chunks in arrival order; a failure of any stream is raised here."""
        queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

        async def pump(index: int, stream: AsyncIterator[GenerateChunk]) -> None:
            try:
                async for chunk in stream:
                    queue.put_nowait((index, chunk))
            except Exception as exc:
                queue.put_nowait((index, exc))
            queue.put_nowait((index, _END))

        self._pumps = [asyncio.create_task(pump(i, p.stream)) for i, p in enumerate(self._prompts)]
        running = len(self._pumps)
        while running:
            index, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item  # type: ignore[misc]

    async def _finish(self) -> None:
        if self._settled:
            return
        self._settled = True
        for pump in self._pumps:
            pump.cancel()
        if self._pumps:
            await asyncio.gather(*self._pumps, return_exceptions=True)
        for prompt in self._prompts:
            if prompt.status is None or self._status in ("stopped", "failed"):
                with contextlib.suppress(Exception):
                    await self._model.client.abort(prompt.request_id)
            with contextlib.suppress(Exception):
                await prompt.stream.aclose()  # type: ignore[attr-defined]
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
            if self._after_record is not None:  # the entry is written: e.g. pay it from credits
                await self._after_record(self.ctx)
        finally:
            self._admission.close()  # now what waits for the model to be idle may go
            usage = outcome.usage
            # One line per request: ids and counts only, never prompt or completion text.
            log.info(
                "request finished",
                extra={
                    "request_id": self.ctx.request_id,
                    "tenant_id": self.ctx.tenant_id,
                    "key_prefix": self.ctx.key_prefix,
                    "model": self.ctx.model,
                    "adapter": self.ctx.adapter,
                    "status": outcome.status,
                    "prompt_tokens": usage.prompt_tokens,
                    "cached_tokens": usage.cached_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "seconds": round(
                        (outcome.finished_at - self.ctx.started_at).total_seconds(), 4
                    ),
                },
            )

    @property
    def rate_limit_headers(self) -> Mapping[str, str]:
        """OpenAI's `x-ratelimit-*` headers, as this request's admission left the limits."""
        return self._admission.rate_limit_headers

    def usage(self) -> RequestUsage:
        """The engine's exact usage when it reported one, else what the gateway counted;
        summed over the prompts of a batch."""
        if len(self._prompts) == 1:
            return self._prompts[0].reported()
        return _combined([p.reported() for p in self._prompts])


class InferenceService:
    def __init__(
        self,
        gatekeeper: Gatekeeper,
        ledger: LedgerWriter,
        ready: Callable[[], Awaitable[None]] | None = None,
        after_record: AfterRecord | None = None,
    ) -> None:
        self.gatekeeper = gatekeeper
        self.ledger = ledger
        self._ready = ready  # raises when the request could not be metered (spool full)
        self._after_record = after_record  # once an entry is in this service's ledger

    async def start(
        self, ctx: RequestContext, model: ServedModel, *, ledger: LedgerWriter | None = None
    ) -> Generation:
        """Admit, dispatch and wait for the first chunk; errors here are clean HTTP errors.

        `ledger`: where this request's one entry goes instead of the service's ledger. The
        Batch API's runner takes the outcome this way and writes the entry itself, in the
        transaction that stores the line's result, so a line is billed exactly when it is
        delivered."""
        if self._ready is not None:
            await self._ready()
        admission = await self.gatekeeper.admit(ctx)
        leave_ingest_gate()  # admitted: the next in line may start while this one dispatches
        prepared = ctx.prepared
        batched = len(prepared.prompts) > 1
        prompts = []
        for index, prompt in enumerate(prepared.prompts):
            request_id = f"{ctx.request_id}-{index}" if batched else ctx.request_id
            request = GenerateRequest(
                request_id=request_id,
                prompt_token_ids=prompt.token_ids,
                sampling=prompt.sampling,
                tenant_id=ctx.tenant_id,
                tenant_weight=ctx.tenant_weight,
                priority=ctx.priority,
                adapter=model.adapter,  # its path travels with every request: loaded on first use
            )
            stream = model.client.generate(request)
            prompts.append(_Prompt(request_id, stream, None, len(prompt.token_ids)))
        if batched:
            try:
                firsts = await asyncio.gather(*(_first_or_exception(p.stream) for p in prompts))
            except asyncio.CancelledError as exc:  # the client left while prompts started
                firsts = [exc] * len(prompts)
        else:
            firsts = [await _first_or_exception(prompts[0].stream)]
        failure = next((f for f in firsts if isinstance(f, BaseException)), None)
        if failure is not None:
            await asyncio.shield(self._refuse(model, prompts, firsts, admission))
            if isinstance(failure, InvalidRequestError):
                raise InvalidRequest(failure.message, param=failure.param) from failure
            if isinstance(failure, StopAsyncIteration):
                raise ServiceUnavailable(
                    "the engine closed the request without output"
                ) from failure
            raise failure
        for started, first in zip(prompts, firsts, strict=True):
            if isinstance(first, GenerateChunk):  # all are, past the check above
                started.first = first
        # A ledger of the caller's (a batch line's) is written later, by the caller.
        after = self._after_record if ledger is None else None
        return Generation(ctx, model, prompts, admission, ledger or self.ledger, after)

    @staticmethod
    async def _refuse(
        model: ServedModel,
        prompts: list[_Prompt],
        firsts: list[GenerateChunk | BaseException],
        admission: Admission,
    ) -> None:
        """A prompt failed before any output: stop the batch's others, nothing is charged.
        Stopped are those that started, and all of them when the request was cancelled."""
        for prompt, first in zip(prompts, firsts, strict=True):
            if not isinstance(first, BaseException) or isinstance(first, asyncio.CancelledError):
                with contextlib.suppress(Exception):
                    await model.client.abort(prompt.request_id)
                with contextlib.suppress(Exception):
                    await prompt.stream.aclose()  # type: ignore[attr-defined]
        empty = RequestUsage(prompt_tokens=0, cached_tokens=0, completion_tokens=0, device_ns=0)
        try:
            await admission.settle(Outcome(status="failed", usage=empty, finished_at=utcnow()))
        finally:
            admission.close()


async def _first_or_exception(
    stream: AsyncIterator[GenerateChunk],
) -> GenerateChunk | BaseException:
    try:
        return await stream.__anext__()
    except BaseException as exc:
        return exc
