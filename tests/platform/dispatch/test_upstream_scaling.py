"""An upstream pool (vLLM) scaled from zero and back by the gateway: the kubernetes scaler.

The Kubernetes API is the fake of k8s_fake_api (real HTTP, no cluster in CI).
A vLLM pod coming up is what the health checks then register: here the fake
API registers the member in the pool when it is scaled to 1, the way the
registry poll would (the health checks against a real vLLM:
tests/e2e/test_upstream_vllm.py). What is checked: the workload's scale
subresource patched once for many waiting requests, the requests routed when
the member appears, the scale back to zero after the idle time without any
call to the member, and the KEDA-only default where the gateway scales nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from k8s_fake_api import TOKEN, FakeApi, fake_api

from hydrant.engine.protocol import EngineStats
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.fair_share import FairQueue, Ticket
from hydrant.platform.dispatch.kubernetes import KubernetesScaler
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.pool import WorkerPool
from hydrant.platform.dispatch.scale_down import idle_past
from hydrant.platform.dispatch.scaler import NoScaler, PoolSpec
from hydrant.platform.dispatch.service import upstream_scaling
from hydrant.platform.dispatch.upstream_health import UpstreamMonitor
from hydrant.settings import UpstreamSpec, load_settings

__all__ = ["fake_api"]  # the fixture, used by name

MEMBER = "openai:http://vllm-demo:8000"


def member(running: int = 0) -> WorkerRecord:
    """The record the health checks write for a vLLM that serves the model."""
    return WorkerRecord(
        worker_id=MEMBER,
        model="demo",
        address="http://vllm-demo:8000",
        device="upstream",
        state="ready",
        path="/models/demo",
        kind="openai",
        capacity=256,
        stats=EngineStats(
            num_running=running,
            num_waiting=0,
            kv_usage=0.0,
            num_free_blocks=0,
            num_total_blocks=0,
            prefix_cache_hit_rate=0.0,
        ),
        idle_since=time.time() - 3600,
        heartbeat_at=time.time(),
    )


class NoCalls:
    """The member's control calls: an upstream must get none (no /drain, no worker secret)."""

    sleep_path = "/sleep?level=1"
    wake_path = "/wake_up"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def call(self, address: str, method: str, path: str, **_: Any) -> Any:
        self.calls.append((address, path))
        return {}


def ticket(pool: WorkerPool) -> Ticket | None:
    return pool.fair.enqueue("tenant", 1.0) if pool.fair is not None else None


def settings_for(url: str, **env: str) -> Any:
    return load_settings(
        environ={
            "HYDRANT_POOL_BACKENDS": "demo=openai:http://vllm-demo:8000",
            "HYDRANT_REDIS_URL": "redis://127.0.0.1:6379/0",
            "HYDRANT_POOL_SCALER": "kubernetes",
            "HYDRANT_K8S_API_URL": url,
            "HYDRANT_K8S_TOKEN": TOKEN,
            "HYDRANT_K8S_NAMESPACE": "serving",
            "HYDRANT_POOL_WAKE_TIMEOUT_S": "20",
            "HYDRANT_POOL_IDLE_TIMEOUT_S": "300",
            **env,
        }
    )


@pytest.mark.parametrize("fair", [False, True], ids=["first-come", "fair-queue"])
async def test_requests_at_zero_scale_the_group_up_once_then_route_and_idle_scales_it_down(
    fair: bool, fake_api: tuple[FakeApi, str]
) -> None:
    """`fair-queue`: the upstream default (HYDRANT_UPSTREAM_MAX_INFLIGHT_TOKENS), whose
    own timeout (1 s here) is shorter than the wake may take; it waited for no wake
    (and never scaled the workload) before session 53."""
    api, url = fake_api
    settings = settings_for(url, HYDRANT_K8S_UPSTREAM_WORKLOAD="leaderworkerset/vllm-{model}")
    scaler, options = upstream_scaling(settings)
    assert isinstance(scaler, KubernetesScaler)
    now = [0.0]
    http = NoCalls()
    pool = WorkerPool(
        spec=PoolSpec(model="demo", path="/models/demo"),
        http=http,  # type: ignore[arg-type]
        scaler=scaler,
        metrics=PoolMetrics(),
        options=options,
        kind="openai",
        clock=lambda: now[0],
        fair=FairQueue(member_tokens=1000, timeout_s=1.0) if fair else None,
    )
    pool.update([])  # the registry read: no member (vLLM at zero)
    loop = asyncio.get_running_loop()

    def pod_ready(resource: str, replicas: int) -> None:
        if replicas > 0:  # the group starts; its leader passes the health checks
            loop.call_soon_threadsafe(loop.call_later, 0.3, pool.update, [member()])

    api.on_scale = pod_ready
    slots = await asyncio.wait_for(
        asyncio.gather(*(pool.acquire(None, set(), 10, None, ticket(pool)) for _ in range(5))), 15
    )
    assert {s.worker_id for s in slots} == {MEMBER}
    group = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/serving/leaderworkersets/vllm-demo/scale"
    assert [(p["path"], p["body"]) for p in api.patches] == [
        (group, {"spec": {"replicas": 1}})  # one wake for the five waiting requests
    ]
    for slot in slots:
        pool.release(slot, 10)  # (a fair queue's tickets: finished by dispatch, not here)
    assert not await pool.maybe_scale_down()  # just used
    now[0] += 301
    assert await pool.maybe_scale_down()
    assert [p["body"] for p in api.patches][1:] == [{"spec": {"replicas": 0}}]
    assert http.calls == []  # vLLM is stopped by its workload, never called


