"""Invoices: a draft computed from the ledger on read, finalization that freezes it once.

What an invoice bills is decided by `invoice_items` (one row per ledger entry, its
primary key the request id): finalizing a tenant's month inserts, in ONE statement,
an item for every entry of the month not billed yet, and for every earlier entry not
billed yet (one that reached the ledger after its own month's invoice, or from before
the tenant's first invoice: adjustment lines), then sums exactly the entries it
inserted. So an entry is billed once, an entry landing while a month is finalized is
either on that invoice or on the next one (an adjustment line), never on none or both,
and a finalized invoice is never edited. A draft shows what finalizing its month now
would bill. Credits are applied to the
billed entries in the same transaction (`apply_entries`), so what the grants paid of
an invoice is on that invoice.

Numbers are gap-free per issuer and year: taken from a counter row updated in the
same transaction (its row lock orders concurrent finalizers; a rollback returns the
number). Concurrent finalizers of one tenant take its row lock (PostgreSQL) or the
write lock (SQLite), and the unique (tenant, period) makes a second one a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from sqlalchemy import ColumnElement, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.credits.repository import lock_tenant
from hydrant.platform.credits.service import apply_entries, pay_pending
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Invoice, InvoiceLine, InvoiceSend, LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.digests.service import zone_of
from hydrant.platform.errors import Conflict, NotFound
from hydrant.platform.invoices import repository as repo
from hydrant.platform.invoices.periods import MONTH, Month
from hydrant.platform.invoices.statement import InvoiceDoc, Line, totals
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit
from hydrant.platform.ledger.repository import PriceVersion
from hydrant.platform.tenants.repository import get_tenant
from hydrant.settings import Settings

log = logging.getLogger(__name__)

SEND_JOB = "hydrant.invoices.send"
DEFAULT_CURRENCY = "USD"


async def billed_lines(
    session: AsyncSession,
    tenant_id: str,
    zone: ZoneInfo,
    month: Month,
    selected: ColumnElement[bool],
) -> tuple[list[Line], str]:
    """The lines of `month` over the `selected` entries: the month's own (usage lines), then
    earlier ones (adjustments, by their own local month), and the prices' currency."""
    start, end = month.window(zone)
    usage = [
        g
        for _, g in await repo.usage_groups(
            session, tenant_id, repo.in_window(start, end), selected
        )
    ]
    before = LedgerEntry.finished_at < start
    first = await repo.earliest(session, tenant_id, before, selected)
    months: list[tuple[str, datetime]] = []
    if first is not None:
        earlier = Month.of(first, zone)
        while earlier < month:
            months.append((earlier.label, earlier.window(zone)[1]))
            earlier = earlier.next()
    late = (
        await repo.usage_groups(session, tenant_id, before, selected, months=months)
        if months
        else []
    )
    return await build_lines(session, usage, late)


async def build_lines(
    session: AsyncSession, usage: Sequence[repo.Group], late: Sequence[tuple[str, repo.Group]]
) -> tuple[list[Line], str]:
    """The lines (usage first, then adjustments by month) and the prices' currency."""
    adjusted = {(label, g.model_id, g.price_id, g.batch): g for label, g in late}
    names, prices = await repo.models_and_prices(session, [*usage, *adjusted.values()])
    currency = next(iter(p.currency for p in prices.values()), DEFAULT_CURRENCY)

    def line(kind: str, period: str, g: repo.Group) -> Line:
        price = prices.get(g.price_id) if g.price_id is not None else None
        rates = PriceVersion.of(price).price(batch=g.batch) if price is not None else None
        return Line(
            kind="usage" if kind == "usage" else "adjustment",
            usage_period=period,
            model=names.get(g.model_id, g.model_id),
            price_id=g.price_id,
            price_effective_from=price.effective_from if price is not None else None,
            batch=g.batch,
            requests=g.requests,
            input_tokens=g.input_tokens,
            cached_input_tokens=g.cached_input_tokens,
            output_tokens=g.output_tokens,
            input_per_mtok=rates.input_per_million if rates else None,
            cached_input_per_mtok=rates.cached_rate if rates else None,
            output_per_mtok=rates.output_per_million if rates else None,
            amount=g.charged,
            credits_applied=min(g.paid_by_credits, g.charged),
        )

    def order(item: Line) -> tuple[str, str, datetime | None, bool]:
        return (item.usage_period, item.model, item.price_effective_from, item.batch)

    lines = sorted((line("usage", "", g) for g in usage), key=order)
    lines += sorted((line("adjustment", k[0], g) for k, g in adjusted.items()), key=order)
    return lines, currency


