"""Queries on tenants and plans. Tenant queries always take the caller's principal."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.db.models import DEFAULT_PLAN_ID, Plan, Tenant
from hydrant.platform.db.pagination import page_after


async def get_tenant(session: AsyncSession, principal: Principal, tenant_id: str) -> Tenant | None:
    statement = scope_to(select(Tenant).where(Tenant.id == tenant_id), Tenant, principal)
    return await session.scalar(statement)


async def find_tenant(session: AsyncSession, principal: Principal, ref: str) -> Tenant | None:
    """A tenant by id, or else by its (unique) name: what the console accepts."""
    tenant = await get_tenant(session, principal, ref)
    if tenant is not None:
        return tenant
    statement = scope_to(select(Tenant).where(Tenant.name == ref), Tenant, principal)
    return await session.scalar(statement)


async def tenant_name_taken(session: AsyncSession, name: str, *, other_than: str | None) -> bool:
    """Unscoped on purpose: names are unique across tenants (only admins create or rename)."""
    statement = select(Tenant.id).where(Tenant.name == name)
    if other_than is not None:
        statement = statement.where(Tenant.id != other_than)
    return await session.scalar(statement) is not None


async def list_tenants(
    session: AsyncSession,
    principal: Principal,
    *,
    limit: int,
    after: str | None,
    status: str | None = None,
) -> tuple[Sequence[Tenant], bool]:
    statement = scope_to(select(Tenant), Tenant, principal)
    if status is not None:
        statement = statement.where(Tenant.status == status)
    cursor = scope_to(select(Tenant.created_at), Tenant, principal)
    return await page_after(
        session, statement, Tenant, limit=limit, after=after, cursor_scope=cursor
    )


async def get_plan(session: AsyncSession, plan_id: str) -> Plan | None:
    return await session.get(Plan, plan_id)


async def find_plan(session: AsyncSession, ref: str) -> Plan | None:
    """A plan by id, or else by its (unique) name."""
    plan = await session.get(Plan, ref)
    if plan is not None:
        return plan
    return await session.scalar(select(Plan).where(Plan.name == ref))


async def plan_name_taken(session: AsyncSession, name: str, *, other_than: str | None) -> bool:
    statement = select(Plan.id).where(Plan.name == name)
    if other_than is not None:
        statement = statement.where(Plan.id != other_than)
    return await session.scalar(statement) is not None


async def plan_of(session: AsyncSession, tenant: Tenant) -> Plan | None:
    return await session.get(Plan, tenant.plan_id or DEFAULT_PLAN_ID)


async def list_plans(
    session: AsyncSession, *, limit: int, after: str | None
) -> tuple[Sequence[Plan], bool]:
    return await page_after(session, select(Plan), Plan, limit=limit, after=after)
