"""Queries of the invoices domain: ledger entries not billed yet, entries a finalized invoice
billed, the number counter, and the stored invoices.

Every sum is over the ledger (DESIGN.md: the one source of truth); what a grant paid of an
entry is its `credit_applications` with a grant (the part no grant paid is due).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, and_, case, exists, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.models import (
    CreditApplication,
    Invoice,
    InvoiceCounter,
    InvoiceItem,
    InvoiceLine,
    LedgerEntry,
    ModelDeployment,
    Price,
)


@dataclass(frozen=True)
class Group:
    """Sums of ledger entries of one model, price version and price kind (batch or not)."""

    model_id: str
    price_id: str | None
    batch: bool
    requests: int = 0
    input_tokens: int = 0  # uncached
    cached_input_tokens: int = 0
    output_tokens: int = 0
    charged: Decimal = Decimal(0)
    paid_by_credits: Decimal = Decimal(0)


def _credit_paid() -> Any:
    return (
        select(
            CreditApplication.request_id.label("request_id"),
            func.sum(CreditApplication.amount).label("paid"),
        )
        .where(CreditApplication.grant_id.is_not(None))
        .group_by(CreditApplication.request_id)
        .subquery()
    )


def not_billed() -> ColumnElement[bool]:
    return ~exists().where(InvoiceItem.request_id == LedgerEntry.request_id)


def billed_by(invoice_id: str) -> ColumnElement[bool]:
    return exists().where(
        InvoiceItem.request_id == LedgerEntry.request_id, InvoiceItem.invoice_id == invoice_id
    )


def in_window(start: datetime, end: datetime) -> ColumnElement[bool]:
    return and_(LedgerEntry.finished_at >= start, LedgerEntry.finished_at < end)


def billable(end: datetime) -> ColumnElement[bool]:
    """What finalizing a month ending at `end` bills: every entry before `end` not billed
    yet, its own month's and any earlier one's (late, or from before invoicing began)."""
    return and_(LedgerEntry.finished_at < end, not_billed())


async def usage_groups(
    session: AsyncSession,
    tenant_id: str,
    *conditions: ColumnElement[bool],
    months: Sequence[tuple[str, datetime]] = (),
) -> list[tuple[str, Group]]:
    """The tenant's entries matching `conditions`, summed per month, model, price and kind.

    `months` is (label, end) in time order: an entry is in the first month it ends before
    (the tenant's local months, cut in Python, passed as UTC bounds), so even years of
    entries are summed by the database, never read one by one. No months: label ""."""
    paid = _credit_paid()
    period = (
        case(*((LedgerEntry.finished_at < end, label) for label, end in months), else_="")
        if months
        else literal("")
    )
    # In a subquery so the GROUP BY names its columns (PostgreSQL will not match a CASE
    # with bound parameters in the select list to the same CASE in the GROUP BY).
    rows = (
        select(
            period.label("period"),
            LedgerEntry.model_id,
            LedgerEntry.price_id,
            LedgerEntry.batch_id.is_not(None).label("batch"),
            (LedgerEntry.input_tokens - LedgerEntry.cached_tokens).label("uncached"),
            LedgerEntry.cached_tokens,
            LedgerEntry.output_tokens,
            LedgerEntry.charged,
            paid.c.paid,
        )
        .outerjoin(paid, paid.c.request_id == LedgerEntry.request_id)
        .where(LedgerEntry.tenant_id == tenant_id, *conditions)
        .subquery()
    )
    keys = (rows.c.period, rows.c.model_id, rows.c.price_id, rows.c.batch)
    statement = select(
        *keys,
        func.count(),
        func.coalesce(func.sum(rows.c.uncached), 0),
        func.coalesce(func.sum(rows.c.cached_tokens), 0),
        func.coalesce(func.sum(rows.c.output_tokens), 0),
        func.coalesce(func.sum(rows.c.charged), 0),
        func.coalesce(func.sum(rows.c.paid), 0),
    ).group_by(*keys)
    result = await session.execute(statement)
    return [
        (str(label), Group(m, p, bool(b), int(n), int(i), int(c), int(o), Decimal(ch), Decimal(pd)))
        for label, m, p, b, n, i, c, o, ch, pd in result.all()
    ]


async def earliest(
    session: AsyncSession, tenant_id: str, *conditions: ColumnElement[bool]
) -> datetime | None:
    """When the first of the tenant's entries matching `conditions` finished."""
    return await session.scalar(
        select(func.min(LedgerEntry.finished_at)).where(
            LedgerEntry.tenant_id == tenant_id, *conditions
        )
    )


async def models_and_prices(
    session: AsyncSession, groups: Sequence[Group]
) -> tuple[dict[str, str], dict[str, Price]]:
    model_ids = {g.model_id for g in groups}
    price_ids = {g.price_id for g in groups if g.price_id is not None}
    names: dict[str, str] = {}
    prices: dict[str, Price] = {}
    if model_ids:
        rows = await session.execute(
            select(ModelDeployment.id, ModelDeployment.name).where(
                ModelDeployment.id.in_(model_ids)
            )
        )
        names = {i: n for i, n in rows.all()}
    if price_ids:
        prices = {
            p.id: p for p in await session.scalars(select(Price).where(Price.id.in_(price_ids)))
        }
    return names, prices


async def bill_entries(
    session: AsyncSession, tenant_id: str, invoice_id: str, condition: ColumnElement[bool]
) -> int:
    """Mark the tenant's entries matching `condition` billed by `invoice_id`: one statement,
    so exactly the entries it inserts are the ones the invoice sums (read back by
    `billed_by`); how many."""
    chosen = select(LedgerEntry.request_id, literal(invoice_id)).where(
        LedgerEntry.tenant_id == tenant_id, condition
    )
    result = await session.execute(
        insert(InvoiceItem).from_select(["request_id", "invoice_id"], chosen)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def has_billable(
    session: AsyncSession, tenant_id: str, condition: ColumnElement[bool]
) -> bool:
    statement = select(exists().where(LedgerEntry.tenant_id == tenant_id, condition))
    return bool(await session.scalar(statement))


async def take_number(session: AsyncSession, issuer: str, year: int) -> int:
    """The issuer's next number in `year`, under the counter row's lock until commit."""
    present = await session.scalar(
        select(InvoiceCounter.year).where(
            InvoiceCounter.issuer == issuer, InvoiceCounter.year == year
        )
    )
    if present is None:
        try:
            async with session.begin_nested():
                session.add(InvoiceCounter(issuer=issuer, year=year, last_number=0))
        except IntegrityError:
            pass  # another finalizer made it first; its row lock orders us after it
    taken = await session.execute(
        update(InvoiceCounter)
        .where(InvoiceCounter.issuer == issuer, InvoiceCounter.year == year)
        .values(last_number=InvoiceCounter.last_number + 1)
        .returning(InvoiceCounter.last_number)
    )
    return int(taken.scalar_one())


async def invoice_for(session: AsyncSession, tenant_id: str, period: str) -> Invoice | None:
    return await session.scalar(
        select(Invoice).where(Invoice.tenant_id == tenant_id, Invoice.period == period)
    )


async def invoices_of(session: AsyncSession, tenant_id: str) -> list[Invoice]:
    statement = (
        select(Invoice).where(Invoice.tenant_id == tenant_id).order_by(Invoice.period.desc())
    )
    return list((await session.scalars(statement)).all())


async def lines_of(session: AsyncSession, invoice_id: str) -> list[InvoiceLine]:
    statement = (
        select(InvoiceLine)
        .where(InvoiceLine.invoice_id == invoice_id)
        .order_by(InvoiceLine.position)
    )
    return list((await session.scalars(statement)).all())