async def draft_of(session: AsyncSession, tenant: Tenant, month: Month, issuer: str) -> InvoiceDoc:
    """The month's invoice as it stands now: what finalizing it now would bill (its entries
    not billed yet, and earlier ones not billed yet as adjustments)."""
    zone = zone_of(tenant.timezone)
    start, end = month.window(zone)
    lines, currency = await billed_lines(session, tenant.id, zone, month, repo.not_billed())
    label = f"{month.label}"
    return InvoiceDoc(
        id=label,
        status="draft",
        number=None,
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        period=label,
        period_start=start,
        period_end=end,
        timezone=zone.key,
        currency=currency,
        lines=tuple(lines),
        totals=totals(lines),
        issuer_name=issuer,
    )


def doc_of(
    invoice: Invoice, lines: Sequence[InvoiceLine], tenant: Tenant, issuer: str
) -> InvoiceDoc:
    """A finalized invoice read back from its frozen rows."""
    frozen = tuple(
        Line(
            kind="usage" if row.kind == "usage" else "adjustment",
            usage_period=row.usage_period,
            model=row.model,
            price_id=row.price_id,
            price_effective_from=row.price_effective_from,
            batch=row.batch,
            requests=row.requests,
            input_tokens=row.input_tokens,
            cached_input_tokens=row.cached_input_tokens,
            output_tokens=row.output_tokens,
            input_per_mtok=row.input_per_mtok,
            cached_input_per_mtok=row.cached_input_per_mtok,
            output_per_mtok=row.output_per_mtok,
            amount=row.amount,
            credits_applied=row.credits_applied,
        )
        for row in lines
    )
    return InvoiceDoc(
        id=invoice.id,
        status="finalized",
        number=invoice.number,
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        period=invoice.period,
        period_start=invoice.period_start,
        period_end=invoice.period_end,
        timezone=invoice.timezone,
        currency=invoice.currency,
        lines=frozen,
        totals=totals(frozen),
        issuer_name=issuer,
        finalized_at=invoice.finalized_at,
    )


@dataclass(frozen=True)
class Finalized:
    invoice_id: str | None  # None: nothing to bill (no invoice for an empty month)
    created: bool


