"""Routes: `/admin/keys` (admin keys manage every key) and `/account/keys` (a tenant's own)."""

from __future__ import annotations

from datetime import timedelta

from litestar import Controller, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody

from hydrant.platform.auth.dependencies import (
    provide_admin_principal,
    require_admin,
    require_inference,
)
from hydrant.platform.auth.principal import Principal
from hydrant.platform.keys.deps import provide_key_service
from hydrant.platform.keys.schemas import (
    CreatedKey,
    KeyCreate,
    KeyList,
    KeyRotate,
    KeyUpdate,
    KeyView,
    RotatedKey,
)
from hydrant.platform.keys.service import KeyService


class KeyAdminController(Controller):
    path = "/admin/keys"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "keys": Provide(provide_key_service),
    }

    @post("/")
    async def create_key(
        self,
        data: JSONBody[KeyCreate],
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
    ) -> CreatedKey:
        key, secret = await keys.create(
            principal,
            tenant_id=data.tenant_id,
            name=data.name,
            expires_at=data.expires_at,
            project=data.project,
            budgets=data.budgets(),
        )
        return CreatedKey(key=KeyView.of(key, keys.now()), secret=secret)

    @get("/")
    async def list_keys(
        self,
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
        tenant_id: FromQuery[str | None] = None,
        admin: FromQuery[bool] = False,
        limit: FromQuery[int] = 50,
        after: FromQuery[str | None] = None,
    ) -> KeyList:
        rows, more = await keys.list(
            principal, tenant_id=tenant_id, admin_keys=admin, limit=limit, after=after
        )
        now = keys.now()
        return KeyList(data=[KeyView.of(k, now) for k in rows], has_more=more)

    @get("/{key_id:str}")
    async def get_key(
        self,
        key_id: FromPath[str],
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
    ) -> KeyView:
        return KeyView.of(await keys.get(principal, key_id), keys.now())

    @patch("/{key_id:str}")
    async def update_key(
        self,
        key_id: FromPath[str],
        data: JSONBody[KeyUpdate],
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
    ) -> KeyView:
        key = await keys.update_budgets(principal, key_id, data.budgets())
        return KeyView.of(key, keys.now())

    @post("/{key_id:str}/revoke", status_code=200)
    async def revoke_key(
        self,
        key_id: FromPath[str],
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
    ) -> KeyView:
        return KeyView.of(await keys.revoke(principal, key_id), keys.now())

    @post("/{key_id:str}/rotate", status_code=200)
    async def rotate_key(
        self,
        key_id: FromPath[str],
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
        data: JSONBody[KeyRotate | None] = None,
    ) -> RotatedKey:
        body = data or KeyRotate()
        new, secret, old = await keys.rotate(
            principal,
            key_id,
            grace=timedelta(seconds=body.grace_seconds),
            expires_at=body.expires_at,
        )
        now = keys.now()
        return RotatedKey(key=KeyView.of(new, now), secret=secret, previous=KeyView.of(old, now))


class AccountKeysController(Controller):
    """A tenant listing its own keys (never a secret); changes go through an admin."""

    path = "/account/keys"
    guards = [require_inference]
    # `principal` is the app-wide provider: the inference principal (see app.py).
    dependencies = {
        "keys": Provide(provide_key_service),
    }

    @get("/")
    async def list_own_keys(
        self,
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
        limit: FromQuery[int] = 50,
        after: FromQuery[str | None] = None,
    ) -> KeyList:
        rows, more = await keys.list(principal, limit=limit, after=after)
        now = keys.now()
        return KeyList(data=[KeyView.of(k, now) for k in rows], has_more=more)

    @get("/{key_id:str}")
    async def get_own_key(
        self,
        key_id: FromPath[str],
        principal: NamedDependency[Principal],
        keys: NamedDependency[KeyService],
    ) -> KeyView:
        return KeyView.of(await keys.get(principal, key_id), keys.now())
