"""Fair share in front of an upstream: the virtual token counters, the queue's order, and a
pool of a fake member under two tenants' unequal load (the logic; the same against a real
`vllm serve`: tests/e2e/test_upstream_fair_share.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hydrant.engine.protocol import ChoiceDelta, GenerateChunk, GenerateRequest, Sampling
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.fair_share import FairQueue, VirtualTokenCounters
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.pool import PoolOptions, WorkerPool
from hydrant.platform.dispatch.pool_client import PoolClient
from hydrant.platform.dispatch.scaler import NoScaler, PoolSpec
from hydrant.platform.errors import ServiceUnavailable


def test_a_newly_active_tenant_is_lifted_to_the_lowest_active_counter() -> None:
    vtc = VirtualTokenCounters()
    vtc.join("a")
    vtc.serve("a", 1.0, 500)
    vtc.join("b")  # idle until now: starts level with a, not 500 tokens behind
    assert vtc.counter("b") == 500
    vtc.serve("b", 1.0, 100)
    vtc.leave("b")
    vtc.serve("a", 1.0, 1000)
    vtc.join("b")  # back after a pause: its idle time is not banked either
    assert vtc.counter("b") == 1500


def test_a_tenant_ahead_is_not_lowered_and_idle_counters_are_forgotten() -> None:
    vtc = VirtualTokenCounters()
    vtc.join("a")
    vtc.join("b")
    vtc.serve("b", 1.0, 900)
    vtc.serve("a", 1.0, 100)
    vtc.leave("b")
    vtc.join("b")
    assert vtc.counter("b") == 900  # lifted to at least the lowest, never lowered
    vtc.leave("a")
    vtc.leave("b")
    assert vtc.counters == {}  # nobody active: no history carried into the next burst


def test_counters_advance_by_tokens_over_the_weight() -> None:
    vtc = VirtualTokenCounters()
    vtc.join("heavy")
    vtc.serve("heavy", 2.0, 100)
    vtc.serve("light", 0.5, 100)
    assert (vtc.counter("heavy"), vtc.counter("light")) == (50, 200)


def test_the_queue_serves_the_lowest_counter_first_and_in_order_within_a_tenant() -> None:
    queue = FairQueue(member_tokens=100, timeout_s=1.0)
    a1, a2 = queue.enqueue("a", 1.0), queue.enqueue("a", 1.0)
    b1 = queue.enqueue("b", 1.0)
    assert queue.is_next(a1) and not queue.is_next(a2) and not queue.is_next(b1)
    queue.admit(a1)
    queue.served(a1, 10)  # a is now ahead of b
    assert queue.is_next(b1) and not queue.is_next(a2)
    queue.abandon(b1)  # b gave up waiting: a's next goes
    assert queue.is_next(a2) and queue.waiting() == 1
    assert queue.vtc.active == {"a": 2}
    queue.finished(a1)
    queue.finished(a1)  # twice: counted once
    assert queue.vtc.active == {"a": 1}


def test_a_member_takes_requests_up_to_its_token_bound_and_any_one_when_empty() -> None:
    queue = FairQueue(member_tokens=100, timeout_s=1.0)
    assert queue.fits(inflight=1, inflight_tokens=60, tokens=40)
    assert not queue.fits(inflight=1, inflight_tokens=60, tokens=41)
    assert queue.fits(inflight=0, inflight_tokens=0, tokens=5000)


class StreamingMember:
    """A member that streams `max_tokens` tokens, one per event-loop turn, to whoever it runs:
    what share each tenant gets then depends only on the order of admission."""

    sleep_path = "/sleep?level=1"
    wake_path = "/wake_up"

    def __init__(self) -> None:
        self.served: dict[str, int] = {}
        self.total = 0

    async def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncIterator[GenerateChunk]:
        for _ in range(request.sampling.max_tokens):
            await asyncio.sleep(0)
            self.served[request.tenant_id] = self.served.get(request.tenant_id, 0) + 1
            self.total += 1
            yield GenerateChunk(
                request_id=request.request_id,
                choices=[ChoiceDelta(index=0, token_ids=[7], text="x")],
            )
        yield GenerateChunk(request_id=request.request_id, choices=[], finished=True)

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        return {}

    async def abort(self, address: str, request_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def upstream_pool(member: StreamingMember, member_tokens: int, timeout_s: float) -> WorkerPool:
    pool = WorkerPool(
        spec=PoolSpec(model="demo", path="upstream"),
        http=member,
        scaler=NoScaler(),
        metrics=PoolMetrics(),
        options=PoolOptions(idle_timeout_s=0.0),
        kind="openai",
        fair=FairQueue(member_tokens=member_tokens, timeout_s=timeout_s),
    )
    pool.update(
        [
            WorkerRecord(
                worker_id="vllm",
                model="demo",
                address="http://vllm",
                device="upstream",
                state="ready",
                path="upstream",
                kind="openai",
                capacity=256,
                heartbeat_at=time.time(),
            )
        ]
    )
    return pool


def request(tenant: str, weight: float, n: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"{tenant}-{n}",
        prompt_token_ids=[1, 2, 3, 4],
        sampling=Sampling(max_tokens=8, temperature=0.0),
        tenant_id=tenant,
        tenant_weight=weight,
    )


async def shares(
    weights: dict[str, float], streams: dict[str, int], fair: bool = True
) -> dict[str, float]:
    """Each tenant's share of the tokens served while all are backlogged (after a warm-up)."""
    member = StreamingMember()
    pool = upstream_pool(member, member_tokens=4 * 12, timeout_s=60.0)  # 4 requests at once
    if not fair:
        pool.fair = None
    client = PoolClient(pool)
    done = asyncio.Event()
    counter = iter(range(10**9))

    async def stream(tenant: str) -> None:
        while not done.is_set():
            async for _ in client.generate(request(tenant, weights[tenant], next(counter))):
                pass

    tasks = [asyncio.create_task(stream(t)) for t, n in streams.items() for _ in range(n)]
    try:
        async with asyncio.timeout(120):  # a stall fails here, not at the suite's timeout
            while member.total < 2000:
                await asyncio.sleep(0)
            start = dict(member.served)
            while member.total < 10000:
                await asyncio.sleep(0)
        served = {t: member.served.get(t, 0) - start.get(t, 0) for t in streams}
    finally:
        done.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert pool.fair is None or pool.fair.waiting() == 0  # cancelled waiters left
    total = sum(served.values())
    return {t: served[t] / total for t in streams}


