"""Refresh-ahead of the key cache (auth/key_cache.py): a key in steady use is looked up
again in the background once half its TTL is gone, so no request of it waits for the
database, and a revocation found that way applies before the TTL would end it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from control_plane_helpers import ControlPlane
from sqlalchemy import update

from hydrant.platform.auth import service as auth_service
from hydrant.platform.auth.key_codec import PREFIX_RANDOM_LENGTH
from hydrant.platform.db.models import ApiKey
from hydrant.platform.errors import AuthenticationFailed


class HeldLookups:
    """`find_key_record` counted, and its answer (read at once) held until the test lets
    it go."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.answer = threading.Event()
        real = auth_service.find_key_record

        async def held(session: Any, prefix: str) -> Any:
            self.calls += 1
            record = await real(session, prefix)
            await asyncio.to_thread(self.answer.wait, 30)
            return record

        monkeypatch.setattr(auth_service, "find_key_record", held)


def authenticate(cp: ControlPlane, secret: str) -> Any:
    async def call() -> Any:
        # a request that waited for the held lookup would take 30 s: fail at once instead
        return await asyncio.wait_for(
            cp.authenticator.authenticate(f"Bearer {secret}", "inference"), 5
        )

    return cp.in_app(call)


async def settled(cp: ControlPlane) -> None:
    """Every background lookup of the authenticator has finished."""
    deadline = time.monotonic() + 10
    while cp.authenticator._refreshing:
        assert time.monotonic() < deadline, "the background lookup never finished"
        await asyncio.sleep(0.01)


async def test_a_key_in_steady_use_never_waits_for_the_database(
    cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, secret = await cp.tenant_with_key("acme")
    first = await authenticate(cp, secret)  # cached now
    ttl = cp.authenticator.cache.ttl_s
    lookups = HeldLookups(monkeypatch)

    cp.clock.mono += 0.6 * ttl  # past half the TTL: the entry still serves, and is renewed
    assert (await authenticate(cp, secret)).key_id == first.key_id
    deadline = time.monotonic() + 10
    while lookups.calls < 1:  # the renewal is under way, held, and the request did not wait
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert (await authenticate(cp, secret)).key_id == first.key_id  # one renewal at a time
    lookups.answer.set()
    await settled(cp)
    assert lookups.calls == 1

    # Past the first entry's TTL: the renewed entry serves, again without a wait
    lookups.answer.clear()
    cp.clock.mono += 0.6 * ttl
    assert (await authenticate(cp, secret)).key_id == first.key_id
    lookups.answer.set()
    await settled(cp)


async def test_a_renewal_that_finds_the_key_revoked_ends_it_before_the_ttl(
    cp: ControlPlane,
) -> None:
    _, secret = await cp.tenant_with_key("acme")
    await authenticate(cp, secret)
    # Another gateway node revokes it: this node's cache does not hear about it.
    await cp.execute(
        update(ApiKey)
        .where(ApiKey.prefix == secret[: len("hyd_test_") + PREFIX_RANDOM_LENGTH])
        .values(revoked_at=cp.clock.wall)
    )
    cp.clock.mono += 0.6 * cp.authenticator.cache.ttl_s
    await authenticate(cp, secret)  # served from the cache; the renewal starts
    await settled(cp)
    with pytest.raises(AuthenticationFailed):
        await authenticate(cp, secret)  # still inside the first entry's TTL


async def test_a_key_revoked_on_this_node_during_a_renewal_stays_revoked(
    cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal read the key's row before the revocation and answers after it: what it
    read must not put the key back."""
    tenant = await cp.create_tenant("acme")
    key, secret = await cp.create_key(tenant["id"])
    await authenticate(cp, secret)
    lookups = HeldLookups(monkeypatch)
    cp.clock.mono += 0.6 * cp.authenticator.cache.ttl_s
    await authenticate(cp, secret)  # the renewal starts, reads the row, and is held
    deadline = time.monotonic() + 10
    while lookups.calls < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # its read done
    revoked = await cp.client.post(f"/admin/keys/{key['id']}/revoke", headers=cp.admin)
    assert revoked.json()["status"] == "revoked"
    lookups.answer.set()
    await settled(cp)
    with pytest.raises(AuthenticationFailed):
        await authenticate(cp, secret)