async def _finalize_once(
    database: Database,
    settings: Settings,
    tenant_id: str,
    month: Month,
    now: datetime,
    enqueue: Enqueue | None,
) -> Finalized:
    async with database.session() as session:
        if not await lock_tenant(session, tenant_id):
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
        existing = await repo.invoice_for(session, tenant_id, month.label)
        if existing is not None:
            return Finalized(existing.id, created=False)
        tenant = await session.get(Tenant, tenant_id)
        assert tenant is not None
        zone = zone_of(tenant.timezone)
        start, end = month.window(zone)
        if now < end:
            raise Conflict(
                f"{month.label} is still open in {zone.key} until {end:%Y-%m-%d %H:%M} UTC",
                param="month",
            )
        condition = repo.billable(end)
        if not await repo.has_billable(session, tenant_id, condition):
            # Nothing left to bill: nothing was, or (SQLite, where no row lock ordered us)
            # a finalizer that raced this one billed it since the check above.
            made = await repo.invoice_for(session, tenant_id, month.label)
            return Finalized(made.id if made is not None else None, created=False)
        number = await repo.take_number(session, settings.invoice_issuer, now.year)
        invoice = Invoice(
            tenant_id=tenant_id,
            period=month.label,
            period_start=start,
            period_end=end,
            timezone=zone.key,
            currency=DEFAULT_CURRENCY,
            issuer=settings.invoice_issuer,
            number=f"{settings.invoice_issuer}-{now.year:04d}-{number:06d}",
            subtotal=Decimal(0),
            credits_applied=Decimal(0),
            amount_due=Decimal(0),
            finalized_at=now,
        )
        session.add(invoice)
        await session.flush()
        await repo.bill_entries(session, tenant_id, invoice.id, condition)
        await apply_entries(session, tenant_id, now)  # what the grants pay is on this invoice
        billed = repo.billed_by(invoice.id)
        lines, currency = await billed_lines(session, tenant_id, zone, month, billed)
        sums = totals(lines)
        invoice.currency = currency
        invoice.subtotal = sums.subtotal
        invoice.credits_applied = sums.credits_applied
        invoice.amount_due = sums.amount_due
        session.add_all(
            InvoiceLine(invoice_id=invoice.id, position=n, **_line_columns(line))
            for n, line in enumerate(lines, start=1)
        )
        send = InvoiceSend(tenant_id=tenant_id, invoice_id=invoice.id, claimed_at=now)
        session.add(send)
        await session.flush()
        if enqueue is not None:
            enqueue_after_commit(session, enqueue, SEND_JOB, send_id=send.id)
        log.info(
            "invoice finalized",
            extra={"tenant_id": tenant_id, "period": month.label, "number": invoice.number},
        )
        return Finalized(invoice.id, created=True)


def _line_columns(line: Line) -> dict[str, object]:
    return {
        "kind": line.kind,
        "usage_period": line.usage_period,
        "model": line.model,
        "price_id": line.price_id,
        "price_effective_from": line.price_effective_from,
        "batch": line.batch,
        "requests": line.requests,
        "input_tokens": line.input_tokens,
        "cached_input_tokens": line.cached_input_tokens,
        "output_tokens": line.output_tokens,
        "input_per_mtok": line.input_per_mtok,
        "cached_input_per_mtok": line.cached_input_per_mtok,
        "output_per_mtok": line.output_per_mtok,
        "amount": line.amount,
        "credits_applied": line.credits_applied,
    }


async def finalize_tenant(
    database: Database,
    settings: Settings,
    tenant_id: str,
    month: Month,
    *,
    now: datetime,
    enqueue: Enqueue | None = None,
) -> Finalized:
    """Finalize one tenant's month in a unit of work of its own; idempotent. A finalizer
    that raced another on SQLite (no row locks) fails on the unique keys at its first
    write and tries once more, then finds the other's invoice."""
    for attempt in (1, 2, 3):
        try:
            return await _finalize_once(database, settings, tenant_id, month, now, enqueue)
        except IntegrityError:
            if attempt == 3:
                raise
    raise AssertionError("unreachable")


@dataclass
class FinalizeReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    empty: int = 0
    still_open: int = 0
    failed: list[str] = field(default_factory=list)