async def test_a_member_busy_with_another_gateways_requests_is_not_scaled_down(
    fake_api: tuple[FakeApi, str],
) -> None:
    api, url = fake_api
    scaler, options = upstream_scaling(settings_for(url))
    now = [0.0]
    pool = WorkerPool(
        spec=PoolSpec(model="demo", path="/models/demo"),
        http=NoCalls(),  # type: ignore[arg-type]
        scaler=scaler,
        metrics=PoolMetrics(),
        options=options,
        kind="openai",
        clock=lambda: now[0],
    )
    pool.update([member(running=3)])  # vLLM reports requests this gateway did not send
    now[0] += 301
    assert not await pool.maybe_scale_down()
    assert api.patches == []
    pool.update([member(running=0)])
    assert await pool.maybe_scale_down()
    assert api.patches[0]["path"].endswith("/deployments/vllm-demo/scale")  # the default


def test_without_the_kubernetes_scaler_keda_scales_and_the_gateway_never_does() -> None:
    settings = load_settings(
        environ={
            "HYDRANT_POOL_BACKENDS": "demo=openai:http://vllm-demo:8000",
            "HYDRANT_REDIS_URL": "redis://127.0.0.1:6379/0",
            "HYDRANT_POOL_SCALER": "none",
        }
    )
    scaler, options = upstream_scaling(settings)
    assert isinstance(scaler, NoScaler)
    assert options.idle_timeout_s == 0.0 and options.start_workers == 0
    # the wait of a request at zero, while KEDA wakes it, is the same bounded wake
    assert options.wake_timeout_s == settings.pool_wake_timeout_s


@pytest.mark.parametrize("workload", ["deployment/vllm-{model}", "leaderworkerset/vllm-{model}"])
def test_the_gateway_scales_an_upstream_pool_between_zero_and_one_only(
    workload: str, fake_api: tuple[FakeApi, str]
) -> None:
    _, url = fake_api
    _, options = upstream_scaling(settings_for(url, HYDRANT_K8S_UPSTREAM_WORKLOAD=workload))
    # a Service is one member whatever runs behind it: more replicas are KEDA's or an HPA's
    assert options.max_workers == 1 and options.start_workers == 0
    assert options.scale_down == "exit"  # vLLM has no Hydrant sleep
    assert options.idle_timeout_s == 300


class ScriptedServer:
    """A vLLM's answers to the health checks (pure logic of the monitor; the real vLLM's:
    tests/e2e/test_upstream_vllm.py): its load from `/metrics` set by the test."""

    def __init__(self) -> None:
        self.running = 0

    async def get(self, url: str, timeout_s: float) -> httpx.Response:
        if url.endswith("/v1/models"):
            return httpx.Response(200, json={"data": [{"id": "demo", "root": "/models/demo"}]})
        if url.endswith("/metrics"):
            text = f'vllm:num_requests_running{{model_name="demo"}} {self.running}.0\n'
            text += 'vllm:num_requests_waiting{model_name="demo"} 0.0\n'
            text += 'vllm:kv_cache_usage_perc{model_name="demo"} 0.0\n'
            return httpx.Response(200, text=text)
        return httpx.Response(200)


async def test_the_health_checks_say_since_when_a_member_has_been_idle() -> None:
    """What the scale to zero waits on for an upstream member: the last probe that saw
    requests running there (any gateway's), or its first sighting."""
    server = ScriptedServer()
    monitor = UpstreamMonitor(
        spec=UpstreamSpec(model="demo", kind="openai", urls=("http://vllm-demo:8000",)),
        http=server,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]  # probe() writes nothing
    )
    first = await monitor.probe("http://vllm-demo:8000")
    assert first is not None and first.idle_since == first.started_at
    server.running = 2
    busy = await monitor.probe("http://vllm-demo:8000")
    assert busy is not None and busy.idle_since == busy.heartbeat_at
    assert not idle_past([busy], 300, busy.heartbeat_at + 1)
    server.running = 0
    quiet = await monitor.probe("http://vllm-demo:8000")
    assert quiet is not None and quiet.idle_since == busy.heartbeat_at  # idle since then
    assert idle_past([quiet], 300, busy.heartbeat_at + 301)
    assert not idle_past([quiet], 300, busy.heartbeat_at + 299)
