"""`KeyService` on a real database: what is stored, who may do what, rotation and adoption."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from hydrant.platform.auth.key_codec import generate_key, parse_key
from hydrant.platform.auth.key_hashing import hash_key
from hydrant.platform.auth.principal import CONSOLE, Principal
from hydrant.platform.db.models import ApiKey, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from hydrant.platform.keys.service import KeyService

SECRET = b"k" * 32
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture()
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    async with db.session() as session:
        session.add_all([Tenant(id="ten_a", name="a"), Tenant(id="ten_b", name="b")])
    yield db
    await db.dispose()


def service(session: object, clock: list[datetime] | None = None) -> KeyService:
    moments = clock or [NOW]
    return KeyService(session, server_secret=SECRET, key_env="test", clock=lambda: moments[0])  # type: ignore[arg-type]


async def test_only_the_hmac_and_the_prefix_are_stored(database: Database) -> None:
    async with database.session() as session:
        key, secret = await service(session).create(CONSOLE, tenant_id="ten_a", name=" ci ")
    async with database.session() as session:
        row = await session.scalar(select(ApiKey).where(ApiKey.id == key.id))
    assert row is not None
    assert row.key_hash == hash_key(secret, SECRET)
    assert row.prefix == parse_key(secret).prefix and secret.startswith(row.prefix)
    assert secret not in repr([getattr(row, c.key) for c in ApiKey.__table__.columns])
    assert (row.scopes, row.name, row.tenant_id) == ("inference", "ci", "ten_a")


async def test_admin_keys_have_no_tenant_and_the_admin_scope(database: Database) -> None:
    async with database.session() as session:
        key, secret = await service(session).create(CONSOLE, tenant_id=None)
    assert (key.tenant_id, key.scopes) == (None, "admin")
    assert secret.startswith("hyd_test_")


async def test_refusals(database: Database) -> None:
    tenant_principal = Principal("ten_a", "key_x", "hyd_test_x", frozenset({"inference"}))
    async with database.session() as session:
        keys = service(session)
        with pytest.raises(PermissionDenied):
            await keys.create(tenant_principal, tenant_id="ten_a")
        with pytest.raises(NotFound):
            await keys.create(CONSOLE, tenant_id="ten_nope")
        with pytest.raises(InvalidRequest, match="past"):
            await keys.create(CONSOLE, tenant_id="ten_a", expires_at=NOW - timedelta(seconds=1))
        b_key, _ = await keys.create(CONSOLE, tenant_id="ten_b")
        with pytest.raises(NotFound):  # another tenant's key does not exist for this tenant
            await keys.get(tenant_principal, b_key.id)
        rows, more = await keys.list(tenant_principal)
        assert (list(rows), more) == ([], False)


async def test_revoke_is_idempotent_and_rotation_rules(database: Database) -> None:
    clock = [NOW]
    async with database.session() as session:
        keys = service(session, clock)
        key, _ = await keys.create(CONSOLE, tenant_id="ten_a")
        for bad in (timedelta(seconds=-1), timedelta(days=31)):
            with pytest.raises(InvalidRequest, match="grace"):
                await keys.rotate(CONSOLE, key.id, grace=bad)
        new, _, old = await keys.rotate(CONSOLE, key.id, grace=timedelta(hours=1))
        assert old.grace_until == NOW + timedelta(hours=1)
        assert new.rotated_from_id == key.id and new.scopes == "inference"
        with pytest.raises(Conflict, match="rotating"):
            await keys.rotate(CONSOLE, key.id, grace=timedelta(0))
        first = (await keys.revoke(CONSOLE, new.id)).revoked_at
        clock[0] = NOW + timedelta(minutes=5)
        assert (await keys.revoke(CONSOLE, new.id)).revoked_at == first
        with pytest.raises(Conflict, match="revoked"):
            await keys.rotate(CONSOLE, new.id, grace=timedelta(0))


async def test_the_bootstrap_key_is_adopted_once_and_stays_revoked(database: Database) -> None:
    bootstrap = generate_key("live").secret
    async with database.session() as session:
        adopted = await service(session).adopt_admin_key(bootstrap)
        assert adopted is not None and adopted.scopes == "admin"
        assert adopted.key_hash == hash_key(bootstrap, SECRET)
        await service(session).revoke(CONSOLE, adopted.id)
    async with database.session() as session:
        again = await service(session).adopt_admin_key(bootstrap)
        assert again is not None and again.id == adopted.id and again.revoked_at is not None
        count = len((await session.scalars(select(ApiKey))).all())
    assert count == 1
