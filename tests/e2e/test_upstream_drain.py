"""Draining an upstream member (a real `vllm serve`) through `/admin/pools`, as a worker is
drained: no new requests reach it, the one streaming there finishes in full."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server
from vllm_peer import VllmPeer
from worker_stack import redis_prefix

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

STREAMED = 200  # tokens of the request in flight while the member is drained


@pytest.fixture(scope="module")
def gateway(
    vllm: VllmPeer,
    long_demo_dir: Path,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningServer]:
    with redis_prefix(redis_url) as prefix:
        env = {
            "HYDRANT_REDIS_URL": redis_url,
            "HYDRANT_WORKER_REGISTRY_PREFIX": prefix,
            "HYDRANT_POOL_BACKENDS": f"demo=openai:{vllm.base_url}",
            "HYDRANT_UPSTREAM_HEALTH_S": "0.5",
            "HYDRANT_UPSTREAM_QUEUE_TIMEOUT_S": "2",  # a request with nowhere to go: a quick 503
            "HYDRANT_LOG_FORMAT": "text",
        }
        with hydrant_server(tmp_path_factory.mktemp("gateway"), long_demo_dir, env) as running:
            yield running


def member(gateway: RunningServer) -> dict[str, object]:
    with gateway.admin() as admin:
        (pool,) = admin.get("/admin/pools").raise_for_status().json()["data"]
    (only,) = pool["workers"]
    return dict(only)


def test_a_drained_member_finishes_its_stream_takes_nothing_new_and_comes_back(
    gateway: RunningServer, vllm: VllmPeer
) -> None:
    _, key = gateway.tenant_key("upstream-drain")
    headers = {"Authorization": f"Bearer {key}"}
    worker_id = member(gateway)["worker_id"]
    drain = f"/admin/pools/demo/workers/{worker_id}/drain"
    body = {
        "model": "demo",
        "prompt": "Once upon a time",
        "max_tokens": STREAMED,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # vLLM's finished-request count before the stream starts. Read here, not after the
    # drain: the 200 tokens may all be generated inside vLLM before this test reads again.
    seen = vllm.requests_seen_settled()
    events: list[dict[str, object]] = []
    with (
        httpx.Client(base_url=gateway.base_url, timeout=120) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        lines = answer.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                break  # the first token arrived: drain the member under it
        with gateway.admin() as admin:
            drained = admin.post(drain)
        assert drained.status_code == 200, drained.text
        (view,) = drained.json()["workers"]
        assert view["state"] == "draining"
        refused = http.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "hi", "max_tokens": 4},
            headers=headers,
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "no_worker"
        assert "retry-after" in refused.headers
        for line in lines:  # the request in flight runs to its end
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    usage = events[-1]["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == STREAMED
    # Only the drained stream's own end reaches vLLM's count (its metrics lag a little).
    deadline = time.monotonic() + 15
    while vllm.requests_seen() < seen + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # what it would count by now, had the refused request reached it
    assert vllm.requests_seen() == seen + 1
    assert member(gateway)["state"] == "draining"

    with gateway.admin() as admin:
        back = admin.delete(drain)
    assert back.status_code == 200, back.text
    assert back.json()["workers"][0]["state"] == "ready"
    with httpx.Client(base_url=gateway.base_url, timeout=60) as http:
        again = http.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "hi", "max_tokens": 4},
            headers=headers,
        )
    assert again.status_code == 200, again.text


def test_draining_an_unknown_member_is_a_404(gateway: RunningServer) -> None:
    with gateway.admin() as admin:
        answer = admin.post("/admin/pools/demo/workers/openai-nope/drain")
    assert answer.status_code == 404, answer.text
