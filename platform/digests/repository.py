"""Queries for digests: per-tenant settings, recipients, unsubscribes, send claims, key spend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import (
    ApiKey,
    DigestRecipient,
    DigestSend,
    DigestSettings,
    DigestUnsubscribe,
    LedgerEntry,
    Project,
    Tenant,
)
from hydrant.platform.reports.repository import exact_sum


async def settings_of(session: AsyncSession, tenant_id: str) -> DigestSettings | None:
    return await session.get(DigestSettings, tenant_id)


async def all_settings(session: AsyncSession) -> dict[str, DigestSettings]:
    rows = (await session.scalars(select(DigestSettings))).all()
    return {row.tenant_id: row for row in rows}


async def active_tenants(session: AsyncSession) -> Sequence[Tenant]:
    return (await session.scalars(select(Tenant).where(Tenant.status == "active"))).all()


async def all_tenants(session: AsyncSession) -> Sequence[Tenant]:
    return (await session.scalars(select(Tenant))).all()


_BUDGET_COLUMNS = ("tokens_per_day", "tokens_per_month", "spend_per_day", "spend_per_month")


async def budgeted_projects(session: AsyncSession) -> dict[str, list[Project]]:
    """Every tenant's projects that set a budget of their own, by tenant id, archived ones
    too (their keys keep working, so their budgets still apply). One query for all
    tenants: the alert check runs every few minutes over every tenant."""
    has_budget = or_(*(getattr(Project, c).is_not(None) for c in _BUDGET_COLUMNS))
    rows = await session.scalars(select(Project).where(has_budget).order_by(Project.id))
    found: dict[str, list[Project]] = {}
    for project in rows:
        found.setdefault(project.tenant_id, []).append(project)
    return found


async def budgeted_keys(session: AsyncSession) -> dict[str, list[ApiKey]]:
    """Every tenant's unrevoked keys that set a budget of their own, by tenant id."""
    has_budget = or_(*(getattr(ApiKey, c).is_not(None) for c in _BUDGET_COLUMNS))
    rows = await session.scalars(
        select(ApiKey)
        .where(ApiKey.tenant_id.is_not(None), ApiKey.revoked_at.is_(None), has_budget)
        .order_by(ApiKey.id)
    )
    found: dict[str, list[ApiKey]] = {}
    for key in rows:
        found.setdefault(key.tenant_id or "", []).append(key)
    return found


async def recipients_of(session: AsyncSession, tenant_id: str) -> list[str]:
    statement = (
        select(DigestRecipient.email)
        .where(DigestRecipient.tenant_id == tenant_id)
        .order_by(DigestRecipient.email)
    )
    return list((await session.scalars(statement)).all())


async def replace_recipients(session: AsyncSession, tenant_id: str, emails: Sequence[str]) -> None:
    await session.execute(delete(DigestRecipient).where(DigestRecipient.tenant_id == tenant_id))
    session.add_all(DigestRecipient(tenant_id=tenant_id, email=e) for e in emails)
    await session.flush()


async def unsubscribed(session: AsyncSession, scope: str) -> set[str]:
    statement = select(DigestUnsubscribe.email).where(DigestUnsubscribe.scope == scope)
    return set((await session.scalars(statement)).all())


async def add_unsubscribe(session: AsyncSession, scope: str, email: str) -> None:
    """Idempotent: a second click on the same link changes nothing."""
    existing = await session.scalar(
        select(DigestUnsubscribe.id).where(
            DigestUnsubscribe.scope == scope, DigestUnsubscribe.email == email
        )
    )
    if existing is None:
        try:
            async with session.begin_nested():
                session.add(DigestUnsubscribe(scope=scope, email=email))
        except IntegrityError:
            pass  # clicked twice at once: the other click recorded it


async def claim_send(session: AsyncSession, kind: str, subject_id: str, day: date) -> str | None:
    """Insert the send's claim; None when one exists (this digest was sent or is being sent).

    The unique constraint decides, so two workers (or beat firing twice) racing for
    the same digest cannot both win, on either database.
    """
    claim = DigestSend(kind=kind, subject_id=subject_id, day=day, status="sending")
    try:
        async with session.begin_nested():
            session.add(claim)
    except IntegrityError:
        return None
    return claim.id


