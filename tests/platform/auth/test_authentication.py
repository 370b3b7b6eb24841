"""The key lifecycle through the real app: every way a key fails, and what each answers."""

from __future__ import annotations

import zlib
from datetime import timedelta

from control_plane_helpers import INVALID_BODY, ControlPlane, bearer
from sqlalchemy import select, update

from hydrant.platform.auth import key_hashing as hashing
from hydrant.platform.auth.base62 import encode_fixed, random_string
from hydrant.platform.auth.key_codec import CHECKSUM_LENGTH, PREFIX_RANDOM_LENGTH, generate_key
from hydrant.platform.db.models import ApiKey


def _same_prefix_other_secret(secret: str) -> str:
    """A well-formed key (valid checksum) sharing `secret`'s public prefix: a forgery."""
    marker_env = secret[: len("hyd_test_")]
    random_part = secret[len(marker_env) : -CHECKSUM_LENGTH]
    forged = random_part[:PREFIX_RANDOM_LENGTH] + random_string(
        len(random_part) - PREFIX_RANDOM_LENGTH
    )
    checksum = encode_fixed(zlib.crc32(f"{marker_env}{forged}".encode()), CHECKSUM_LENGTH)
    return f"{marker_env}{forged}{checksum}"


async def _account(cp: ControlPlane, secret: str) -> tuple[int, dict]:
    response = await cp.client.get("/account", headers=bearer(secret))
    return response.status_code, response.json()


