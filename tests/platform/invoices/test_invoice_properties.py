"""Property: for random time zones, entries, price changes, credits and late entries, every
invoice's total is exactly its ledger entries (its month's, and the late ones of months
already invoiced, as adjustments), every entry of the invoiced months is billed exactly
once, and a finalized invoice never changes. On SQLite and PostgreSQL.

Each example is one tenant (fresh models and prices of its own) through three months:
entries arrive in three waves; after each wave the next month is finalized, so an entry
of an earlier month in a later wave is late. The expected sums are computed here from
the scenario with `zoneinfo` directly, not with the code under test.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from invoice_factories import settings_for
from sqlalchemy import select

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.billing.money import REPORT_PLACES, round_money
from hydrant.platform.billing.pricing import Price as PriceValue
from hydrant.platform.billing.pricing import TokenUsage, charge_for
from hydrant.platform.db.models import (
    CreditGrant,
    InvoiceItem,
    LedgerEntry,
    ModelDeployment,
    Price,
    Tenant,
)
from hydrant.platform.db.session import Database
from hydrant.platform.invoices.periods import Month
from hydrant.platform.invoices.service import InvoiceService, finalize_tenant

ZONES = ("UTC", "America/New_York", "Asia/Kolkata", "Pacific/Kiritimati", "Pacific/Pago_Pago")
MONTHS = (Month(2026, 10), Month(2026, 11), Month(2026, 12))
ORIGIN = datetime(2026, 9, 30, 0, 0, tzinfo=UTC)  # entries from here, for ~95 days
SPAN_MINUTES = 95 * 24 * 60
NOW = datetime(2027, 1, 3, tzinfo=UTC)  # every month is closed in every zone
RATES = (
    (Decimal("3.333333"), Decimal("1"), Decimal("12.5")),
    (Decimal("15"), Decimal("5"), Decimal("60")),
)


@dataclass(frozen=True)
class Entry:
    minute: int
    model: int
    tokens: tuple[int, int, int]
    wave: int

    @property
    def finished_at(self) -> datetime:
        return ORIGIN + timedelta(minutes=self.minute)


entries = st.builds(
    Entry,
    minute=st.integers(0, SPAN_MINUTES),
    model=st.integers(0, 1),
    tokens=st.tuples(st.integers(0, 9000), st.integers(0, 100), st.integers(0, 4000)).map(
        lambda t: (t[0], t[0] * t[1] // 100, t[2])  # cached: a share of the input
    ),
    wave=st.integers(0, 2),
)
scenarios = st.fixed_dictionaries(
    {
        "zone": st.sampled_from(ZONES),
        "entries": st.lists(entries, min_size=1, max_size=20),
        "price_change": st.integers(0, SPAN_MINUTES),
        "grant": st.sampled_from(["0", "0.000001", "0.05", "1000"]),
    }
)


def window(month: Month, zone: ZoneInfo) -> tuple[datetime, datetime]:
    following = month.next()
    return (
        datetime(month.year, month.month, 1, tzinfo=zone).astimezone(UTC),
        datetime(following.year, following.month, 1, tzinfo=zone).astimezone(UTC),
    )


async def _run(url: str, data_dir: Path, scenario: dict[str, object]) -> None:
    db = Database(url)
    try:
        await _check(db, data_dir, scenario)
    finally:
        await db.dispose()


async def _check(db: Database, data_dir: Path, scenario: dict[str, object]) -> None:
    zone = ZoneInfo(str(scenario["zone"]))
    generated: list[Entry] = list(scenario["entries"])  # type: ignore[call-overload]
    change_at = ORIGIN + timedelta(minutes=int(scenario["price_change"]))  # type: ignore[call-overload]
    tag = secrets.token_hex(4)
    charged: dict[str, tuple[Entry, Decimal]] = {}
    async with db.session() as session:
        tenant = Tenant(name=f"prop-{tag}", timezone=zone.key)
        session.add(tenant)
        await session.flush()
        models, versions = [], []
        for n, (inp, cached, out) in enumerate(RATES):
            model = ModelDeployment(name=f"prop-{tag}-{n}", path="/models/x")
            session.add(model)
            await session.flush()
            models.append(model.id)
            first = Price(
                model_id=model.id,
                effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                input_per_mtok=inp,
                cached_input_per_mtok=cached,
                output_per_mtok=out,
            )
            second = Price(
                model_id=model.id,
                effective_from=change_at,
                input_per_mtok=inp * 3,
                cached_input_per_mtok=cached,
                output_per_mtok=out / 2,
            )
            session.add_all([first, second])
            await session.flush()
            versions.append((first, second))
        if Decimal(str(scenario["grant"])) > 0:
            session.add(
                CreditGrant(
                    tenant_id=tenant.id,
                    kind="paid",
                    created_at=ORIGIN - timedelta(days=1),
                    amount=Decimal(str(scenario["grant"])),
                )
            )
    settings = settings_for(data_dir)
    frozen = {}
    for wave, month in enumerate(MONTHS):
        async with db.session() as session:
            for n, entry in enumerate(generated):
                if entry.wave != wave:
                    continue
                first, second = versions[entry.model]
                price = second if entry.finished_at - timedelta(seconds=1) >= change_at else first
                rate = PriceValue(
                    price.input_per_mtok, price.output_per_mtok, price.cached_input_per_mtok
                )
                amount = charge_for(
                    TokenUsage(entry.tokens[0], entry.tokens[2], entry.tokens[1]), rate
                )
                request_id = f"prop-{tag}-{n}"
                charged[request_id] = (entry, amount)
                session.add(
                    LedgerEntry(
                        request_id=request_id, tenant_id=tenant.id, model_id=models[entry.model],
                        price_id=price.id, status="finished", input_tokens=entry.tokens[0],
                        cached_tokens=entry.tokens[1], output_tokens=entry.tokens[2],
                        charged=amount, started_at=entry.finished_at - timedelta(seconds=1),
                        finished_at=entry.finished_at,
                    )
                )  # fmt: skip
        result = await finalize_tenant(db, settings, tenant.id, month, now=NOW)
        if result.invoice_id is not None:
            async with db.session() as session:
                service = InvoiceService(session, db, settings, clock=lambda: NOW)
                frozen[month] = await service.get(CONSOLE, tenant.id, result.invoice_id)

    async with db.session() as session:
        items = {
            r: i
            for r, i in (
                await session.execute(
                    select(InvoiceItem.request_id, InvoiceItem.invoice_id).where(
                        InvoiceItem.request_id.in_(list(charged))
                    )
                )
            ).all()
        }
        service = InvoiceService(session, db, settings, clock=lambda: NOW)
        final = {m: await service.get(CONSOLE, tenant.id, doc.id) for m, doc in frozen.items()}
    assert final == frozen  # nothing that came later changed a finalized invoice

    # The model: an entry is billed by the first month finalized after it arrived whose
    # end is after it: a usage line of that month, or an adjustment of an earlier one.
    bounds = [window(month, zone) for month in MONTHS]
    expected: dict[str, int] = {}
    for request_id, (entry, _) in charged.items():
        for index, (_, end) in enumerate(bounds):
            if entry.wave <= index and entry.finished_at < end:
                expected[request_id] = index
                break
    for index, month in enumerate(MONTHS):
        start, end = bounds[index]
        mine = [(e, a) for r, (e, a) in charged.items() if expected.get(r) == index]
        doc = frozen.get(month)
        if doc is None:
            assert mine == []
            continue
        assert (doc.period_start, doc.period_end) == (start, end)
        usage = sum((line.amount for line in doc.usage_lines), Decimal(0))
        adjusted = sum((line.amount for line in doc.adjustments), Decimal(0))
        assert usage == sum((a for e, a in mine if e.finished_at >= start), Decimal(0))
        assert adjusted == sum((a for e, a in mine if e.finished_at < start), Decimal(0))
        assert sum(line.requests for line in doc.lines) == len(mine)
        billed = [a for r, (_, a) in charged.items() if items.get(r) == doc.id]
        assert doc.totals.subtotal == sum(billed, Decimal(0)) == usage + adjusted
        assert 0 <= doc.totals.credits_applied <= doc.totals.subtotal
        expected_due = round_money(doc.totals.subtotal - doc.totals.credits_applied, REPORT_PLACES)
        assert doc.totals.amount_due == expected_due >= 0
    assert sorted(items) == sorted(expected)  # each billed once, by the invoice the model says


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],
)
@given(scenario=scenarios)
def test_invoices_bill_each_entry_once_and_sum_the_ledger(
    database_url: str, data_dir: Path, scenario: dict[str, object]
) -> None:
    asyncio.run(_run(database_url, data_dir, scenario))
