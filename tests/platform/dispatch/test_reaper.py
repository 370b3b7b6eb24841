"""The reaper's decisions over registry records on the real Redis, with the worker calls faked.

The real worker being put to sleep: tests/e2e/test_pool_reaper.py. Here, the
choices: which pools are idle (every worker, every gateway's requests), exit
mode (the scaler asked for zero, each worker asked to drain), a pool in the
middle of a hot swap left to its gateway, a registry with no pools.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from hydrant.engine.protocol import EngineStats
from hydrant.engine.worker.wire import (
    WorkerRecord,
    models_key,
    pool_key,
    record_encoder,
    record_key,
)
from hydrant.platform.dispatch.directory import WorkerDirectory
from hydrant.platform.dispatch.reaper import Reaped, reap_idle_pools
from hydrant.platform.dispatch.scale_down import idle_past
from hydrant.platform.dispatch.scaler import PoolSpec

pytestmark = pytest.mark.integration

NOW = 1_000_000.0


class FakeCalls:
    sleep_path = "/sleep"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def call(self, address: str, method: str, path: str, **_: Any) -> Any:
        self.calls.append((address, path))
        return {}


class FakeScaler:
    rolls_itself = False

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        self.asked.append((spec.model, replicas))

    async def update(self, spec: PoolSpec) -> None:
        return None

    async def retire(self, keep: PoolSpec) -> None:
        return None

    async def close(self) -> None:
        return None


def make(worker_id: str, model: str, **fields: Any) -> WorkerRecord:
    values: dict[str, Any] = {
        "worker_id": worker_id,
        "model": model,
        "address": f"http://{worker_id}",
        "device": "cpu",
        "state": "ready",
        "path": "/m",
        "idle_since": NOW - 600,
        "heartbeat_at": NOW,
    }
    values.update(fields)
    return WorkerRecord(**values)


@pytest.fixture()
async def directory(redis_url: str) -> AsyncIterator[WorkerDirectory]:
    prefix = f"hydrant-test:{uuid.uuid4().hex}"
    client = aioredis.Redis.from_url(redis_url)
    directory = WorkerDirectory(client, prefix)
    try:
        yield directory
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await directory.aclose()


async def register(directory: WorkerDirectory, *records: WorkerRecord) -> None:
    for r in records:
        await directory.client.set(
            record_key(directory.prefix, r.worker_id), record_encoder.encode(r)
        )
        await directory.client.zadd(pool_key(directory.prefix, r.model), {r.worker_id: time.time()})
        await directory.client.sadd(models_key(directory.prefix), r.model)


def test_idle_means_idle_on_every_worker_for_every_gateway() -> None:
    assert idle_past([make("a", "m"), make("b", "m")], 300, NOW)
    assert not idle_past([make("a", "m"), make("b", "m", inflight=1)], 300, NOW)
    assert not idle_past([make("a", "m", idle_since=NOW - 10)], 300, NOW)
    assert idle_past([], 300, NOW)


async def test_sleep_mode_sleeps_only_pools_idle_on_every_worker(
    directory: WorkerDirectory,
) -> None:
    await register(
        directory,
        make("idle-1", "quiet"),
        make("idle-2", "quiet"),
        make("asleep", "dozing", state="sleeping"),
        make("busy-idle", "mixed"),
        make("busy", "mixed", inflight=2),
        make("recent", "fresh", idle_since=NOW - 5),
        # an upstream server (vLLM): its deployment scales it, it takes no /sleep
        make("vllm", "upstream", kind="openai", idle_since=None),
    )
    http, scaler = FakeCalls(), FakeScaler()
    reaped = await reap_idle_pools(directory, http, scaler, 300, "sleep", now=NOW)
    assert reaped == [Reaped("quiet", "sleep", ("idle-1", "idle-2"))]
    assert sorted(http.calls) == [("http://idle-1", "/sleep"), ("http://idle-2", "/sleep")]
    assert scaler.asked == []


async def test_exit_mode_scales_to_zero_and_drains_and_a_swap_is_left_alone(
    directory: WorkerDirectory,
) -> None:
    await register(
        directory,
        make("old", "swapping", path="/v1"),
        make("new", "swapping", path="/v2"),
        make("lone", "solo", path="/v3", quantization="int8"),
    )
    http, scaler = FakeCalls(), FakeScaler()
    reaped = await reap_idle_pools(directory, http, scaler, 300, "exit", now=NOW)
    assert reaped == [Reaped("solo", "exit", ("lone",))]
    assert scaler.asked == [("solo", 0)] and http.calls == [("http://lone", "/drain")]
    assert await reap_idle_pools(directory, http, scaler, 0, "exit", now=NOW) == []  # off


async def test_an_empty_registry_is_nothing_to_do(directory: WorkerDirectory) -> None:
    assert await reap_idle_pools(directory, FakeCalls(), FakeScaler(), 300, "sleep") == []


async def test_an_idle_upstream_pool_goes_to_zero_only_with_an_upstream_scaler(
    directory: WorkerDirectory,
) -> None:
    """vLLM members: their workload scaled to 0 (no call to them) when idle on every gateway."""
    await register(
        directory,
        make("vllm-a", "big", kind="openai"),
        make("vllm-b", "busy-big", kind="openai", stats=stats(running=2)),
        make("vllm-c", "recent-big", kind="openai", idle_since=NOW - 30),
    )
    http, scaler, upstream = FakeCalls(), FakeScaler(), FakeScaler()
    assert await reap_idle_pools(directory, http, scaler, 300, "sleep", now=NOW) == []
    reaped = await reap_idle_pools(
        directory, http, scaler, 300, "sleep", now=NOW, upstream=upstream
    )
    assert reaped == [Reaped("big", "exit", ("vllm-a",))]
    assert upstream.asked == [("big", 0)]
    assert scaler.asked == [] and http.calls == []


def stats(running: int) -> EngineStats:
    return EngineStats(
        num_running=running,
        num_waiting=0,
        kv_usage=0.0,
        num_free_blocks=0,
        num_total_blocks=0,
        prefix_cache_hit_rate=0.0,
    )
