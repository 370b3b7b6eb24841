"""The daily hosting fee: one ledger entry per tenant adapter with a fee per UTC day, however
often the job runs; public adapters and adapters without a fee are not charged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import cast

from sqlalchemy import select

from hydrant.platform.adapters.hosting import charge_hosting_fees
from hydrant.platform.adapters.tasks import HOSTING_FEES
from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.db.models import LedgerEntry, ModelDeployment, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE, PERIODIC
from hydrant.platform.jobs.context import Enqueue, JobContext
from hydrant.platform.mail.mailer import Mailer
from hydrant.settings import Settings

NOON = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


async def test_each_day_is_charged_once(db: Database) -> None:
    async with db.session() as session:
        session.add_all(
            [Tenant(id="ten_a", name="a"), ModelDeployment(id="mdl_d", name="demo", path="/m")]
        )
        await session.flush()
        fee = Decimal("0.75")
        session.add(Adapter(id="adp_fee", base_model="demo", name="sql", path="/a",
                            tenant_id="ten_a", hosting_fee_per_day=fee))  # fmt: skip
        session.add(Adapter(id="adp_free", base_model="demo", name="free", path="/a",
                            tenant_id="ten_a"))  # fmt: skip
        session.add(Adapter(id="adp_pub", base_model="demo", name="pub", path="/a"))
    assert await charge_hosting_fees(db, NOON) == 1
    assert await charge_hosting_fees(db, NOON + timedelta(hours=5)) == 0  # same day: nothing new
    assert await charge_hosting_fees(db, NOON + timedelta(days=1)) == 1
    async with db.session() as session:
        entries = (
            await session.scalars(select(LedgerEntry).order_by(LedgerEntry.started_at))
        ).all()
    assert [
        (e.request_id, e.tenant_id, e.model_id, e.adapter, e.charged, e.input_tokens, e.started_at)
        for e in entries
    ] == [
        ("hosting-adp_fee-20261205", "ten_a", "mdl_d", "sql", Decimal("0.750000"), 0,
         datetime(2026, 12, 5, tzinfo=UTC)),
        ("hosting-adp_fee-20261206", "ten_a", "mdl_d", "sql", Decimal("0.750000"), 0,
         datetime(2026, 12, 6, tzinfo=UTC)),
    ]  # fmt: skip


async def test_the_job_is_in_the_table_and_scheduled_hourly(db: Database) -> None:
    assert [p.every_s for p in PERIODIC if p.job == HOSTING_FEES] == [3600.0]
    job = JOB_TABLE.job_named(HOSTING_FEES)
    ctx = JobContext(Settings(), db, cast(Mailer, None), cast(Enqueue, None), clock=lambda: NOON)
    assert await job.fn(ctx) == {"entries": 0}  # no adapters: nothing to charge
