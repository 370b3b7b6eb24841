"""The periodic payer (`hydrant.credits.pay_pending`): entries that reached the ledger after
their request's own payment ran (a spool or journal replay) and a post-paid tenant's
entries are paid from credits by the job, whoever reads a balance or not; each once, on
SQLite and PostgreSQL.

Why it matters: until paid, an entry is in no one's spend as the database counts it, and
that count is the floor admission raises the quota store's credit counter to; a store that
lost its state would let a prepaid tenant spend the unpaid amount again.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import func, select

from hydrant.platform.credits.service import CreditBook
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.credit_models import CreditApplication, CreditGrant
from hydrant.platform.db.models import LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.ledger.repository import ensure_model
from hydrant.settings import load_settings


async def _tenant(db: Database, name: str, grant: str | None) -> str:
    async with db.session() as session:
        tenant = Tenant(name=name)
        session.add(tenant)
        await session.flush()
        if grant is not None:
            created = utcnow() - timedelta(hours=2)
            session.add(
                CreditGrant(
                    tenant_id=tenant.id, kind="paid", amount=Decimal(grant), created_at=created
                )
            )
        return tenant.id


async def _entries(db: Database, tenant_id: str, *charges: str, tag: str) -> list[str]:
    """Entries as a replayed spool writes them: finished an hour ago, recorded now."""
    ids = []
    async with db.session() as session:
        model_id = await ensure_model(session, "demo")
        for n, charged in enumerate(charges):
            at = utcnow() - timedelta(hours=1) + timedelta(seconds=n)
            ids.append(f"req_{tag}_{n}")
            session.add(
                LedgerEntry(
                    request_id=ids[-1], tenant_id=tenant_id, model_id=model_id, status="finished",
                    charged=Decimal(charged), started_at=at, finished_at=at,
                )
            )  # fmt: skip
    return ids


async def _paid(db: Database, tenant_id: str) -> Decimal:
    async with db.session() as session:
        total = await session.scalar(
            select(func.coalesce(func.sum(CreditApplication.amount), 0)).where(
                CreditApplication.tenant_id == tenant_id
            )
        )
    return Decimal(total)


async def _run_job(db: Database, data_dir: object) -> dict[str, int]:
    ctx = JobContext(load_settings({}, data_dir=data_dir), db, None, lambda *_: None)  # type: ignore[arg-type]
    job = JOB_TABLE.job_named("hydrant.credits.pay_pending")
    return dict(await job.fn(ctx))


async def test_late_and_post_paid_entries_are_paid_by_the_job_once(
    db: Database, data_dir: object
) -> None:
    prepaid = await _tenant(db, "prepaid", "1.00")
    postpaid = await _tenant(db, "postpaid", "2.00")
    no_credits = await _tenant(db, "no-credits", None)
    book = CreditBook(db, cache_s=0)

    # The request's own payment runs before its spooled entry reaches the ledger: nothing.
    late = ["req_late_0", "req_late_1"]
    assert await book.apply(prepaid, late) == 0
    await _entries(db, prepaid, "0.25", "0.125", tag="late")
    await _entries(db, postpaid, "0.5", tag="post")
    await _entries(db, no_credits, "9", tag="none")
    before = await book.standing(prepaid)
    assert before.spent == 0 and before.balance == Decimal("1.00")  # the late spend unseen

    assert await _run_job(db, data_dir) == {"tenants": 2, "entries": 3, "failed": 0}
    after = await book.standing(prepaid)
    assert after.spent == Decimal("0.375") and after.balance == Decimal("0.625")
    assert after.limit == before.limit  # paying moves spend from "left" to "spent"
    assert await _paid(db, prepaid) == Decimal("0.375")
    assert await _paid(db, postpaid) == Decimal("0.5")
    assert await _paid(db, no_credits) == 0  # no grant: nothing to pay from, not listed

    # Nothing pending: the job finds no tenant; a new late entry is paid on the next run.
    assert await _run_job(db, data_dir) == {"tenants": 0, "entries": 0, "failed": 0}
    await _entries(db, prepaid, "0.5", tag="later")
    assert await _run_job(db, data_dir) == {"tenants": 1, "entries": 1, "failed": 0}
    assert await _paid(db, prepaid) == Decimal("0.875")


async def test_concurrent_runs_pay_each_entry_once(db: Database, data_dir: object) -> None:
    """Two job workers (or a worker and a gateway's loop) at once: every entry paid once."""
    tenants = [await _tenant(db, f"t{n}", "5") for n in range(3)]
    for n, tenant_id in enumerate(tenants):
        await _entries(db, tenant_id, *["0.010001"] * 15, tag=f"race{n}")
    reports = await asyncio.gather(*(_run_job(db, data_dir) for _ in range(4)))
    assert sum(r["entries"] for r in reports) == 45
    for tenant_id in tenants:
        assert await _paid(db, tenant_id) == 15 * Decimal("0.010001")
