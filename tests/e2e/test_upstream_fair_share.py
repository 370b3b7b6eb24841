"""Fair share in front of a real `vllm serve`: a tenant with ten times the load does not
starve another (vLLM alone serves first come, first served).

The gateway admits 2 requests' worth of tokens into the member at once; one tenant keeps
80 requests outstanding, the other 8: both stay backlogged even while some of theirs are in
the gateway's own hands (auth, ledger, the HTTP round trip) rather than waiting. Shares are
measured over a fixed count of finished requests after a warm-up, never over wall-clock
time, so a slow or busy machine changes how long it takes, not what it shows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server
from vllm_peer import VllmPeer
from worker_stack import redis_prefix

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = [1, 5, 6, 7, 8, 9, 10, 11]  # token ids: every request the same size
# Long against the gateway's own time per request (auth, quotas, ledger, HTTP): while a
# request is in those hands it is neither waiting nor running, and a tenant with none
# waiting when room frees loses its turn. At 96 a CI run once gave `light` 0.29.
MAX_TOKENS = 192
IN_FLIGHT = 2  # requests the member runs at once
FLOOD, LIGHT = 80, 8  # requests each tenant keeps outstanding: ten times the load
WARM_UP = 20  # finished requests not counted (the queue fills, counters settle)
MEASURED = 100  # finished requests counted after that


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
            "HYDRANT_UPSTREAM_MAX_INFLIGHT_TOKENS": str(IN_FLIGHT * (len(PROMPT) + MAX_TOKENS)),
            "HYDRANT_UPSTREAM_QUEUE_TIMEOUT_S": "600",
            "HYDRANT_LOG_FORMAT": "text",
        }
        with hydrant_server(tmp_path_factory.mktemp("gateway"), long_demo_dir, env) as running:
            yield running


async def served_shares(
    gateway: RunningServer, streams: dict[str, tuple[str, int]]
) -> dict[str, float]:
    """`streams`: tenant name → (API key, requests it keeps outstanding). Each tenant's share of
    the tokens (prompt + completion) of finished requests WARM_UP+1 .. WARM_UP+MEASURED."""
    finished: list[tuple[str, int]] = []
    seconds: dict[str, list[float]] = {tenant: [] for tenant in streams}
    enough = asyncio.Event()
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}

    async def keep_sending(http: httpx.AsyncClient, tenant: str, key: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        while not enough.is_set():
            sent = time.monotonic()
            answer = await http.post("/v1/completions", json=body, headers=headers)
            seconds[tenant].append(time.monotonic() - sent)
            assert answer.status_code == 200, answer.text
            usage = answer.json()["usage"]
            assert usage["completion_tokens"] == MAX_TOKENS
            finished.append((tenant, usage["prompt_tokens"] + usage["completion_tokens"]))
            if len(finished) >= WARM_UP + MEASURED:
                enough.set()

    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=600, limits=limits) as http:
        tasks = [
            asyncio.create_task(keep_sending(http, tenant, key))
            for tenant, (key, count) in streams.items()
            for _ in range(count)
        ]
        try:
            await asyncio.wait_for(enough.wait(), 600)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [
        r
        for r in results
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
    ]
    assert not errors, errors
    measured = finished[WARM_UP : WARM_UP + MEASURED]
    # Shown when the test fails: how long a request of each tenant took, queue included.
    print(
        {t: f"{len(s)} requests, mean {sum(s) / max(len(s), 1):.2f} s" for t, s in seconds.items()}
    )
    total = sum(tokens for _, tokens in measured)
    return {t: sum(n for who, n in measured if who == t) / total for t in streams}


async def test_a_tenant_with_ten_times_the_load_gets_half_the_tokens(
    gateway: RunningServer,
) -> None:
    _, flood = gateway.tenant_key("fair-flood")
    _, light = gateway.tenant_key("fair-light")
    shares = await served_shares(gateway, {"flood": (flood, FLOOD), "light": (light, LIGHT)})
    print(f"equal weights, {FLOOD} vs {LIGHT} outstanding: {shares}")  # shown with -s
    # First come, first served would give `light` about 1/11 of the tokens.
    assert shares["light"] == pytest.approx(0.5, rel=0.1), shares


async def test_a_plan_of_weight_two_gets_two_thirds_against_a_flood(
    gateway: RunningServer,
) -> None:
    plan = gateway.create_plan("fair-gold", fair_share_weight="2")
    _, flood = gateway.tenant_key("fair-flood-2")
    _, gold = gateway.tenant_key("fair-gold", plan=plan)
    shares = await served_shares(gateway, {"flood": (flood, FLOOD), "gold": (gold, LIGHT)})
    print(f"weights 1:2, {FLOOD} vs {LIGHT} outstanding: {shares}")  # shown with -s
    assert shares["gold"] == pytest.approx(2 / 3, rel=0.1), shares
