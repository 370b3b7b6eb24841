"""Key guessing: after N failed key attempts from one source, that source gets 429 for a while.

The block answers the same 429 to a right key and a wrong one, so it never
reveals whether a key exists; a missing key or a valid key without the scope
is not a guess and does not count. On Redis the count is shared by gateways.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from control_plane_helpers import ControlPlane, bearer, control_plane
from redis.asyncio import Redis

from hydrant.platform.auth.brute_force import BruteForceGuard, BruteForcePolicy
from hydrant.platform.auth.key_codec import generate_key
from hydrant.platform.errors import RateLimited
from hydrant.platform.http.client_address import client_address, parse_trusted_proxies
from hydrant.platform.quotas import InMemoryQuotaBackend
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend
from hydrant.platform.services import services_of

POLICY = BruteForcePolicy(max_failures=3, window_s=60, block_s=300)


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        clock = plane.clock
        services_of(plane.app).auth.brute_force = BruteForceGuard(
            InMemoryQuotaBackend(clock=lambda: clock.wall.timestamp()),
            POLICY,
            monotonic=clock.monotonic,
            owns_backend=True,
        )
        yield plane


def _guard(cp: ControlPlane) -> BruteForceGuard:
    guard = services_of(cp.app).auth.brute_force
    assert guard is not None
    return guard


def _sample(guard: BruteForceGuard, name: str) -> float:
    value = guard.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


async def test_failed_keys_block_the_source_and_the_block_reveals_nothing(
    cp: ControlPlane,
) -> None:
    _, tenant_secret = await cp.tenant_with_key("acme")
    assert (await cp.client.get("/account", headers=bearer(tenant_secret))).status_code == 200
    wrong_keys = [
        generate_key("test").secret,  # well-formed, unknown
        tenant_secret[:-1] + ("x" if tenant_secret[-1] != "x" else "y"),  # checksum fails
        "hyd_test_not-a-key",
    ]
    for key in wrong_keys:
        response = await cp.client.get("/account", headers=bearer(key))
        assert response.status_code == 401, response.text

    refused = await cp.client.get("/account", headers=bearer(generate_key("test").secret))
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "auth_rate_limited"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert 290 <= int(refused.headers["retry-after"]) <= 300
    # The right key, an admin key, a wrong key: the very same answer while blocked.
    for headers in (bearer(tenant_secret), cp.admin, bearer(wrong_keys[0]), {}):
        response = await cp.client.get("/account", headers=headers)
        assert response.status_code == 429
        assert response.json() == refused.json()
        assert response.headers["retry-after"] == refused.headers["retry-after"]

    guard = _guard(cp)
    assert _sample(guard, "hydrant_auth_failures_total") == 3
    assert _sample(guard, "hydrant_auth_sources_blocked_total") == 1
    assert _sample(guard, "hydrant_auth_blocked_requests_total") == 5
    cp.clock.advance(100)
    response = await cp.client.get("/account", headers=bearer(tenant_secret))
    assert response.status_code == 429
    assert 190 <= int(response.headers["retry-after"]) <= 200  # the cool-down counts down

    cp.clock.advance(201)  # the cool-down is over
    assert (await cp.client.get("/account", headers=bearer(tenant_secret))).status_code == 200
    assert (await cp.client.get("/account", headers=bearer(wrong_keys[0]))).status_code == 401


async def test_missing_keys_and_missing_scopes_are_not_guesses(cp: ControlPlane) -> None:
    _, tenant_secret = await cp.tenant_with_key("acme")
    for _ in range(10):
        assert (await cp.client.get("/account")).status_code == 401
        response = await cp.client.get("/admin/tenants", headers=bearer(tenant_secret))
        assert response.status_code == 403
    assert (await cp.client.get("/account", headers=bearer(tenant_secret))).status_code == 200
    assert _sample(_guard(cp), "hydrant_auth_failures_total") == 0


async def test_failures_count_within_their_window_only(cp: ControlPlane) -> None:
    wrong = bearer(generate_key("test").secret)
    for _ in range(2):
        assert (await cp.client.get("/account", headers=wrong)).status_code == 401
    cp.clock.advance(61)  # those two have left the window
    for _ in range(2):
        assert (await cp.client.get("/account", headers=wrong)).status_code == 401
    assert (await cp.client.get("/account", headers=wrong)).status_code == 401  # 3rd in window
    assert (await cp.client.get("/account", headers=wrong)).status_code == 429


async def test_the_app_wires_the_guard_and_exports_its_metrics(
    database_url: str, data_dir: Path
) -> None:
    async with control_plane(database_url, data_dir) as plane:  # the guard create_app built
        wrong = bearer(generate_key("test").secret)
        default = BruteForcePolicy()
        for _ in range(default.max_failures):
            assert (await plane.client.get("/account", headers=wrong)).status_code == 401
        assert (await plane.client.get("/account", headers=wrong)).status_code == 429
        text = (await plane.client.get("/metrics")).text
    assert f"hydrant_auth_failures_total {float(default.max_failures)}" in text
    assert "hydrant_auth_sources_blocked_total 1.0" in text
    assert "hydrant_auth_blocked_requests_total 1.0" in text


def test_forwarded_for_is_believed_only_from_trusted_proxies() -> None:
    def scope(peer: str, forwarded: str | None = None) -> dict[str, object]:
        headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
        return {"client": (peer, 5000), "headers": headers}

    proxies = parse_trusted_proxies("10.0.0.0/8, 192.0.2.7")
    # No trusted proxies configured: the header is anyone's to forge.
    assert client_address(scope("203.0.113.5", "198.51.100.1")) == "203.0.113.5"
    # From an untrusted peer, still ignored.
    assert client_address(scope("203.0.113.5", "198.51.100.1"), proxies) == "203.0.113.5"
    # Through trusted proxies: the right-most address that is not a proxy.
    assert client_address(scope("10.1.2.3", "198.51.100.1"), proxies) == "198.51.100.1"
    assert (
        client_address(scope("10.1.2.3", "1.1.1.1, 198.51.100.1, 192.0.2.7"), proxies)
        == "198.51.100.1"
    )
    # A forged left-most entry does not help the client pick its source.
    assert client_address(scope("10.1.2.3", "6.6.6.6, 198.51.100.1"), proxies) == "198.51.100.1"
    # Garbage in the chain: stop believing it, use the proxy itself.
    assert client_address(scope("10.1.2.3", "nonsense"), proxies) == "10.1.2.3"
    assert client_address({"headers": []}) == "unknown"
    with pytest.raises(Exception, match="TRUSTED_PROXIES"):
        parse_trusted_proxies("10.0.0.0/33")


@pytest.mark.integration
async def test_on_redis_every_gateway_sees_the_block(redis_url: str) -> None:
    prefix = f"test:bruteforce:{uuid.uuid4().hex}"
    stores = [RedisQuotaBackend.from_url(redis_url, key_prefix=prefix) for _ in range(2)]
    first, second = (BruteForceGuard(store, POLICY, owns_backend=True) for store in stores)
    try:
        for _ in range(3):
            await first.record_failure("198.51.100.9")
        with pytest.raises(RateLimited) as blocked:
            await second.check("198.51.100.9")  # the other gateway
        assert blocked.value.retry_after is not None and 0 < blocked.value.retry_after <= 300
        await second.check("198.51.100.10")  # another source is not affected
    finally:
        for guard in (first, second):
            await guard.aclose()
        cleaner = Redis.from_url(redis_url)
        keys = [key async for key in cleaner.scan_iter(match=f"{prefix}*")]
        if keys:
            await cleaner.delete(*keys)
        await cleaner.aclose()


async def test_an_unreachable_store_blocks_nobody() -> None:
    store = RedisQuotaBackend.from_url("redis://127.0.0.1:1/0", key_prefix="test:bf-down")
    guard = BruteForceGuard(store, POLICY, owns_backend=True)
    try:
        for _ in range(5):
            await guard.record_failure("198.51.100.9")
        await guard.check("198.51.100.9")  # fails open: the quota gate applies the policy
    finally:
        await guard.aclose()
