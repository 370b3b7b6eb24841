"""Test data for invoices: the digests' tenant and ledger factories, a second price version,
grants, and the ledger's own rows of a local month as the truth an invoice is checked
against."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from digest_factories import PRICES
from sqlalchemy import select

from hydrant.platform.db.models import CreditGrant, LedgerEntry, ModelDeployment, Price
from hydrant.platform.db.session import Database
from hydrant.platform.invoices.periods import Month
from hydrant.settings import Settings, load_settings

TZ = "America/New_York"
NOVEMBER = Month(2026, 11)
DECEMBER = Month(2026, 12)
# 2026-11-15: llama-small's price changes (a second version mid-month)
PRICE_CHANGE = datetime(2026, 11, 15, 5, 0, tzinfo=UTC)


def local(year: int, month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(TZ)).astimezone(UTC)


def settings_for(data_dir: object, **overrides: object) -> Settings:
    return load_settings({}, data_dir=data_dir, secret_key="s" * 40, **overrides)


async def add_price_change(db: Database) -> None:
    async with db.session() as session:
        model_id = await session.scalar(
            select(ModelDeployment.id).where(ModelDeployment.name == "llama-small")
        )
        inp, cached, out = PRICES["llama-small"]
        session.add(
            Price(
                model_id=model_id,
                effective_from=PRICE_CHANGE,
                input_per_mtok=inp * 2,
                cached_input_per_mtok=cached * 2,
                output_per_mtok=out * 2,
            )
        )


async def add_grant(db: Database, tenant_id: str, amount: str, at: datetime) -> None:
    async with db.session() as session:
        session.add(
            CreditGrant(tenant_id=tenant_id, kind="paid", amount=Decimal(amount), created_at=at)
        )


async def ledger_sum(db: Database, tenant_id: str, start: datetime, end: datetime) -> Decimal:
    async with db.session() as session:
        rows = await session.scalars(
            select(LedgerEntry.charged).where(
                LedgerEntry.tenant_id == tenant_id,
                LedgerEntry.finished_at >= start,
                LedgerEntry.finished_at < end,
            )
        )
        return sum(rows.all(), Decimal(0))
