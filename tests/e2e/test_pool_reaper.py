"""The scale-to-zero reaper job (issue #7) against a real `hydrant worker` on the real Redis.

No gateway: the reaper works from the registry alone (that is its point: pools
whose gateway is gone, or that each gateway sees only part of). It runs as
the job the Celery beat schedules, through the job registry: a busy worker,
and one used moments ago, are left alone; an idle one is put to sleep; a
second run finds nothing to do and leaves the sleeping worker as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from worker_stack import SECRET, pool_env, redis_prefix, wait_until, worker_processes

from hydrant.engine.protocol import GenerateRequest, Sampling
from hydrant.engine.worker.wire import (
    SECRET_HEADER,
    WorkerRecord,
    pool_key,
    record_decoder,
    record_key,
)
from hydrant.platform.db.session import Database
from hydrant.platform.dispatch.tasks import REAP
from hydrant.platform.dispatch.worker_http import WorkerHttp
from hydrant.platform.job_table import JOB_TABLE, PERIODIC
from hydrant.platform.jobs.celery_app import make_celery
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

IDLE_TIMEOUT_S = 3.0


def the_record(redis_url: str, prefix: str) -> WorkerRecord:
    client = redis.Redis.from_url(redis_url)
    try:
        ids = client.zrange(pool_key(prefix, "demo"), 0, -1)
        raws = [client.get(record_key(prefix, i.decode())) for i in ids]
    finally:
        client.close()
    records = [record_decoder.decode(r) for r in raws if r is not None]
    assert len(records) == 1, records
    return records[0]


def worker_state(address: str) -> str:
    stats = httpx.get(f"{address}/stats", headers={SECRET_HEADER: SECRET}, timeout=10)
    return str(stats.json()["state"])


def long_generation(address: str, stop: threading.Event) -> None:
    """A request that keeps the worker busy until `stop` (then the gateway gives it up)."""
    request = GenerateRequest(
        request_id=f"busy-{time.monotonic_ns()}",
        prompt_token_ids=list(range(10, 40)),
        sampling=Sampling(max_tokens=1500, temperature=0, ignore_eos=True),
    )

    async def run() -> None:
        http = WorkerHttp(SECRET)
        try:
            async with contextlib.aclosing(http.generate(address, request)) as chunks:
                async for _ in chunks:
                    if stop.is_set():
                        return
        finally:
            await http.aclose()

    asyncio.run(run())


def test_the_reaper_sleeps_an_idle_worker_leaves_a_busy_one_and_is_idempotent(
    demo_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    with redis_prefix(redis_url) as prefix:
        env = pool_env(redis_url, prefix)
        settings = load_settings(
            {},
            data_dir=tmp_path,
            redis_url=redis_url,
            worker_secret=SECRET,
            worker_registry_prefix=prefix,
            pool_idle_timeout_s=IDLE_TIMEOUT_S,
            pool_scale_down="sleep",
        )
        database = Database(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}")
        scheduler = EmbeddedScheduler(settings, database, JOB_TABLE)

        def reap() -> dict[str, Any]:
            result = asyncio.run(scheduler.run(REAP))
            assert isinstance(result, dict), "the reaper job failed (see the log)"
            return result

        with worker_processes(1, demo_model_dir, env, tmp_path):
            wait_until(lambda: _ready(redis_url, prefix), 120, "the worker to register ready")
            address = the_record(redis_url, prefix).address

            # Busy: a request is running on it (its heartbeat says so).
            stop = threading.Event()
            busy = threading.Thread(target=long_generation, args=(address, stop), daemon=True)
            busy.start()
            try:
                wait_until(
                    lambda: the_record(redis_url, prefix).inflight >= 1, 30, "a busy heartbeat"
                )
                assert reap() == {"pools": []}
                assert worker_state(address) == "ready"
            finally:
                stop.set()
                busy.join(60)

            # Used moments ago: still within the idle timeout.
            wait_until(lambda: the_record(redis_url, prefix).inflight == 0, 30, "an idle heartbeat")
            record = the_record(redis_url, prefix)
            assert record.idle_since is not None
            if time.time() - record.idle_since < IDLE_TIMEOUT_S - 1:
                assert reap() == {"pools": []}
                assert worker_state(address) == "ready"

            # Idle past the timeout: asleep.
            wait_until(
                lambda: (
                    time.time() - (the_record(redis_url, prefix).idle_since or 0) > IDLE_TIMEOUT_S
                ),
                30,
                "the idle timeout to pass",
            )
            reaped = reap()
            assert reaped == {
                "pools": [{"model": "demo", "mode": "sleep", "workers": [record.worker_id]}]
            }
            assert worker_state(address) == "sleeping"
            wait_until(
                lambda: the_record(redis_url, prefix).state == "sleeping", 10, "the registry"
            )

            # Again: nothing left to do, nothing woken or broken.
            assert reap() == {"pools": []}
            assert worker_state(address) == "sleeping"
            woke = httpx.post(f"{address}/wake", headers={SECRET_HEADER: SECRET}, timeout=60)
            assert woke.status_code == 200 and worker_state(address) == "ready"
            # Woken for a request on its way: fresh, not idle since before its sleep.
            wait_until(lambda: the_record(redis_url, prefix).state == "ready", 10, "the registry")
            assert reap() == {"pools": []}


def _ready(redis_url: str, prefix: str) -> bool:
    client = redis.Redis.from_url(redis_url)
    try:
        if not client.zrange(pool_key(prefix, "demo"), 0, -1):
            return False
    finally:
        client.close()
    return the_record(redis_url, prefix).state == "ready"


def test_celery_beat_schedules_the_reaper(tmp_path: Path) -> None:
    settings = load_settings({}, data_dir=tmp_path, redis_url="redis://127.0.0.1:1/5")
    app = make_celery(settings, JOB_TABLE)
    assert REAP in app.tasks
    assert any(entry["task"] == REAP for entry in app.conf.beat_schedule.values())
    assert [p.job for p in PERIODIC if p.job == REAP] == [REAP]
