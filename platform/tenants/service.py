"""Tenants: the rules for creating, changing, suspending and resuming them.

Every read goes through the caller's principal (`scope_to`), so the same
service answers the admin API, the console and a tenant asking about itself.
Suspension is a status, not a deletion: keys, ledger and history stay, and
resuming restores service at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.invalidation import CacheInvalidator, no_cache
from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.models import Plan, Tenant
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from hydrant.platform.tenants import repository
from hydrant.platform.tenants.plan_service import PlanService
from hydrant.platform.tenants.schemas import TenantCreate, TenantUpdate, changes

# Deliberately loose: one @, no spaces, a dot in the domain. Mail delivery is the real test.
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
STATUSES = ("active", "suspended")


def check_timezone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(
            f"unknown time zone {name!r}; use an IANA name such as Europe/Paris", param="timezone"
        ) from None
    return name


def check_email(address: str | None) -> str | None:
    if address is None:
        return None
    address = address.strip()
    if not _EMAIL.fullmatch(address):
        raise InvalidRequest("contact_email is not an email address", param="contact_email")
    return address


def check_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise InvalidRequest("name must not be blank", param="name")
    return name


class TenantService:
    def __init__(self, session: AsyncSession, *, cache: CacheInvalidator = no_cache) -> None:
        self._session = session
        self._cache = cache
        self._plans = PlanService(session, cache=cache)

    async def create(self, principal: Principal, body: TenantCreate) -> Tenant:
        self._require_admin(principal)
        name = check_name(body.name)
        await self._unique_name(name, other_than=None)
        plan = await self._plans.resolve(body.plan)
        tenant = Tenant(
            name=name,
            contact_email=check_email(body.contact_email),
            timezone=check_timezone(body.timezone),
            plan_id=plan.id,
            status="active",
        )
        self._session.add(tenant)
        await self._flush()
        return tenant

    async def get(self, principal: Principal, tenant_id: str) -> Tenant:
        tenant = await repository.get_tenant(self._session, principal, tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
        return tenant

    async def find(self, principal: Principal, ref: str) -> Tenant:
        """By id or name (the console's way of naming tenants)."""
        tenant = await repository.find_tenant(self._session, principal, ref)
        if tenant is None:
            raise NotFound(f"no tenant {ref!r}", param="tenant")
        return tenant

    async def list(
        self,
        principal: Principal,
        *,
        limit: int = 50,
        after: str | None = None,
        status: str | None = None,
    ) -> tuple[Sequence[Tenant], bool]:
        if status is not None and status not in STATUSES:
            raise InvalidRequest(f"status must be one of {', '.join(STATUSES)}", param="status")
        return await repository.list_tenants(
            self._session, principal, limit=limit, after=after, status=status
        )

    async def update(self, principal: Principal, tenant_id: str, body: TenantUpdate) -> Tenant:
        self._require_admin(principal)
        tenant = await self.get(principal, tenant_id)
        fields = changes(body)
        if "name" in fields:
            name = check_name(str(fields["name"]))
            await self._unique_name(name, other_than=tenant.id)
            tenant.name = name
        if "contact_email" in fields:
            email = fields["contact_email"]
            tenant.contact_email = check_email(None if email is None else str(email))
        if "timezone" in fields:
            tenant.timezone = check_timezone(str(fields["timezone"]))
        if "plan" in fields:
            tenant.plan_id = (await self._plans.resolve(str(fields["plan"]))).id
        await self._flush()
        self._cache.clear()  # cached principals carry the tenant's plan and time zone
        return tenant

    async def suspend(self, principal: Principal, tenant_id: str) -> Tenant:
        return await self._set_status(principal, tenant_id, "suspended")

    async def resume(self, principal: Principal, tenant_id: str) -> Tenant:
        return await self._set_status(principal, tenant_id, "active")

    async def plan_of(self, tenant: Tenant) -> Plan:
        plan = await repository.plan_of(self._session, tenant)
        return plan if plan is not None else await self._plans.default()

    async def _set_status(self, principal: Principal, tenant_id: str, status: str) -> Tenant:
        self._require_admin(principal)
        tenant = await self.get(principal, tenant_id)
        if tenant.status != status:
            tenant.status = status
            await self._flush()
        self._cache.clear()
        return tenant

    @staticmethod
    def _require_admin(principal: Principal) -> None:
        if not principal.is_admin:
            raise PermissionDenied("only an admin key can change tenants")

    async def _unique_name(self, name: str, *, other_than: str | None) -> None:
        if await repository.tenant_name_taken(self._session, name, other_than=other_than):
            raise Conflict(f"a tenant named {name!r} exists", param="name")

    async def _flush(self) -> None:
        try:
            await self._session.flush()
        except IntegrityError:
            raise Conflict("the tenant conflicts with another one (same name?)") from None
