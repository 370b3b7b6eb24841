"""`hydrant preflight`'s pool-only checks against a gateway with real worker pools.

The gateway spawns its own `hydrant worker` processes (local scaler); the pool
goes to zero when idle. Preflight's first request then wakes it: that is the
cold start it measures. The rollback drill swaps the pool to a second
checkpoint and back while requests flow.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hydrant_server import RunningServer
from test_preflight import preflight
from worker_stack import pool_env, pool_gateway, pools, redis_prefix, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]


@contextmanager
def sleeping_pool(
    redis_url: str, data_dir: Path, model_dir: Path, **extra: str
) -> Iterator[RunningServer]:
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url,
            prefix,
            HYDRANT_POOL_SCALER="local",
            HYDRANT_POOL_START_WORKERS="1",
            HYDRANT_POOL_IDLE_TIMEOUT_S="3",
            HYDRANT_POOL_SCALE_DOWN="sleep",
            HYDRANT_POOL_WAKE_TIMEOUT_S="120",
            **extra,
        )
        with pool_gateway(data_dir, model_dir, env) as server:
            wait_until(
                lambda: [w["state"] for w in pools(server)["workers"]] == ["sleeping"],
                120,
                "the idle worker to sleep",
            )
            yield server


def checks_of(result: Any) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def test_cold_start_is_measured_from_zero(
    demo_model_dir: Path, redis_url: str, data_dir: Path
) -> None:
    with sleeping_pool(redis_url, data_dir, demo_model_dir) as server:
        result = preflight(server, "--json", "--only", "cold start,rollback drill")
        assert result.returncode == 0, result.stdout + result.stderr
        checks = checks_of(result)
        cold = checks["cold start"]
        assert cold["status"] == "PASS", cold
        assert float(cold["measured"].removesuffix(" s")) > 0
        drill = checks["rollback drill"]  # a pool, but no previous checkpoint given
        assert drill["status"] == "SKIP" and "--rollback-to" in drill["detail"]

        warm = preflight(server, "--json", "--only", "cold start")  # the pool is awake now
        assert checks_of(warm)["cold start"]["status"] == "SKIP"
        assert "warm" in checks_of(warm)["cold start"]["detail"]


def test_rollback_drill_swaps_back_and_forth_without_failures(
    demo_model_dir: Path, redis_url: str, data_dir: Path, tmp_path: Path
) -> None:
    previous = tmp_path / "demo-previous"
    shutil.copytree(demo_model_dir, previous)
    extra = {"HYDRANT_POOL_SWAP_TIMEOUT_S": "90"}
    with sleeping_pool(redis_url, data_dir, demo_model_dir, **extra) as server:
        args = ["--json", "--only", "rollback drill", "--rollback-to", str(previous)]
        result = preflight(server, *args)
        drill = checks_of(result)["rollback drill"]
        assert f"{previous.name}: 200" in drill["measured"], drill  # the first swap worked
        assert drill["status"] == "PASS", drill
        assert drill["measured"].startswith("0/")  # no request failed
        assert pools(server)["path"] == str(demo_model_dir)  # rolled forward again
