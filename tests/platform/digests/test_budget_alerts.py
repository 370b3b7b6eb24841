"""Budget alerts at 80% and 100%, each mailed once per period, through a real SMTP server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from digest_factories import World, make_ledger, make_world, record
from smtp_inbox import SmtpServer
from sqlalchemy import select, update

from hydrant.platform.db.models import BudgetAlertSend, Plan, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.settings import load_settings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


async def world_with_budget(db: Database) -> World:
    world = await make_world(db, recipients=["ops@acme.test"])
    async with db.session() as session:
        plan = Plan(name="capped", spend_per_day=Decimal("2.00"), tokens_per_month=10**9)
        session.add(plan)
        await session.flush()
        await session.execute(
            update(Tenant).where(Tenant.id == world.tenant_id).values(plan_id=plan.id)
        )
    return world


async def alerts(db: Database) -> list[tuple[str, str, int, str]]:
    async with db.session() as session:
        rows = await session.scalars(select(BudgetAlertSend).order_by(BudgetAlertSend.threshold))
        return [(r.budget, r.period, r.threshold, r.status) for r in rows]


async def test_each_threshold_is_mailed_once_per_period(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await world_with_budget(db)
    ledger = make_ledger(db, data_dir)
    clock = [NOW]
    settings = load_settings({}, data_dir=data_dir, smtp_url=smtp.url(), secret_key="s" * 40)
    jobs = EmbeddedScheduler(settings, db, JOB_TABLE, clock=lambda: clock[0], periodic=())

    async def check() -> None:
        await jobs.run("hydrant.budgets.check")
        await jobs.idle()  # the mailing jobs it enqueued after its commit

    # 0.75 (10k in, 10k out at 15 / 60 per million): 37.5% of 2.00, no alert
    await record(
        ledger,
        world,
        key="backend",
        model="llama-small",
        finished_at=NOW - timedelta(hours=3),
        tokens=(10_000, 0, 10_000),
    )
    await check()
    assert smtp.inbox.count() == 0 and await alerts(db) == []

    # + 0.90 = 1.65: 82.5%, the 80% alert, once however often the check runs
    await record(
        ledger,
        world,
        key="batch",
        model="llama-small",
        finished_at=NOW - timedelta(hours=2),
        tokens=(0, 0, 15_000),
    )
    await check()
    await check()
    assert await alerts(db) == [("spend_day", "2026-12-02", 80, "sent")]
    [first] = smtp.inbox.to("ops@acme.test")
    assert "80%" in first["Subject"]
    assert "1.65 of 2.00" in str(first.get_body(("plain",)).get_content())  # type: ignore[union-attr]

    # + 0.75 = 2.40: 120%, the 100% alert; the 80% one is not sent again
    await record(
        ledger,
        world,
        key="batch",
        model="llama-small",
        finished_at=NOW - timedelta(hours=1),
        tokens=(10_000, 0, 10_000),
    )
    await check()
    await check()
    assert [a[2:] for a in await alerts(db)] == [(80, "sent"), (100, "sent")]
    assert smtp.inbox.count() == 2
    assert "100%" in smtp.inbox.to("ops@acme.test")[1]["Subject"]

    # a mailing job delivered twice mails once
    async with db.session() as session:
        ids = list(await session.scalars(select(BudgetAlertSend.id)))
    for alert_id in ids:
        assert await jobs.run("hydrant.budgets.send_alert", {"alert_id": alert_id}) == {
            "sent": False
        }
    assert smtp.inbox.count() == 2

    # the next day is a new period: the same spend there alerts again, once
    clock[0] = NOW + timedelta(days=1)
    for hours in (3, 2):
        await record(
            ledger,
            world,
            key="backend",
            model="llama-small",
            finished_at=clock[0] - timedelta(hours=hours),
            tokens=(0, 0, 15_000),
        )
    await check()
    await check()
    periods = [(a[1], a[2]) for a in await alerts(db)]
    assert sorted(periods) == [("2026-12-02", 80), ("2026-12-02", 100), ("2026-12-03", 80)]
    assert smtp.inbox.count() == 3


async def test_a_failed_alert_mail_is_retried_by_the_next_check(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await world_with_budget(db)
    await record(
        make_ledger(db, data_dir),
        world,
        key="backend",
        model="llama-small",
        finished_at=NOW - timedelta(hours=1),
        tokens=(0, 0, 40_000),
    )  # 2.40: 120%
    clock = [NOW]
    settings = load_settings({}, data_dir=data_dir, smtp_url=smtp.url(), secret_key="s" * 40)
    jobs = EmbeddedScheduler(settings, db, JOB_TABLE, clock=lambda: clock[0], periodic=())
    smtp.inbox.refuse_next = 10  # the server refuses everything for now

    await jobs.run("hydrant.budgets.check")
    await jobs.idle()
    assert smtp.inbox.count() == 0
    assert {a[3] for a in await alerts(db)} == {"pending"}  # back to pending, not lost

    smtp.inbox.refuse_next = 0
    clock[0] = NOW + timedelta(minutes=5)  # the next check re-sends pending alerts
    await jobs.run("hydrant.budgets.check")
    await jobs.idle()
    assert {a[3] for a in await alerts(db)} == {"sent"}
    assert smtp.inbox.count() == 2  # 80% and 100%, each once