async def finalize_month(
    database: Database,
    settings: Settings,
    month: Month | None,
    *,
    now: datetime,
    enqueue: Enqueue | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FinalizeReport:
    """Finalize `month` for every tenant whose month has closed in its own zone (None:
    each tenant's previous local month, what the periodic job does)."""
    async with database.session() as session:
        rows = (await session.execute(select(Tenant.id, Tenant.timezone))).all()
        targets = {
            tenant_id: month or Month.of(now, zone_of(timezone)).previous()
            for tenant_id, timezone in rows
        }
        # Invoices already made are skipped without taking the tenant's lock: the hourly
        # job passes over every tenant, and most of the time all of them are done.
        made = await session.execute(
            select(Invoice.tenant_id, Invoice.period, Invoice.id).where(
                Invoice.period.in_({m.label for m in targets.values()})
            )
        )
        done_already = {(t, p): i for t, p, i in made.all()}
    report = FinalizeReport()
    for done, (tenant_id, target) in enumerate(sorted(targets.items()), start=1):
        known = done_already.get((tenant_id, target.label))
        if known is not None:
            report.existing.append(known)
            if progress is not None:
                progress(done, len(targets))
            continue
        try:
            result = await finalize_tenant(
                database, settings, tenant_id, target, now=now, enqueue=enqueue
            )
        except Conflict:
            report.still_open += 1
            continue
        except Exception:  # one tenant's failure must not stop the others' invoices
            log.warning(
                "invoice finalization failed; the next run retries it",
                extra={"tenant_id": tenant_id, "period": target.label},
                exc_info=True,
            )
            report.failed.append(tenant_id)
            continue
        finally:
            if progress is not None:
                progress(done, len(targets))
        if result.invoice_id is None:
            report.empty += 1
        elif result.created:
            report.created.append(result.invoice_id)
        else:
            report.existing.append(result.invoice_id)
    return report


class InvoiceService:
    """The account and admin API's reads, on the request's unit of work."""

    def __init__(
        self,
        session: AsyncSession,
        database: Database,
        settings: Settings,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._session = session
        self._database = database  # paying pending credits is a unit of work of its own
        self._settings = settings
        self._clock = clock

    async def _tenant(self, principal: Principal, tenant_id: str) -> Tenant:
        tenant = await get_tenant(self._session, principal, tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
        return tenant

    async def _finalized(self, tenant: Tenant, invoice: Invoice) -> InvoiceDoc:
        lines = await repo.lines_of(self._session, invoice.id)
        return doc_of(invoice, lines, tenant, self._settings.invoice_issuer_name)

    async def _draft(self, tenant: Tenant, month: Month) -> InvoiceDoc:
        await pay_pending(self._database, tenant.id, self._clock())
        return await draft_of(self._session, tenant, month, self._settings.invoice_issuer_name)

    async def finalize(
        self, month: Month | None, progress: Callable[[int, int], None] | None = None
    ) -> FinalizeReport:
        """`finalize_month` now, for the admin API and the console (callers check that the
        principal is an admin). Each tenant is its own unit of work; the mails are
        claimed, and sent by the invoices job's next run."""
        return await finalize_month(
            self._database, self._settings, month, now=self._clock(), progress=progress
        )

    async def list(self, principal: Principal, tenant_id: str) -> list[InvoiceDoc]:
        """The open month's draft first, then the finalized invoices, newest first."""
        tenant = await self._tenant(principal, tenant_id)
        current = Month.of(self._clock(), zone_of(tenant.timezone))
        docs = [await self._draft(tenant, current)]
        for invoice in await repo.invoices_of(self._session, tenant.id):
            docs.append(await self._finalized(tenant, invoice))
        return docs

    async def get(self, principal: Principal, tenant_id: str, ref: str) -> InvoiceDoc:
        """An invoice by id, or a month (`2026-11`): its finalized invoice, else its draft.
        A month not begun yet, or another tenant's invoice, is not found."""
        tenant = await self._tenant(principal, tenant_id)
        if ref.startswith("inv_"):
            invoice = await self._session.get(Invoice, ref)
            if invoice is None or invoice.tenant_id != tenant.id:
                raise NotFound(f"no invoice {ref!r}", param="invoice_id")
            return await self._finalized(tenant, invoice)
        if MONTH.match(ref) is None:
            raise NotFound(f"no invoice {ref!r}", param="invoice_id")
        month = Month.parse(ref, param="invoice_id")
        invoice = await repo.invoice_for(self._session, tenant.id, month.label)
        if invoice is not None:
            return await self._finalized(tenant, invoice)
        if month > Month.of(self._clock(), zone_of(tenant.timezone)):
            raise NotFound(f"{month.label} has not begun", param="invoice_id")
        return await self._draft(tenant, month)
