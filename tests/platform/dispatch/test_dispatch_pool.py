"""Pool logic with fakes of the worker side: one wake for many waiters, bounded waits,
sleep on idle, retry before the first token only.

The same behaviour with real processes: tests/e2e/test_worker_pool*.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from hydrant.engine.protocol import (
    AdapterRef,
    ChoiceDelta,
    EngineStats,
    GenerateChunk,
    GenerateRequest,
    Sampling,
)
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.pool import PoolOptions, WorkerPool
from hydrant.platform.dispatch.pool_client import PoolClient, WorkerLost
from hydrant.platform.dispatch.scaler import PoolSpec
from hydrant.platform.dispatch.worker_http import WorkerUnavailable
from hydrant.platform.errors import ServiceUnavailable


def record(worker_id: str, state: str = "ready", path: str = "/m") -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        model="demo",
        address=f"http://{worker_id}",
        device="cpu",
        state=state,  # type: ignore[arg-type]
        path=path,
        capacity=8,
        heartbeat_at=time.time(),
    )


class FakeHttp:
    """Scripted worker answers: `fail[address]` = WorkerUnavailable reasons to raise in turn."""

    sleep_path = "/sleep"
    wake_path = "/wake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, list[str]] = {}
        self.break_after_first: set[str] = set()

    async def call(self, address: str, method: str, path: str, **_: Any) -> Any:
        self.calls.append((address, path))
        return {}

    async def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncIterator[GenerateChunk]:
        self.calls.append((address, "/generate"))
        if self.fail.get(address):
            raise WorkerUnavailable(self.fail[address].pop(0), "scripted")
        yield GenerateChunk(
            request_id=request.request_id, choices=[ChoiceDelta(index=0, token_ids=[1], text="x")]
        )
        if address in self.break_after_first:
            raise WorkerUnavailable("lost", "scripted mid-stream")
        yield GenerateChunk(
            request_id=request.request_id,
            choices=[ChoiceDelta(index=0, token_ids=[2], text="y", finish_reason="stop")],
            finished=True,
        )


class FakeScaler:
    """Registers a ready worker in the pool a little after being asked, like a real start."""

    rolls_itself = False

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.requests: list[int] = []

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        self.requests.append(replicas)
        if replicas > 0:
            asyncio.get_running_loop().call_later(
                0.2,
                lambda: self.pool.update(
                    [record(f"w{i}", path=spec.path) for i in range(replicas)]
                ),  # type: ignore[union-attr]
            )

    async def update(self, spec: PoolSpec) -> None:
        return None

    async def retire(self, keep: PoolSpec) -> None:
        return None

    async def close(self) -> None:
        return None


def make_pool(**options: Any) -> tuple[WorkerPool, FakeHttp, FakeScaler]:
    http, scaler = FakeHttp(), FakeScaler()
    pool = WorkerPool(
        spec=PoolSpec(model="demo", path="/m"),
        http=http,  # type: ignore[arg-type]
        scaler=scaler,
        metrics=PoolMetrics(),
        options=PoolOptions(**options),
    )
    scaler.pool = pool
    pool.update([])
    return pool, http, scaler


def wakes(pool: WorkerPool) -> float:
    return (
        pool.metrics.registry.get_sample_value("hydrant_pool_wakes_total", {"model": "demo"}) or 0
    )


async def test_twenty_requests_at_zero_share_one_wake() -> None:
    pool, _, scaler = make_pool(wake_timeout_s=10, max_workers=1)
    tasks = [asyncio.create_task(pool.acquire(None, set(), 10)) for _ in range(20)]
    await asyncio.sleep(0.05)
    assert pool.waiting == 20 and pool.snapshot().waiting == 20
    slots = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert len(slots) == 20 and all(s.worker_id == "w0" for s in slots)
    assert scaler.requests == [1] and wakes(pool) == 1
    assert pool.waiting == 0 and pool.snapshot().inflight == 20


async def test_a_wake_that_takes_too_long_is_a_503_with_retry_after() -> None:
    pool, _, scaler = make_pool(wake_timeout_s=0.3)
    scaler.scale = lambda spec, n: asyncio.sleep(0)  # type: ignore[method-assign]  # never comes up
    with pytest.raises(ServiceUnavailable) as caught:
        await pool.acquire(None, set(), 1)
    assert caught.value.status == 503 and caught.value.retry_after is not None
    assert pool.waiting == 0


async def test_an_idle_pool_sleeps_and_the_next_request_wakes_it() -> None:
    now = [1000.0]
    pool, http, scaler = make_pool(idle_timeout_s=30, scale_down="sleep")
    pool.clock = lambda: now[0]
    pool.update([record("w0")])
    pool.last_used = now[0]
    assert not await pool.maybe_scale_down()
    now[0] += 31
    assert await pool.maybe_scale_down()
    assert ("http://w0", "/sleep") in http.calls and pool.ready() == []
    slot = await asyncio.wait_for(pool.acquire(None, set(), 1), 5)
    assert slot.worker_id == "w0" and ("http://w0", "/wake") in http.calls
    assert scaler.requests == []  # woken from sleep, nothing started


async def test_a_registry_read_older_than_a_wake_does_not_start_a_second_wake() -> None:
    """A poll begun before the wake lands after it, still saying "sleeping" (the worker's
    "ready" beat is a task of its own): the woken worker stays ready, waiters take it, and
    nobody wakes the pool again. CI once counted two wakes for one burst this way."""
    pool, http, scaler = make_pool(wake_timeout_s=5)
    asleep = msgspec.structs.replace(record("w0", state="sleeping"), state_since=500.0)
    pool.update([asleep])
    first = await asyncio.wait_for(pool.acquire(None, set(), 1), 5)
    assert first.worker_id == "w0" and wakes(pool) == 1
    pool.update([asleep])  # the stale read
    assert [s.worker_id for s in pool.ready()] == ["w0"]
    again = await asyncio.wait_for(pool.acquire(None, set(), 1), 5)
    assert again.worker_id == "w0" and wakes(pool) == 1
    assert [path for _, path in http.calls].count("/wake") == 1 and scaler.requests == []
    # The worker's own "ready" ends the override; a later change of its own is news again.
    pool.update([msgspec.structs.replace(asleep, state="ready", state_since=510.0)])
    assert pool.workers["w0"].told is None
    pool.update([msgspec.structs.replace(asleep, state_since=520.0)])
    assert pool.ready() == []


async def test_a_registry_read_older_than_a_sleep_does_not_route_to_the_sleeper() -> None:
    now = [1000.0]
    pool, http, _ = make_pool(idle_timeout_s=30, scale_down="sleep")
    pool.clock = lambda: now[0]
    awake = msgspec.structs.replace(record("w0"), state_since=500.0)
    pool.update([awake])
    pool.last_used = now[0]
    now[0] += 31
    assert await pool.maybe_scale_down() and ("http://w0", "/sleep") in http.calls
    pool.update([awake])  # a heartbeat from before the sleep
    assert pool.ready() == [] and pool.workers["w0"].record.state == "sleeping"
    now[0] += 31  # past TOLD_STATE_S the registry wins whatever it says
    pool.update([awake])
    assert [s.worker_id for s in pool.ready()] == ["w0"]


async def test_an_idle_pool_in_exit_mode_scales_to_zero() -> None:
    now = [1000.0]
    pool, _, scaler = make_pool(idle_timeout_s=5, scale_down="exit")
    pool.clock = lambda: now[0]
    pool.update([record("w0")])
    pool.last_used = now[0]
    now[0] += 6
    assert await pool.maybe_scale_down()
    assert scaler.requests == [0] and pool.ready() == []


def request() -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", prompt_token_ids=[1, 2, 3], sampling=Sampling(max_tokens=2)
    )


async def test_a_request_refused_before_any_token_is_retried_elsewhere() -> None:
    pool, http, scaler = make_pool(wake_timeout_s=5)
    pool.update([record("a"), record("b")])
    client = PoolClient(pool)
    http.fail = {"http://a": ["unavailable"], "http://b": ["unavailable"]}
    http.fail[sorted(http.fail)[0]] = []  # one of them refuses (draining), whichever is first
    chunks = [c async for c in client.generate(request())]
    assert chunks[-1].finished
    # Both unreachable: the pool starts a replacement and the request runs there.
    http.fail = {"http://a": ["connect"], "http://b": ["connect"]}
    chunks = [c async for c in client.generate(request())]
    assert chunks[-1].finished and scaler.requests == [1]
    assert http.calls[-1] == ("http://w0", "/generate")
    retries = pool.metrics.registry.get_sample_value(
        "hydrant_dispatch_retries_total", {"model": "demo", "reason": "connect"}
    )
    assert retries == 2
    assert pool.snapshot().inflight == 0


async def test_a_stream_broken_after_a_token_is_not_retried() -> None:
    pool, http, _ = make_pool()
    pool.update([record("a")])
    http.break_after_first = {"http://a"}
    got: list[GenerateChunk] = []
    with pytest.raises(WorkerLost):
        async for chunk in PoolClient(pool).generate(request()):
            got.append(chunk)
    assert len(got) == 1  # what the client already has is all it gets
    assert [c for c in http.calls if c[1] == "/generate"] == [("http://a", "/generate")]


async def test_swap_routes_to_the_new_revision_and_drains_the_old() -> None:
    pool, http, scaler = make_pool(swap_timeout_s=5)
    pool.update([record("old")])

    async def scale(spec: PoolSpec, replicas: int) -> None:
        asyncio.get_running_loop().call_later(
            0.1, lambda: pool.update([record("old"), record("new", path=spec.path)])
        )

    scaler.scale = scale  # type: ignore[method-assign]
    drained = await pool.swap(PoolSpec(model="demo", path="/m2"))
    assert drained == 1 and ("http://old", "/drain") in http.calls
    assert [s.worker_id for s in pool.ready()] == ["new"]
    pool.update([record("old"), record("new", path="/m2")])  # old still heartbeating: unused
    assert [s.worker_id for s in pool.ready()] == ["new"]


async def test_a_full_pool_adds_one_worker_up_to_the_maximum() -> None:
    pool, _, scaler = make_pool(max_workers=2)
    pool.update([record("w0")])
    slots = [await pool.acquire(None, set(), 1) for _ in range(12)]  # capacity 8: full after 8
    await asyncio.sleep(0)
    assert scaler.requests == [2]  # once, not once per request
    assert all(s.worker_id == "w0" for s in slots)  # the full worker still takes them (queued)
    pool.update([record("w0"), record("w1")])
    for slot in slots:
        pool.release(slot, 1)
    for _ in range(20):
        await pool.acquire(None, set(), 1)
    assert scaler.requests == [2]  # at the maximum: no more


async def test_a_worker_busy_with_another_gateways_requests_is_not_put_to_sleep() -> None:
    now = [1000.0]
    pool, http, _ = make_pool(idle_timeout_s=30)
    pool.clock = lambda: now[0]
    busy = msgspec.structs.replace(record("w0"), inflight=2)
    pool.update([busy])
    pool.last_used = now[0]
    now[0] += 60  # idle here...
    assert not await pool.maybe_scale_down()  # ...but not there
    recently = msgspec.structs.replace(record("w0"), idle_since=time.time() - 5)
    pool.update([recently])
    assert not await pool.maybe_scale_down()
    long_ago = msgspec.structs.replace(record("w0"), idle_since=time.time() - 31)
    pool.update([long_ago])
    assert await pool.maybe_scale_down()
    assert ("http://w0", "/sleep") in http.calls


async def test_an_adapter_request_goes_to_the_worker_whose_heartbeat_lists_it() -> None:
    pool, http, _ = make_pool()
    stats = EngineStats(
        num_running=0,
        num_waiting=0,
        kv_usage=0.0,
        num_free_blocks=10,
        num_total_blocks=10,
        prefix_cache_hit_rate=0.0,
        loaded_adapters=("demo:sql",),
    )
    workers = [record(f"w{i}") for i in range(4)]
    workers[2] = msgspec.structs.replace(workers[2], stats=stats)
    pool.update(workers)
    assert pool.stats().loaded_adapters == ("demo:sql",)
    client = PoolClient(pool)
    for i in range(6):
        request = GenerateRequest(
            request_id=f"r{i}",
            prompt_token_ids=list(range(40)),
            sampling=Sampling(max_tokens=2),
            adapter=AdapterRef(name="demo:sql", path="/adapters/sql"),
        )
        async for _ in client.generate(request):
            pass
    assert {address for address, path in http.calls if path == "/generate"} == {"http://w2"}


async def test_admin_drain_of_a_worker_asks_it_to_drain_and_stops_routing_to_it() -> None:
    """`POST /admin/pools/{model}/workers/{id}/drain` on a Hydrant worker: the same `/drain`
    a swap sends; it cannot be undone (the worker exits), and an unknown id is a 404."""
    from hydrant.platform.dispatch.service import PoolManager
    from hydrant.platform.errors import Conflict, NotFound

    pool, http, scaler = make_pool()
    pool.update([record("w0"), record("w1")])
    manager = PoolManager(
        directory=None,  # type: ignore[arg-type]  # not read for a worker's drain
        http=http,  # type: ignore[arg-type]
        scaler=scaler,  # type: ignore[arg-type]
        metrics=pool.metrics,
        pools={"demo": pool},
    )
    await manager.drain("demo", "w0")
    assert ("http://w0", "/drain") in http.calls
    assert [s.worker_id for s in pool.ready()] == ["w1"]
    with pytest.raises(Conflict):
        await manager.drain("demo", "w0", drained=False)
    with pytest.raises(NotFound):
        await manager.drain("demo", "w9")
