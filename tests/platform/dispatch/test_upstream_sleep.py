"""vLLM's sleep mode in an upstream pool: the monitor's states, the pool's calls (pure logic).

The scripted server answers the health checks and sleep mode's calls the way vLLM
0.32 does (`/is_sleeping`: `{"is_sleeping": bool}`); the real thing, a `hydrant
serve` upstream that sleeps and wakes through the same calls: tests/e2e/
test_upstream_hydrant_sleep.py (vLLM's CPU build refuses `--enable-sleep-mode`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import msgspec
import pytest
from test_reaper import FakeCalls

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.errors import ConfigurationError
from hydrant.platform.dispatch.fair_share import FairQueue
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.pool import SCALE_OUT_INTERVAL_S, WorkerPool
from hydrant.platform.dispatch.reaper import reap_idle_pools
from hydrant.platform.dispatch.scaler import NoScaler, PoolSpec
from hydrant.platform.dispatch.service import upstream_scaling
from hydrant.platform.dispatch.upstream_health import UpstreamMonitor, stats_of
from hydrant.platform.dispatch.upstream_http import SLEEP_PATH, WAKE_PATH
from hydrant.platform.dispatch.worker_http import WorkerUnavailable
from hydrant.settings import UpstreamSpec, load_settings

URL = "http://vllm-demo:8000"


class SleepyServer:
    """A vLLM in dev mode with sleep mode on: health, models, metrics, `/is_sleeping`,
    and the `/sleep` and `/wake_up` calls a pool sends (recorded)."""

    sleep_path = SLEEP_PATH
    wake_path = WAKE_PATH

    def __init__(self, answers_sleep: bool = True) -> None:
        self.asleep = False
        self.answers_sleep = answers_sleep
        self.refuse_sleep = False
        self.calls: list[str] = []

    async def get(self, url: str, timeout_s: float) -> httpx.Response:
        if url.endswith("/v1/models"):
            return httpx.Response(200, json={"data": [{"id": "demo", "root": "/models/demo"}]})
        if url.endswith("/metrics"):
            return httpx.Response(200, text='vllm:num_requests_running{model_name="demo"} 0\n')
        return httpx.Response(200)

    async def is_sleeping(self, url: str, timeout_s: float) -> bool | None:
        return self.asleep if self.answers_sleep else None

    async def call(self, address: str, method: str, path: str, **_: Any) -> Any:
        self.calls.append(path)
        if path == SLEEP_PATH:
            if self.refuse_sleep:
                raise WorkerUnavailable("failed", "upstream answered HTTP 400 to /sleep")
            self.asleep = True
        elif path == WAKE_PATH:
            self.asleep = False
        return None


def monitor_of(server: SleepyServer, sleep: bool = True) -> UpstreamMonitor:
    return UpstreamMonitor(
        spec=UpstreamSpec(model="demo", kind="openai", urls=(URL,), sleep=sleep),
        http=server,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]  # probe() writes nothing
    )


async def test_a_sleeping_member_is_published_sleeping_since_the_probe_that_saw_it() -> None:
    server = SleepyServer()
    monitor = monitor_of(server)
    awake = await monitor.probe(URL)
    assert awake is not None and awake.state == "ready"
    again = await monitor.probe(URL)
    assert again is not None and again.state_since == awake.state_since  # no change: same stamp
    server.asleep = True
    asleep = await monitor.probe(URL)
    assert asleep is not None and asleep.state == "sleeping"  # kept in the pool, not removed
    assert asleep.state_since > awake.state_since
    server.asleep = False
    woken = await monitor.probe(URL)
    assert woken is not None and woken.state == "ready" and woken.state_since > asleep.state_since


async def test_sleep_is_only_asked_of_pools_that_sleep_and_members_that_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = SleepyServer()
    server.asleep = True  # what a pool that does not sleep must not act on
    record = await monitor_of(server, sleep=False).probe(URL)
    assert record is not None and record.state == "ready"
    silent = SleepyServer(answers_sleep=False)  # vLLM without VLLM_SERVER_DEV_MODE=1
    monitor = monitor_of(silent)
    for _ in range(3):
        record = await monitor.probe(URL)
        assert record is not None and record.state == "ready"
    warnings = [r for r in caplog.records if "does not answer /is_sleeping" in r.getMessage()]
    assert len(warnings) == 1  # said once, not every probe


def test_the_load_of_a_hydrant_upstream_is_read_from_its_engine_gauges() -> None:
    text = (
        'hydrant_num_requests_running{model="demo"} 2.0\n'
        'hydrant_num_requests_waiting{model="demo"} 1.0\n'
        'hydrant_kv_cache_usage_perc{model="demo"} 0.25\n'
        'hydrant_num_requests_running{model="other"} 7.0\n'
    )
    stats = stats_of(text, "demo")
    assert stats is not None
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (2, 1, 0.25)
    assert stats_of("hydrant_pool_waiting_requests 0\n", "demo") is None  # no engine gauges


def member(state: str = "ready") -> WorkerRecord:
    now = time.time()
    return WorkerRecord(
        worker_id="openai-1",
        model="demo",
        address=URL,
        device="upstream",
        state=state,  # type: ignore[arg-type]
        path="/models/demo",
        kind="openai",
        capacity=256,
        idle_since=now - 3600,
        heartbeat_at=now,
        state_since=now - 10,
    )


def sleepy_pool(server: SleepyServer, now: list[float]) -> WorkerPool:
    settings = load_settings(
        environ={
            "HYDRANT_POOL_BACKENDS": f"demo=openai:{URL}",
            "HYDRANT_UPSTREAM_SLEEP": "demo",
            "HYDRANT_REDIS_URL": "redis://127.0.0.1:6379/0",
            "HYDRANT_POOL_IDLE_TIMEOUT_S": "300",
            "HYDRANT_POOL_WAKE_TIMEOUT_S": "5",
        }
    )
    scaler, options = upstream_scaling(settings, sleep=True)
    return WorkerPool(
        spec=PoolSpec(model="demo", path="/models/demo"),
        http=server,  # type: ignore[arg-type]
        scaler=scaler,
        metrics=PoolMetrics(),
        options=options,
        kind="openai",
        fair=FairQueue(member_tokens=1000, timeout_s=1.0),
        clock=lambda: now[0],
    )


async def test_an_idle_pool_sleeps_and_a_request_through_the_fair_queue_wakes_it() -> None:
    server = SleepyServer()
    now = [0.0]
    pool = sleepy_pool(server, now)
    pool.update([member()])
    assert not await pool.maybe_scale_down()  # just made: not idle yet
    now[0] += 301
    assert await pool.maybe_scale_down()
    assert server.calls == [SLEEP_PATH] and pool.ready() == []
    # the health checks' next record says so; the member stays in the pool
    pool.update([member("sleeping")])
    assert pool.snapshot().replicas == {"sleeping": 1}
    fair = pool.fair
    assert fair is not None
    # the fair queue's own timeout (1 s) is shorter than a wake may take (5 s): it waits
    tickets = [fair.enqueue("t1", 1.0) for _ in range(3)]
    slots = await asyncio.wait_for(
        asyncio.gather(*(pool.acquire(None, set(), 10, None, t) for t in tickets)), 10
    )
    assert {s.worker_id for s in slots} == {"openai-1"}
    assert server.calls == [SLEEP_PATH, WAKE_PATH]  # one wake for the three
    assert pool.metrics.wakes.labels("demo")._value.get() == 1


async def test_a_member_that_refuses_to_sleep_is_not_asked_again_at_once() -> None:
    server = SleepyServer()
    server.refuse_sleep = True  # e.g. vLLM started without --enable-sleep-mode
    now = [301.0]
    pool = sleepy_pool(server, now)
    pool.last_used = 0.0
    pool.update([member()])
    assert await pool.maybe_scale_down()
    assert pool.ready() != []  # still serving
    now[0] += 1
    assert not await pool.maybe_scale_down()
    now[0] += SCALE_OUT_INTERVAL_S
    assert await pool.maybe_scale_down()
    assert server.calls == [SLEEP_PATH, SLEEP_PATH]


def test_sleep_mode_settings() -> None:
    base = {
        "HYDRANT_POOL_BACKENDS": f"demo=openai:{URL}",
        "HYDRANT_REDIS_URL": "redis://127.0.0.1:6379/0",
        "HYDRANT_UPSTREAM_API_KEY": "tenant-key",
    }
    plain = load_settings(environ=base)
    assert not plain.upstream_pools()["demo"].sleep
    assert plain.upstream_control_secret() == "tenant-key"  # vLLM: one key, or none needed
    sleepy = load_settings(
        environ={**base, "HYDRANT_UPSTREAM_SLEEP": "demo", "HYDRANT_UPSTREAM_CONTROL_KEY": "adm"}
    )
    assert sleepy.upstream_pools()["demo"].sleep
    assert sleepy.upstream_control_secret() == "adm"
    scaler, options = upstream_scaling(sleepy, sleep=True)
    assert isinstance(scaler, NoScaler)  # sleeping needs no scaler
    assert options.scale_down == "sleep" and options.idle_timeout_s == sleepy.pool_idle_timeout_s
    with pytest.raises(ConfigurationError, match="UPSTREAM_SLEEP"):
        load_settings(environ={**base, "HYDRANT_UPSTREAM_SLEEP": "demo,other"})


class Registry:
    """The registry as the reaper reads it: one idle upstream pool."""

    async def models(self) -> list[str]:
        return ["demo"]

    async def workers(self, model: str) -> list[WorkerRecord]:
        return [member()]


async def test_the_reaper_leaves_a_sleeping_upstream_pool_to_its_gateways() -> None:
    class Workload(NoScaler):
        def __init__(self) -> None:
            self.scaled: list[int] = []

        async def scale(self, spec: PoolSpec, replicas: int) -> None:
            self.scaled.append(replicas)

    workload, calls = Workload(), FakeCalls()
    args: Any = (Registry(), calls, NoScaler(), 300.0, "sleep")
    kept = await reap_idle_pools(*args, upstream=workload, sleeping_upstreams=frozenset({"demo"}))
    assert kept == [] and workload.scaled == [] and calls.calls == []
    reaped = await reap_idle_pools(*args, upstream=workload)
    assert [r.mode for r in reaped] == ["exit"] and workload.scaled == [0]


async def test_a_member_put_to_sleep_under_our_requests_is_woken_at_once() -> None:
    """Another gateway's idle check and this one's dispatch crossed: the member sleeps with
    a request of ours on it, which vLLM holds until a wake; the registry's next record
    says `sleeping`, and this gateway wakes it without waiting for a new request."""
    server = SleepyServer()
    now = [0.0]
    pool = sleepy_pool(server, now)
    pool.update([member()])
    fair = pool.fair
    assert fair is not None
    slot = await pool.acquire(None, set(), 10, None, fair.enqueue("t1", 1.0))
    pool.update([member("sleeping")])  # put to sleep by another gateway
    await asyncio.sleep(0)  # the wake's task starts
    wake = pool._wake
    assert wake is not None
    await asyncio.wait_for(wake, 5)
    assert server.calls == [WAKE_PATH] and pool.ready() == [slot]
    pool.release(slot, 10)
    # slept again (a record newer than our wake), with nothing of ours on it: left asleep
    pool.update([msgspec.structs.replace(member("sleeping"), state_since=time.time() + 1)])
    await asyncio.sleep(0)
    assert server.calls == [WAKE_PATH] and pool.ready() == []
