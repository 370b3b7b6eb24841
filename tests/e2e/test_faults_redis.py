"""Redis stopped under a gateway that uses it for quotas: fail closed, then recover by itself.

With `HYDRANT_REDIS_FAILURE_MODE=closed` (the default) no request is served
unmetered while the quota store is gone: each request that has a limit to count
(its tenant's plan) gets a 503 with an OpenAI error
body that says why. When Redis is back on its address the same gateway
process serves again, without a restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from hydrant_server import hydrant_server
from private_services import REDIS_SERVER, PrivateRedis, private_redis
from test_ledger_faults import BODY

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


async def post(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
    )


async def first_status(client: httpx.AsyncClient, key: str, want: int, timeout_s: float) -> int:
    """Send requests until one answers `want` (bounded); the last status seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = (await post(client, key)).status_code
        if status == want or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.2)


@pytest.mark.skipif(REDIS_SERVER is None, reason="needs redis-server")
async def test_redis_outage_fails_closed_and_recovers_without_restart(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    with private_redis(tmp_path) as redis:
        await _outage(redis, demo_model_dir, tmp_path)


async def _outage(redis: PrivateRedis, demo_model_dir: Path, tmp_path: Path) -> None:
    env = {"HYDRANT_REDIS_URL": redis.url, "HYDRANT_REDIS_FAILURE_MODE": "closed"}
    data = tmp_path / "gateway"
    data.mkdir()
    with hydrant_server(data, demo_model_dir, env=env) as server:
        # A plan with limits: a tenant without one has nothing counted in Redis on short
        # requests, so it is served throughout (nothing goes unmetered).
        plan = server.create_plan("metered", requests_per_minute=10_000, tokens_per_day=10**9)
        _, key = server.tenant_key("redis-outage", plan=plan)
        _, unlimited = server.tenant_key("no-plan")
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            before = await asyncio.gather(*(post(client, key) for _ in range(4)))
            assert [r.status_code for r in before] == [200] * 4

            await asyncio.to_thread(redis.stop)
            during = [await post(client, key) for _ in range(6)]
            assert [r.status_code for r in during] == [503] * 6  # never a 200 unmetered
            error = during[-1].json()["error"]
            assert error["code"] == "quota_unavailable"
            assert "quota service is unavailable" in error["message"]
            assert set(error) >= {"message", "type", "code"}
            assert during[-1].headers.get("retry-after")
            assert (await post(client, unlimited)).status_code == 200  # no limit to count

            await asyncio.to_thread(redis.start)
            assert await first_status(client, key, 200, timeout_s=30) == 200
            after = await asyncio.gather(*(post(client, key) for _ in range(4)))
            assert [r.status_code for r in after] == [200] * 4
        assert server.process.poll() is None  # the same process all along
        log = server.log_file.read_text(errors="replace")
        assert "unavailable" in log