async def test_a_tenant_key_reaches_its_account(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    status, body = await _account(cp, secret)
    assert status == 200, body
    assert body["tenant"]["id"] == tenant["id"]
    assert body["plan"]["name"] == "default"
    assert body["plan"]["max_prompt_tokens"] == 8192


async def test_every_bad_key_answers_the_same_401(cp: ControlPlane) -> None:
    _, good = await cp.tenant_with_key("acme")
    _, revoked = await cp.tenant_with_key("beta")
    beta_key = (await cp.client.get("/admin/keys", headers=cp.admin)).json()["data"]
    revoked_id = next(k["id"] for k in beta_key if revoked.startswith(k["prefix"]))
    assert (await cp.client.post(f"/admin/keys/{revoked_id}/revoke", headers=cp.admin)).is_success
    tenant = await cp.create_tenant("gamma")
    _, expired = await cp.create_key(
        tenant["id"], expires_at=(cp.clock.wall + timedelta(seconds=30)).isoformat()
    )
    assert (await _account(cp, expired))[0] == 200
    cp.clock.advance(31)

    typo = good[:-1] + ("A" if good[-1] != "A" else "B")
    candidates = {
        "wrong checksum": typo,
        "unknown": generate_key("test").secret,
        "known prefix, wrong secret": _same_prefix_other_secret(good),
        "revoked": revoked,
        "expired": expired,
        "garbage": "not-a-key",
    }
    for why, secret in candidates.items():
        status, body = await _account(cp, secret)
        assert (status, body) == (401, INVALID_BODY), why
    assert (await _account(cp, good))[0] == 200


async def test_missing_or_non_bearer_credentials_are_401(cp: ControlPlane) -> None:
    _, secret = await cp.tenant_with_key("acme")
    for headers in ({}, {"api-key": secret}, {"authorization": f"Basic {secret}"}):
        response = await cp.client.get("/account", headers=headers)
        assert response.status_code == 401
        assert "missing API key" in response.json()["error"]["message"]


async def test_unknown_prefixes_cost_a_dummy_verification(cp: ControlPlane, monkeypatch) -> None:
    calls: list[str] = []
    real_dummy = hashing.verify_against_dummy

    def counting(secret: str, server_secret: bytes) -> bool:
        calls.append("dummy")
        return real_dummy(secret, server_secret)

    monkeypatch.setattr("hydrant.platform.auth.service.verify_against_dummy", counting)
    assert (await _account(cp, generate_key("test").secret))[0] == 401
    assert calls == ["dummy"]


async def test_wrong_scope_is_403(cp: ControlPlane) -> None:
    _, tenant_secret = await cp.tenant_with_key("acme")
    response = await cp.client.get("/admin/tenants", headers=bearer(tenant_secret))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "insufficient_scope"
    response = await cp.client.get("/account", headers=cp.admin)
    assert response.status_code == 403
    assert "`inference` scope" in response.json()["error"]["message"]


async def test_suspended_tenant_is_403_with_a_readable_reason(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    assert (await _account(cp, secret))[0] == 200  # now cached
    await cp.client.post(f"/admin/tenants/{tenant['id']}/suspend", headers=cp.admin)
    status, body = await _account(cp, secret)
    assert status == 403
    assert body["error"]["code"] == "tenant_suspended"
    assert "tenant suspended" in body["error"]["message"]
    await cp.client.post(f"/admin/tenants/{tenant['id']}/resume", headers=cp.admin)
    assert (await _account(cp, secret))[0] == 200


async def test_a_key_revoked_elsewhere_stops_within_the_cache_ttl(cp: ControlPlane) -> None:
    _, secret = await cp.tenant_with_key("acme")
    assert (await _account(cp, secret))[0] == 200
    # Another gateway node revokes it: this node's cache does not hear about it.
    await cp.execute(
        update(ApiKey)
        .where(ApiKey.prefix == secret[: len("hyd_test_") + PREFIX_RANDOM_LENGTH])
        .values(revoked_at=cp.clock.wall)
    )
    cp.clock.mono += cp.authenticator.cache.ttl_s - 0.5
    assert (await _account(cp, secret))[0] == 200  # still cached: bounded staleness
    cp.clock.mono += 0.5
    assert await _account(cp, secret) == (401, INVALID_BODY)


async def test_a_key_revoked_on_this_node_stops_at_once(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    key, secret = await cp.create_key(tenant["id"])
    assert (await _account(cp, secret))[0] == 200
    response = await cp.client.post(f"/admin/keys/{key['id']}/revoke", headers=cp.admin)
    assert response.json()["status"] == "revoked"
    assert await _account(cp, secret) == (401, INVALID_BODY)


async def test_rotation_keeps_the_old_key_until_the_grace_ends(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    old, old_secret = await cp.create_key(tenant["id"], name="prod")
    response = await cp.client.post(
        f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 60}, headers=cp.admin
    )
    assert response.status_code == 200, response.text
    rotated = response.json()
    new_secret = rotated["secret"]
    assert rotated["key"]["rotated_from_id"] == old["id"]
    assert rotated["key"]["name"] == "prod"
    assert rotated["previous"]["status"] == "rotating"
    assert (await _account(cp, old_secret))[0] == 200
    assert (await _account(cp, new_secret))[0] == 200
    cp.clock.advance(60)
    assert await _account(cp, old_secret) == (401, INVALID_BODY)
    assert (await _account(cp, new_secret))[0] == 200
    again = await cp.client.post(f"/admin/keys/{old['id']}/rotate", headers=cp.admin)
    assert again.status_code == 409


async def test_rotation_without_grace_stops_the_old_key_now(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    old, old_secret = await cp.create_key(tenant["id"])
    assert (await _account(cp, old_secret))[0] == 200
    response = await cp.client.post(
        f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 0}, headers=cp.admin
    )
    assert response.json()["previous"]["status"] == "rotated"
    assert await _account(cp, old_secret) == (401, INVALID_BODY)
    assert (await _account(cp, response.json()["secret"]))[0] == 200


async def test_last_used_is_written_at_most_once_a_minute(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    key, secret = await cp.create_key(tenant["id"])
    recorder = cp.authenticator.last_used
    await cp.in_app(recorder.flush)  # the admin key's use
    first_use = cp.clock.wall
    for _ in range(3):
        assert (await _account(cp, secret))[0] == 200
        cp.clock.advance(10)
    assert list(recorder.pending) == [key["id"]]
    assert await cp.in_app(recorder.flush) == 1
    assert await cp.in_app(recorder.flush) == 0  # nothing new within the minute

    async def stored() -> object:
        return await cp.execute(select(ApiKey.last_used_at).where(ApiKey.id == key["id"]))

    assert await stored() == first_use
    cp.clock.advance(31)  # 61 s after the first use
    assert (await _account(cp, secret))[0] == 200
    assert await cp.in_app(recorder.flush) == 1
    assert await stored() == cp.clock.wall
