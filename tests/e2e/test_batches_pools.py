"""A batch run by a job worker against worker pools, the pool asleep at zero when it starts.

The gateway dispatches to a `hydrant worker` pool (Redis) and, holding no engine, runs
no batch itself; a job process (`hydrant jobs run hydrant.batches.run`, what a Celery
worker's task runs) opens the same request path on the pools (`open_job_runtime`),
wakes the sleeping worker with the batch's first line and runs every line there. The
batch completes with one output line and one ledger entry per line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from worker_stack import metric, pool_env, pool_gateway, pools, redis_prefix, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]


def test_a_job_worker_wakes_a_pool_at_zero_for_a_batch(
    demo_model_dir: Path, redis_url: str, data_dir: Path
) -> None:
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "demo",
                "messages": [{"role": "user", "content": f"n {i}"}],
                "max_tokens": 6,
                "temperature": 0,
            },
        }
        for i in range(5)
    ]
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
            wait_until(
                lambda: [w["state"] for w in pools(server)["workers"]] == ["sleeping"],
                120,
                "the idle worker to sleep",
            )
            _, key = server.tenant_key("acme")
            headers = {"Authorization": f"Bearer {key}"}
            content = "".join(json.dumps(line) + "\n" for line in lines).encode()
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as client:
                upload = client.post(
                    "/v1/files",
                    files={"file": ("in.jsonl", content, "application/jsonl")},
                    data={"purpose": "batch"},
                ).json()
                batch = client.post(
                    "/v1/batches",
                    json={
                        "input_file_id": upload["id"],
                        "endpoint": "/v1/chat/completions",
                        "completion_window": "24h",
                    },
                ).json()
                assert batch["status"] == "in_progress", batch
                time.sleep(2)  # the gateway has no engine: nothing runs the batch here
                assert (
                    client.get(f"/v1/batches/{batch['id']}").json()["request_counts"]["completed"]
                    == 0
                )

                job = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "hydrant.cli",
                        "jobs",
                        "run",
                        "hydrant.batches.run",
                        "--arg",
                        f"batch_id={batch['id']}",
                    ],
                    env={
                        **os.environ,
                        **env,
                        "HYDRANT_DATA_DIR": str(data_dir),
                        "HYDRANT_MODELS": f"demo={demo_model_dir}",
                    },
                    capture_output=True,
                    timeout=300,
                )
                assert job.returncode == 0, job.stderr.decode()[-3000:]
                assert json.loads(job.stdout)["outcome"] == "completed"
                done = client.get(f"/v1/batches/{batch['id']}").json()
                assert done["status"] == "completed", done
                output = client.get(f"/v1/files/{done['output_file_id']}/content").text
            assert sorted(json.loads(x)["custom_id"] for x in output.splitlines()) == [
                f"q{i}" for i in range(5)
            ]
            assert [w["state"] for w in pools(server)["workers"]] == ["ready"]  # woken
            assert metric(server, "hydrant_pool_replicas", 'model="demo",state="ready"') == 1
