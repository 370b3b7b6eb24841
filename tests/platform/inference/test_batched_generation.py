"""A batched completion in `InferenceService`: one engine request per prompt, merged, settled
once. The engine is a scripted fake (the real one is in tests/e2e/test_openai_client.py);
what is tested here is the bookkeeping: aborts, settlement and the one ledger entry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, cast

import pytest

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import (
    ChoiceDelta,
    GenerateChunk,
    GenerateRequest,
    RequestUsage,
    Sampling,
)
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.params import PreparedPrompt, PreparedRequest
from hydrant.platform.inference.service import InferenceService
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.models.registry import ServedModel
from hydrant.platform.quotas.admission import Admission, RequestContext


class ScriptedEngine:
    """Each request yields `steps` one-token chunks, `delay` apart, then a finished chunk with
    its usage; a request whose first prompt token is 0 is refused as the engine would."""

    def __init__(self, steps: int = 3, delay: float = 0.0) -> None:
        self.steps = steps
        self.delay = delay
        self.started: list[str] = []
        self.aborted: list[str] = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        self.started.append(request.request_id)
        if request.prompt_token_ids[0] == 0:
            raise InvalidRequestError("token 0 is not allowed here", param="prompt")
        for step in range(self.steps):
            if step:
                await asyncio.sleep(self.delay)
            yield GenerateChunk(
                request_id=request.request_id,
                choices=[ChoiceDelta(index=0, token_ids=[7], text="x")],
            )
        usage = RequestUsage(
            prompt_tokens=len(request.prompt_token_ids),
            cached_tokens=1,
            completion_tokens=self.steps,
            device_ns=1000,
            e2e_seconds=0.5 + len(request.prompt_token_ids) / 100,
        )
        yield GenerateChunk(
            request_id=request.request_id,
            choices=[ChoiceDelta(index=0, token_ids=[], text="", finish_reason="length")],
            finished=True,
            usage=usage,
        )

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class Books:
    """Records what the gate settled and what the ledger wrote."""

    def __init__(self) -> None:
        self.settled: list[Outcome] = []
        self.recorded: list[tuple[str, Outcome]] = []
        self.events: list[str] = []

    async def admit(self, ctx: RequestContext) -> Admission:
        books = self

        class _Admission:
            rate_limit_headers: Mapping[str, str] = MappingProxyType({})

            async def settle(self, outcome: Outcome) -> None:
                books.settled.append(outcome)
                books.events.append("settled")

            def close(self) -> None:
                books.events.append("closed")

        return _Admission()

    async def record(self, ctx: RequestContext, outcome: Outcome) -> None:
        await asyncio.sleep(0.01)  # a database's round trip: the settlement ends first
        self.recorded.append((ctx.request_id, outcome))
        self.events.append("recorded")


def _setup(
    engine: ScriptedEngine, prompts: list[list[int]]
) -> tuple[InferenceService, Books, RequestContext, ServedModel]:
    books = Books()
    service = InferenceService(books, books)
    model = ServedModel(
        name="m", tokenizer=cast(Tokenizer, None), client=cast(Any, engine), max_model_len=64
    )
    prepared = PreparedRequest(
        tuple(PreparedPrompt(ids, Sampling(max_tokens=4)) for ids in prompts),
        stream=False,
        include_usage=False,
    )
    ctx = RequestContext(
        request_id="req_b",
        tenant_id="ten",
        api_key_id="k",
        key_prefix="p",
        model="m",
        prepared=prepared,
    )
    return service, books, ctx, model


async def test_a_batch_settles_once_with_the_sum_of_its_prompts() -> None:
    engine = ScriptedEngine(steps=3, delay=0.001)
    service, books, ctx, model = _setup(engine, [[1, 2], [3, 4, 5], [6]])
    generation = await service.start(ctx, model)
    seen = [prompt async for prompt, chunk in generation for _ in chunk.choices if _.text]
    assert sorted(seen) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert engine.started == ["req_b-0", "req_b-1", "req_b-2"]
    assert engine.aborted == []
    [(request_id, outcome)] = books.recorded
    assert request_id == "req_b" and outcome.status == "finished"
    usage = outcome.usage
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (6, 3, 9)
    assert usage.device_ns == 3000
    assert usage.e2e_seconds == pytest.approx(0.53)  # side by side: the slowest prompt's
    assert books.settled == [outcome]
    # closed once, last: batch lines waiting for the model to be idle go only after the
    # ledger entry is written (issue #27)
    assert books.events == ["settled", "recorded", "closed"]


async def test_a_prompt_refused_by_the_engine_stops_the_batch_and_charges_nothing() -> None:
    engine = ScriptedEngine()
    service, books, ctx, model = _setup(engine, [[1, 2], [0, 4], [6]])
    with pytest.raises(InvalidRequest) as refused:
        await service.start(ctx, model)
    assert refused.value.param == "prompt"
    assert sorted(engine.aborted) == ["req_b-0", "req_b-2"]  # those that had started
    assert books.recorded == []
    [outcome] = books.settled
    assert outcome.status == "failed" and outcome.usage.prompt_tokens == 0
    assert books.events == ["settled", "closed"]


async def test_a_client_leaving_mid_batch_aborts_every_unfinished_prompt() -> None:
    engine = ScriptedEngine(steps=50, delay=0.01)
    service, books, ctx, model = _setup(engine, [[1, 2], [3, 4, 5]])
    generation = await service.start(ctx, model)
    received = 0

    async def consume() -> None:
        nonlocal received
        async for _ in generation:
            received += 1

    task = asyncio.create_task(consume())
    while received < 6:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(engine.aborted) == ["req_b-0", "req_b-1"]
    [(_, outcome)] = books.recorded
    assert outcome.status == "stopped"
    assert outcome.usage.prompt_tokens == 5  # counted by the gateway: no usage was reported
    assert outcome.usage.completion_tokens >= 6
    assert books.settled == [outcome]
    assert books.events == ["settled", "recorded", "closed"]  # a client gone: closed all the same


async def test_a_single_prompt_runs_under_the_request_id() -> None:
    engine = ScriptedEngine()
    service, books, ctx, model = _setup(engine, [[1, 2]])
    generation = await service.start(ctx, model)
    assert [p async for p, _ in generation] == [0, 0, 0, 0]
    assert engine.started == ["req_b"]
    assert books.recorded[0][1].usage.completion_tokens == 3