async def test_a_tenant_with_ten_times_the_streams_gets_half_the_tokens_at_equal_weights() -> None:
    got = await shares({"flood": 1.0, "light": 1.0}, {"flood": 40, "light": 4})
    assert got["light"] == pytest.approx(0.5, rel=0.1)


async def test_weights_split_the_tokens_two_to_one() -> None:
    got = await shares({"flood": 1.0, "gold": 2.0}, {"flood": 40, "gold": 4})
    assert got["gold"] == pytest.approx(2 / 3, rel=0.1)


async def test_without_fair_share_the_flood_takes_its_share_by_volume() -> None:
    """The same load where every request runs at once (first come, first served): what the
    fair queue is there to prevent."""
    got = await shares({"flood": 1.0, "light": 1.0}, {"flood": 40, "light": 4}, fair=False)
    assert got["light"] == pytest.approx(4 / 44, rel=0.1)


async def test_a_request_that_waits_past_the_timeout_gets_a_503_and_leaves_the_queue() -> None:
    member = StreamingMember()
    pool = upstream_pool(member, member_tokens=12, timeout_s=0.2)  # one request at a time
    slow = asyncio.Event()
    original = member.generate

    async def held(address: str, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        await slow.wait()
        async for chunk in original(address, req):
            yield chunk

    member.generate = held  # type: ignore[method-assign]
    client = PoolClient(pool)

    async def run(n: int) -> None:
        async for _ in client.generate(request("a", 1.0, n)):
            pass

    first = asyncio.create_task(run(1))
    await asyncio.sleep(0.01)
    with pytest.raises(ServiceUnavailable) as refused:
        await run(2)
    assert refused.value.code == "pool_saturated" and refused.value.retry_after is not None
    assert pool.fair is not None and pool.fair.waiting() == 0 and pool.waiting == 0
    slow.set()
    await first
    assert pool.fair.vtc.active == {} and pool.workers["vllm"].inflight_tokens == 0


async def test_queued_requests_cancelled_together_all_leave_and_none_runs() -> None:
    """Clients that leave at once: each cancelled request leaves the queue and wakes the
    others in the same loop step. None of those cancellations may be lost (Python 3.11's
    `asyncio.wait_for` returned normally there, and the request went on to run)."""
    member = StreamingMember()
    pool = upstream_pool(member, member_tokens=12, timeout_s=30.0)  # one request at a time
    hold = asyncio.Event()
    original = member.generate
    started: list[str] = []

    async def held(address: str, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        started.append(req.request_id)
        await hold.wait()
        async for chunk in original(address, req):
            yield chunk

    member.generate = held  # type: ignore[method-assign]
    client = PoolClient(pool)

    async def run(n: int) -> None:
        async for _ in client.generate(request("a", 1.0, n)):
            pass

    running = asyncio.create_task(run(0))
    await asyncio.sleep(0.01)
    queued = [asyncio.create_task(run(n)) for n in range(1, 40)]
    await asyncio.sleep(0.01)
    assert pool.fair is not None and pool.fair.waiting() == 39
    for task in queued:  # one by one, as their clients' disconnects arrive
        task.cancel()
        await asyncio.sleep(0)
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert pool.fair.waiting() == 0 and pool.waiting == 0
    hold.set()
    await running
    assert started == ["a-0"]  # none of the cancelled ones reached the member
