"""Scale to zero and back, and hot swap, with the gateway's own local process scaler.

The gateway spawns its `hydrant worker` processes itself (HYDRANT_POOL_SCALER=local).
What must hold: an idle pool goes to zero (its worker sleeps, or exits, by
setting); 20 requests arriving together at zero all succeed on one wake; a
swap to another checkpoint under load fails no request and ends with only
workers of the new checkpoint.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from worker_stack import (
    CHAT,
    Load,
    metric,
    pool_env,
    pool_gateway,
    pools,
    redis_prefix,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]


def chat(base_url: str, key: str, n: int, max_tokens: int = 6) -> int:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": f"hello number {n}"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    response = httpx.post(
        f"{base_url}{CHAT}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=180
    )
    if response.status_code == 200 and response.json()["usage"]["completion_tokens"] != max_tokens:
        return -1  # a 200 that did not carry the whole answer (checked by the callers)
    return response.status_code


def states(server: object) -> list[str]:
    return sorted(w["state"] for w in pools(server)["workers"])  # type: ignore[arg-type]


def burst(base_url: str, key: str, count: int = 20) -> list[int]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda n: chat(base_url, key, n), range(count)))


def test_idle_pool_sleeps_wakes_once_for_a_burst_and_swaps_under_load(
    demo_model_dir: Path, redis_url: str, data_dir: Path, tmp_path: Path
) -> None:
    v2 = tmp_path / "demo-v2"
    shutil.copytree(demo_model_dir, v2)
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url,
            prefix,
            HYDRANT_POOL_SCALER="local",
            HYDRANT_POOL_START_WORKERS="1",
            HYDRANT_POOL_IDLE_TIMEOUT_S="3",
            HYDRANT_POOL_SCALE_DOWN="sleep",
            HYDRANT_POOL_WAKE_TIMEOUT_S="120",
        )
        with pool_gateway(data_dir, demo_model_dir, env) as server:
            # Idle past 3 s: the worker sleeps (weights kept), the pool is at zero.
            wait_until(lambda: states(server) == ["sleeping"], 120, "the idle worker to sleep")
            assert metric(server, "hydrant_pool_replicas", 'model="demo",state="sleeping"') == 1
            assert metric(server, "hydrant_pool_replicas", 'model="demo",state="ready"') == 0
            _, key = server.tenant_key("acme")
            assert httpx.get(f"{server.base_url}/admin/pools").status_code == 401
            as_tenant = {"Authorization": f"Bearer {key}"}
            swap = httpx.post(
                f"{server.base_url}/admin/pools/demo/swap", json={}, headers=as_tenant
            )
            assert swap.status_code in (401, 403)

            assert burst(server.base_url, key) == [200] * 20
            assert metric(server, "hydrant_pool_wakes_total") == 1  # one wake, not 20
            assert metric(server, "hydrant_pool_wake_seconds_count") == 1

            with server.admin() as admin:
                bad = admin.post("/admin/pools/demo/swap", json={"path": str(tmp_path / "none")})
                assert bad.status_code == 422 and bad.json()["error"]["param"] == "path"
                unknown = admin.post("/admin/pools/nope/swap", json={"path": str(v2)})
                assert unknown.status_code == 404
                listed = admin.get("/admin/pools").json()["data"]
                assert [p["model"] for p in listed] == ["demo"]

            # Hot swap under load: new worker up, old one drained, nothing fails.
            with Load(lambda n: chat(server.base_url, key, n), threads=3) as load:
                wait_until(lambda: len(load.results) >= 3, 60, "load to run")
                with server.admin() as admin:
                    admin.timeout = 300
                    swapped = admin.post("/admin/pools/demo/swap", json={"path": str(v2)})
                assert swapped.status_code == 200, swapped.text
                assert swapped.json()["drained"] == 1
                during = len(load.results)
                wait_until(lambda: len(load.results) >= during + 6, 60, "load after the swap")
            assert load.results and all(code == 200 for code in load.results), load.results
            wait_until(
                lambda: [w["path"] for w in pools(server)["workers"]] == [str(v2)],
                60,
                "only the new checkpoint's worker",
            )
            assert pools(server)["path"] == str(v2)


def test_idle_pool_in_exit_mode_stops_its_worker_and_a_burst_starts_one(
    demo_model_dir: Path, redis_url: str, data_dir: Path
) -> None:
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url,
            prefix,
            HYDRANT_POOL_SCALER="local",
            HYDRANT_POOL_START_WORKERS="1",
            HYDRANT_POOL_IDLE_TIMEOUT_S="3",
            HYDRANT_POOL_SCALE_DOWN="exit",
            HYDRANT_POOL_WAKE_TIMEOUT_S="150",
        )
        with pool_gateway(data_dir, demo_model_dir, env) as server:
            wait_until(lambda: states(server) == ["ready"], 120, "the first worker")
            wait_until(lambda: states(server) == [], 60, "the idle worker to exit")
            _, key = server.tenant_key("acme")
            assert burst(server.base_url, key) == [200] * 20
            assert metric(server, "hydrant_pool_wakes_total") == 1
            assert states(server) == ["ready"]


def test_a_pool_that_cannot_wake_in_time_answers_503_with_retry_after(
    demo_model_dir: Path, redis_url: str, data_dir: Path
) -> None:
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url,
            prefix,
            HYDRANT_POOL_SCALER="none",  # nobody starts a worker
            HYDRANT_POOL_START_WORKERS="0",
            HYDRANT_POOL_WAKE_TIMEOUT_S="1",
        )
        with pool_gateway(data_dir, demo_model_dir, env) as server:
            _, key = server.tenant_key("acme")
            body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
            response = httpx.post(
                f"{server.base_url}{CHAT}",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
            assert response.status_code == 503
            assert int(response.headers["retry-after"]) >= 1
            error = response.json()["error"]
            assert error["type"] == "server_error" and error["code"] == "model_not_ready"
            assert "demo" in error["message"]