async def finish_send(
    session: AsyncSession, claim_id: str, *, status: str, recipients: int, message_id: str | None
) -> None:
    await session.execute(
        update(DigestSend)
        .where(DigestSend.id == claim_id)
        .values(status=status, recipients=recipients, message_id=message_id, sent_at=utcnow())
    )


async def release_claim(session: AsyncSession, claim_id: str) -> None:
    """Give a claim back after a send that certainly failed, so a retry may send it."""
    await session.execute(delete(DigestSend).where(DigestSend.id == claim_id))


async def stuck_sends(session: AsyncSession, claimed_before: datetime) -> Sequence[DigestSend]:
    """Claims still `sending` that were taken before `claimed_before`, oldest first."""
    statement = (
        select(DigestSend)
        .where(DigestSend.status == "sending", DigestSend.claimed_at < claimed_before)
        .order_by(DigestSend.claimed_at, DigestSend.id)
    )
    return (await session.scalars(statement)).all()


async def get_send(session: AsyncSession, send_id: str) -> DigestSend | None:
    return await session.get(DigestSend, send_id)


async def release_stuck(session: AsyncSession, send_id: str) -> bool:
    """Delete the claim if it is still `sending`; False when it changed or went meanwhile."""
    result = await session.execute(
        delete(DigestSend).where(DigestSend.id == send_id, DigestSend.status == "sending")
    )
    return bool(getattr(result, "rowcount", 0))


async def sent_days(
    session: AsyncSession, kind: str, subject_ids: Sequence[str], days: Sequence[date]
) -> set[tuple[str, date]]:
    if not subject_ids or not days:
        return set()
    statement = select(DigestSend.subject_id, DigestSend.day).where(
        DigestSend.kind == kind,
        DigestSend.subject_id.in_(list(subject_ids)),
        DigestSend.day.in_(list(days)),
    )
    return {(row[0], row[1]) for row in (await session.execute(statement)).all()}


async def send_record(
    session: AsyncSession, kind: str, subject_id: str, day: date
) -> DigestSend | None:
    return await session.scalar(
        select(DigestSend).where(
            DigestSend.kind == kind, DigestSend.subject_id == subject_id, DigestSend.day == day
        )
    )


@dataclass(frozen=True)
class KeySpend:
    """What a digest may show of a key: its public prefix and name, never the secret."""

    key_id: str | None
    prefix: str
    name: str
    requests: int
    charged: Decimal


def _micros(value: Any, dialect: str) -> Decimal:
    # The same exact-sum convention as the reports repository (see its docstring).
    if dialect == "postgresql":
        return value if isinstance(value, Decimal) else Decimal(int(value))
    return Decimal(int(value)).scaleb(-STORAGE_PLACES)


async def top_keys(
    session: AsyncSession,
    principal: Principal,
    tenant_id: str,
    since: datetime,
    until: datetime,
    limit: int = 5,
) -> list[KeySpend]:
    """The tenant's keys by spend in `[since, until)`, summed exactly like the reports are."""
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    charged = exact_sum(dialect, LedgerEntry.charged, STORAGE_PLACES)
    statement = (
        select(
            LedgerEntry.api_key_id,
            func.coalesce(ApiKey.prefix, "(deleted key)"),
            func.coalesce(ApiKey.name, ""),
            func.count(),
            charged,
        )
        .outerjoin(ApiKey, ApiKey.id == LedgerEntry.api_key_id)
        .where(
            LedgerEntry.tenant_id == tenant_id,
            LedgerEntry.finished_at >= since,
            LedgerEntry.finished_at < until,
        )
        .group_by(LedgerEntry.api_key_id, ApiKey.prefix, ApiKey.name)
        .order_by(charged.desc(), LedgerEntry.api_key_id)
        .limit(limit)
    )
    statement = scope_to(statement, LedgerEntry, principal)
    rows = (await session.execute(statement)).all()
    return [
        KeySpend(
            key_id=r[0],
            prefix=str(r[1]),
            name=str(r[2]),
            requests=int(r[3]),
            charged=_micros(r[4], dialect),
        )
        for r in rows
    ]
