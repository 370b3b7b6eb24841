"""Queries of the credits domain: grants, their applications, and ledger entries to apply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import exists, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.db.models import (
    CreditApplication,
    CreditGrant,
    CreditSettlement,
    LedgerEntry,
    Tenant,
)


@dataclass(frozen=True)
class GrantRow:
    """A grant and how much of it has been applied."""

    grant: CreditGrant
    used: Decimal


async def grants_with_use(session: AsyncSession, tenant_id: str) -> list[GrantRow]:
    used = (
        select(func.coalesce(func.sum(CreditApplication.amount), 0))
        .where(CreditApplication.grant_id == CreditGrant.id)
        .scalar_subquery()
    )
    # By tenant id, not principal: the callers have already resolved the tenant in scope.
    statement = (
        select(CreditGrant, used)
        .where(CreditGrant.tenant_id == tenant_id)
        .order_by(CreditGrant.created_at, CreditGrant.id)
    )
    rows = await session.execute(statement)
    return [GrantRow(grant, Decimal(value)) for grant, value in rows.all()]


async def unpaid_total(session: AsyncSession, tenant_id: str) -> Decimal:
    """What no grant could pay (applications without a grant)."""
    statement = select(func.coalesce(func.sum(CreditApplication.amount), 0)).where(
        CreditApplication.tenant_id == tenant_id, CreditApplication.grant_id.is_(None)
    )
    return Decimal(await session.scalar(statement) or 0)


async def get_grant(
    session: AsyncSession, principal: Principal, grant_id: str
) -> CreditGrant | None:
    statement = select(CreditGrant).where(CreditGrant.id == grant_id)
    statement = scope_to(statement, CreditGrant, principal)
    return await session.scalar(statement)


async def lock_tenant(session: AsyncSession, tenant_id: str) -> bool:
    """Take the tenant's row lock (PostgreSQL; SQLite serializes writers anyway) so that
    two processes applying the same tenant's entries take turns; False if no such tenant."""
    statement = select(Tenant.id).where(Tenant.id == tenant_id).with_for_update()
    return await session.scalar(statement) is not None


@dataclass(frozen=True)
class PendingEntry:
    request_id: str
    charged: Decimal
    finished_at: datetime


async def pending_entries(
    session: AsyncSession,
    tenant_id: str,
    since: datetime,
    request_ids: Sequence[str] | None = None,
) -> list[PendingEntry]:
    """The tenant's charged ledger entries since its first grant not settled yet, oldest
    first (`request_ids`: only these)."""
    applied = exists().where(CreditSettlement.request_id == LedgerEntry.request_id)
    statement = (
        select(LedgerEntry.request_id, LedgerEntry.charged, LedgerEntry.finished_at)
        .where(
            LedgerEntry.tenant_id == tenant_id,
            LedgerEntry.charged > 0,
            LedgerEntry.started_at >= since,
            ~applied,
        )
        .order_by(LedgerEntry.finished_at, LedgerEntry.request_id)
    )
    if request_ids is not None:
        statement = statement.where(LedgerEntry.request_id.in_(list(request_ids)))
    rows = await session.execute(statement)
    return [PendingEntry(r, Decimal(c), f) for r, c, f in rows.all()]


async def tenants_with_pending(session: AsyncSession) -> list[str]:
    """The tenants that have a grant and a charged ledger entry not settled yet (since their
    first grant, as `pending_entries` reads them): the ones a payer has work for. One
    query for all tenants, so a periodic payer costs one read when nothing is pending."""
    first_grant = (
        select(CreditGrant.tenant_id, func.min(CreditGrant.created_at).label("since"))
        .group_by(CreditGrant.tenant_id)
        .subquery()
    )
    applied = exists().where(CreditSettlement.request_id == LedgerEntry.request_id)
    statement = (
        select(LedgerEntry.tenant_id)
        .join(first_grant, first_grant.c.tenant_id == LedgerEntry.tenant_id)
        .where(LedgerEntry.charged > 0, LedgerEntry.started_at >= first_grant.c.since, ~applied)
        .distinct()
        .order_by(LedgerEntry.tenant_id)
    )
    return list((await session.scalars(statement)).all())


async def applied_total(session: AsyncSession, tenant_id: str) -> Decimal:
    statement = select(func.coalesce(func.sum(CreditApplication.amount), 0)).where(
        CreditApplication.tenant_id == tenant_id
    )
    return Decimal(await session.scalar(statement) or 0)
