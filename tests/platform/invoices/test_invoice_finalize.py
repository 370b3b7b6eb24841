"""Invoices against the real ledger, on SQLite and PostgreSQL: a draft sums the tenant's
local month (entries at the month's edges in UTC and in local time), finalization is
once, numbered without gaps under concurrency, frozen, and a late entry lands on the
next invoice as an adjustment; credits applied never exceed what is billed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from digest_factories import make_ledger, make_world, record
from invoice_factories import (
    DECEMBER,
    NOVEMBER,
    PRICE_CHANGE,
    TZ,
    add_grant,
    add_price_change,
    ledger_sum,
    local,
    settings_for,
)
from sqlalchemy import func, select

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.models import Invoice, InvoiceItem, InvoiceLine, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.invoices.service import (
    InvoiceService,
    finalize_month,
    finalize_tenant,
)

AFTER_NOVEMBER = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)  # 01:00 on Dec 1 in New York


async def draft(db: Database, data_dir: Path, tenant_id: str, ref: str, now: datetime):  # type: ignore[no-untyped-def]
    async with db.session() as session:
        service = InvoiceService(session, db, settings_for(data_dir), clock=lambda: now)
        return await service.get(CONSOLE, tenant_id, ref)


async def test_a_draft_sums_the_tenants_local_month_per_model_and_price(
    db: Database, data_dir: Path
) -> None:
    world = await make_world(db, timezone=TZ)
    await add_price_change(db)
    ledger = make_ledger(db, data_dir)
    edges = [
        (local(2026, 10, 31, 23, 59), 1000),  # 03:59 UTC Nov 1 (EDT): October
        (local(2026, 11, 1, 0, 0), 2000),  # the local month's first minute (04:00 UTC)
        (datetime(2026, 11, 1, 0, 30, tzinfo=UTC), 4000),  # November in UTC, October local
        (local(2026, 11, 30, 23, 59), 8000),  # Dec 1 04:59 UTC: still November local
        (local(2026, 12, 1, 0, 0), 16000),  # December local
        (PRICE_CHANGE + timedelta(hours=1), 32000),  # November, the second price version
    ]
    for moment, out in edges:
        await record(
            ledger, world, key="backend", model="llama-small", finished_at=moment,
            tokens=(100, 40, out),
        )  # fmt: skip
    await record(
        ledger, world, key="batch", model="qwen-tiny", finished_at=local(2026, 11, 20, 12),
        tokens=(5000, 0, 300),
    )  # fmt: skip

    doc = await draft(db, data_dir, world.tenant_id, "2026-11", AFTER_NOVEMBER)
    start, end = local(2026, 11, 1, 0), local(2026, 12, 1, 0)
    assert (doc.period_start, doc.period_end, doc.status) == (start, end, "draft")
    usage = sum((line.amount for line in doc.usage_lines), Decimal(0))
    assert usage == await ledger_sum(db, world.tenant_id, start, end)
    assert sum(line.requests for line in doc.usage_lines) == 4  # 2000, 8000, 32000 and qwen
    by_model = {(line.model, line.price_effective_from): line for line in doc.usage_lines}
    first = by_model[("llama-small", datetime(2026, 1, 1, tzinfo=UTC))]
    second = by_model[("llama-small", PRICE_CHANGE)]
    assert (first.requests, first.output_tokens, first.input_tokens, first.cached_input_tokens) == (
        1,
        2000,
        60,
        40,
    )  # fmt: skip  (the Nov 30 entry is after the price change: at the second version)
    assert (second.requests, second.output_tokens, second.output_per_mtok) == (2, 40000, 120)
    # October's two entries (local time) were never invoiced: the first invoice takes them
    [october] = doc.adjustments
    assert (october.usage_period, october.requests, october.output_tokens) == ("2026-10", 2, 5000)
    before = await ledger_sum(db, world.tenant_id, start - timedelta(days=90), start)
    assert october.amount == before
    assert doc.totals.subtotal == usage + before
    assert doc.totals.amount_due == round(doc.totals.subtotal, 2)


async def test_finalize_twice_is_one_invoice_frozen_and_a_late_entry_is_adjusted_next_month(
    db: Database, data_dir: Path
) -> None:
    world = await make_world(db, timezone=TZ)
    ledger = make_ledger(db, data_dir)
    settings = settings_for(data_dir)
    for day in (3, 17, 30):
        await record(
            ledger, world, key="backend", model="llama-small",
            finished_at=local(2026, 11, day, 22), tokens=(1000, 0, 500),
        )  # fmt: skip
    still_open = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)  # Nov 30 23:00 in New York
    try:
        await finalize_tenant(db, settings, world.tenant_id, NOVEMBER, now=still_open)
        raise AssertionError("a month still open in the tenant's zone was finalized")
    except Exception as exc:
        assert "still open" in str(exc)

    first = await finalize_tenant(db, settings, world.tenant_id, NOVEMBER, now=AFTER_NOVEMBER)
    again = await finalize_tenant(db, settings, world.tenant_id, NOVEMBER, now=AFTER_NOVEMBER)
    assert first.created and not again.created and first.invoice_id == again.invoice_id
    frozen = await draft(db, data_dir, world.tenant_id, "2026-11", AFTER_NOVEMBER)
    assert frozen.status == "finalized" and frozen.number == "HYD-2026-000001"
    november = await ledger_sum(db, world.tenant_id, local(2026, 11, 1, 0), local(2026, 12, 1, 0))
    assert frozen.totals.subtotal == november

    # A November entry reaches the ledger after the invoice (from a spool, say)
    late_at = local(2026, 11, 29, 12)
    await record(
        ledger, world, key="backend", model="llama-small", finished_at=late_at,
        tokens=(0, 0, 2000),
    )  # fmt: skip
    await record(
        ledger, world, key="backend", model="qwen-tiny",
        finished_at=local(2026, 12, 5, 12), tokens=(100, 0, 100),
    )  # fmt: skip
    assert (
        await finalize_tenant(
            db, settings, world.tenant_id, NOVEMBER, now=AFTER_NOVEMBER + timedelta(days=1)
        )
        == again
    )
    unchanged = await draft(db, data_dir, world.tenant_id, first.invoice_id or "", AFTER_NOVEMBER)
    assert unchanged == frozen  # the stored invoice never moves

    december_draft = await draft(db, data_dir, world.tenant_id, "2026-12", local(2026, 12, 20, 0))
    [adjustment] = december_draft.adjustments
    assert (adjustment.usage_period, adjustment.requests, adjustment.output_tokens) == (
        "2026-11",
        1,
        2000,
    )
    assert adjustment.amount == Decimal("0.12")  # 2000 output tokens at 60 per million
    after_december = datetime(2027, 1, 1, 6, 0, tzinfo=UTC)
    december = await finalize_tenant(db, settings, world.tenant_id, DECEMBER, now=after_december)
    doc = await draft(db, data_dir, world.tenant_id, december.invoice_id or "", after_december)
    assert doc.number == "HYD-2027-000001"  # numbered in the year it is issued
    assert doc.adjustments == december_draft.adjustments
    december_usage = await ledger_sum(
        db, world.tenant_id, local(2026, 12, 1, 0), local(2027, 1, 1, 0)
    )
    assert doc.totals.subtotal == december_usage + adjustment.amount
    async with db.session() as session:  # every entry billed exactly once
        items = await session.scalar(select(func.count()).select_from(InvoiceItem))
    assert items == 5


async def test_numbers_are_gap_free_under_concurrent_finalization(
    db: Database, data_dir: Path
) -> None:
    settings = settings_for(data_dir)
    ledger = make_ledger(db, data_dir)
    tenants = []
    for n in range(6):
        world = await make_world(db, name=f"tenant-{n}", timezone="UTC" if n % 2 else TZ)
        tenants.append(world.tenant_id)
        await record(
            ledger, world, key="backend", model="qwen-tiny",
            finished_at=local(2026, 11, 10 + n, 12), tokens=(100, 0, 10),
        )  # fmt: skip
    await make_world(db, name="idle", timezone=TZ)  # no usage: no invoice
    reports = await asyncio.gather(
        *(finalize_month(db, settings, NOVEMBER, now=AFTER_NOVEMBER) for _ in range(4)),
        *(finalize_tenant(db, settings, t, NOVEMBER, now=AFTER_NOVEMBER) for t in tenants[:3]),
    )
    async with db.session() as session:
        invoices = list(await session.scalars(select(Invoice)))
    assert sorted(i.tenant_id for i in invoices) == sorted(tenants)
    assert sorted(i.number for i in invoices) == [f"HYD-2026-{n:06d}" for n in range(1, 7)]
    created = [i for r in reports[:4] for i in r.created]  # type: ignore[union-attr]
    created += [r.invoice_id for r in reports[4:] if r.created]  # type: ignore[union-attr]
    assert sorted(created) == sorted(i.id for i in invoices)  # each made by exactly one caller
    assert all(r.empty == 1 for r in reports[:4]), reports  # type: ignore[union-attr]


async def test_credits_applied_never_exceed_the_amount(db: Database, data_dir: Path) -> None:
    settings = settings_for(data_dir)
    ledger = make_ledger(db, data_dir)
    small = await make_world(db, name="small-credit", timezone=TZ)
    large = await make_world(db, name="large-credit", timezone=TZ)
    await add_grant(db, small.tenant_id, "0.05", local(2026, 10, 1, 0))
    await add_grant(db, large.tenant_id, "100", local(2026, 10, 1, 0))
    for world in (small, large):
        for day in (2, 9):  # 0.06 each: 1000 output tokens at 60 per million
            await record(
                ledger, world, key="backend", model="llama-small",
                finished_at=local(2026, 11, day, 9), tokens=(0, 0, 1000),
            )  # fmt: skip
    open_draft = await draft(db, data_dir, small.tenant_id, "2026-11", local(2026, 11, 20, 0))
    assert open_draft.totals.credits_applied == Decimal("0.05")
    for world, paid, due in ((small, "0.05", "0.07"), (large, "0.12", "0.00")):
        result = await finalize_tenant(db, settings, world.tenant_id, NOVEMBER, now=AFTER_NOVEMBER)
        doc = await draft(db, data_dir, world.tenant_id, result.invoice_id or "", AFTER_NOVEMBER)
        assert doc.totals.subtotal == Decimal("0.12")
        assert doc.totals.credits_applied == Decimal(paid)
        assert doc.totals.amount_due == Decimal(due)
        assert doc.totals.credits_applied <= doc.totals.subtotal
        async with db.session() as session:
            stored = await session.get(Invoice, result.invoice_id)
            lines = list(
                await session.scalars(
                    select(InvoiceLine).where(InvoiceLine.invoice_id == result.invoice_id)
                )
            )
            tenant = await session.get(Tenant, world.tenant_id)
        assert stored is not None and tenant is not None
        assert (stored.subtotal, stored.credits_applied, stored.amount_due) == (
            doc.totals.subtotal, doc.totals.credits_applied, doc.totals.amount_due
        )  # fmt: skip
        assert sum((line.amount for line in lines), Decimal(0)) == stored.subtotal
