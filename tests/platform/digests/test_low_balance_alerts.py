"""Low-balance alerts: mailed through a real SMTP server once per crossing of a threshold,
re-armed by a grant, once under concurrent checks (the key is in the database)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from digest_factories import World, make_ledger, make_world, record
from smtp_inbox import SmtpServer
from sqlalchemy import select

from hydrant.platform.credits.low_balance import replace_thresholds
from hydrant.platform.db.models import CreditAlertSend, CreditGrant
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.settings import load_settings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CHECK = "hydrant.credits.check_low_balance"


async def add_grant(db: Database, world: World, amount: str, at: datetime) -> None:
    async with db.session() as session:
        session.add(
            CreditGrant(
                tenant_id=world.tenant_id, kind="paid", amount=Decimal(amount), created_at=at
            )
        )


async def sends(db: Database) -> list[tuple[str, int, str, str]]:
    async with db.session() as session:
        rows = await session.scalars(
            select(CreditAlertSend).order_by(
                CreditAlertSend.crossing, CreditAlertSend.amount.desc()
            )
        )
        return [(f"{r.amount.normalize():f}", r.crossing, f"{r.balance:f}", r.status) for r in rows]


class Setup:
    def __init__(self, db: Database, smtp: SmtpServer, data_dir: Path, world: World) -> None:
        self.db, self.smtp, self.world = db, smtp, world
        self.ledger: DatabaseLedger = make_ledger(db, data_dir)
        self.clock = [NOW]
        settings = load_settings({}, data_dir=data_dir, smtp_url=smtp.url(), secret_key="s" * 40)
        self.jobs = EmbeddedScheduler(
            settings, db, JOB_TABLE, clock=lambda: self.clock[0], periodic=()
        )
        self.spent = 0

    async def spend(self, n: int = 1) -> None:
        """`n` entries of 0.60 each (10k output tokens at 60 per million)."""
        for _ in range(n):
            self.spent += 1
            await record(
                self.ledger,
                self.world,
                key="backend",
                model="llama-small",
                finished_at=NOW - timedelta(hours=5) + timedelta(seconds=self.spent),
                tokens=(0, 0, 10_000),
            )

    async def check(self) -> None:
        await self.jobs.run(CHECK)
        await self.jobs.idle()  # the mailing jobs it enqueued after its commit


async def setup(db: Database, smtp: SmtpServer, data_dir: Path, *thresholds: str) -> Setup:
    world = await make_world(db, recipients=["billing@acme.test"])
    await add_grant(db, world, "5.00", NOW - timedelta(days=1))
    async with db.session() as session:
        await replace_thresholds(session, world.tenant_id, [Decimal(t) for t in thresholds])
    return Setup(db, smtp, data_dir, world)


async def test_one_mail_per_crossing_rearmed_by_a_grant(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    s = await setup(db, smtp, data_dir, "2", "1")
    for _ in range(5):  # 5.00 -> 2.00: at the threshold is not under it
        await s.spend()
        await s.check()
    assert smtp.inbox.count() == 0 and await sends(db) == []

    await s.spend()  # 1.40: under 2
    for _ in range(3):
        await s.check()
    assert await sends(db) == [("2", 1, "1.400000", "sent")]
    [mail] = smtp.inbox.to("billing@acme.test")
    assert "under 2 USD" in mail["Subject"]
    body = str(mail.get_body(("plain",)).get_content())  # type: ignore[union-attr]
    assert "1.40 USD" in body and "Unsubscribe: " in body
    assert mail["List-Unsubscribe"]

    await s.spend()  # 0.80: under 1 as well; 2 is not mailed again
    await s.check()
    await s.spend()  # 0.20
    await s.check()
    assert [x[:2] for x in await sends(db)] == [("2", 1), ("1", 1)]
    assert smtp.inbox.count() == 2

    # a grant lifts the balance over both: re-armed, nothing mailed for being above
    await add_grant(db, s.world, "3.00", NOW - timedelta(hours=1))  # 3.20
    await s.check()
    assert smtp.inbox.count() == 2
    await s.spend(2)  # 2.00: still not under
    await s.check()
    assert smtp.inbox.count() == 2
    await s.spend()  # 1.40: the second crossing of 2, mailed once
    await s.check()
    await s.check()
    assert [x[:2] for x in await sends(db)] == [("2", 1), ("1", 1), ("2", 2)]
    assert smtp.inbox.count() == 3

    # a mailing job delivered twice mails once
    async with db.session() as session:
        ids = list(await session.scalars(select(CreditAlertSend.id)))
    for alert_id in ids:
        result = await s.jobs.run("hydrant.credits.send_low_balance", {"alert_id": alert_id})
        assert result == {"sent": False}
    assert smtp.inbox.count() == 3


async def test_many_settlements_and_concurrent_checks_mail_once(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    s = await setup(db, smtp, data_dir, "3")
    # Spends and checks interleaved at once: 8 entries (5.00 -> 0.20), 6 checkers
    await asyncio.gather(s.spend(8), *(s.jobs.run(CHECK) for _ in range(6)))
    await asyncio.gather(*(s.jobs.run(CHECK) for _ in range(6)))
    await s.jobs.idle()
    assert [x[:2] for x in await sends(db)] == [("3", 1)]
    assert smtp.inbox.count() == 1
    assert await asyncio.gather(*(s.jobs.run(CHECK) for _ in range(4))) == [{"claimed": 0}] * 4


async def test_unsubscribed_recipients_get_no_alert_and_a_failed_mail_is_retried(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    s = await setup(db, smtp, data_dir, "4.5")
    async with db.session() as session:  # a second contact, who unsubscribed (digest rules)
        await repository.replace_recipients(
            session, s.world.tenant_id, ["billing@acme.test", "cfo@acme.test"]
        )
        await repository.add_unsubscribe(session, s.world.tenant_id, "cfo@acme.test")
    smtp.inbox.refuse_next = 10
    await s.spend()  # 4.40
    await s.check()
    assert smtp.inbox.count() == 0 and [x[3] for x in await sends(db)] == ["pending"]
    smtp.inbox.refuse_next = 0
    s.clock[0] = NOW + timedelta(minutes=5)  # the next check re-sends a pending alert
    await s.check()
    assert [x[3] for x in await sends(db)] == ["sent"] and smtp.inbox.count() == 1
    assert smtp.inbox.to("cfo@acme.test") == []


async def test_an_expiring_grant_crosses_with_no_settlement(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    s = await setup(db, smtp, data_dir, "5.5")
    async with db.session() as session:  # 3.00 more, expiring in an hour: 8.00 in all
        session.add(
            CreditGrant(
                tenant_id=s.world.tenant_id,
                kind="promo",
                amount=Decimal(3),
                created_at=NOW - timedelta(days=1),
                expires_at=NOW + timedelta(hours=1),
            )
        )
    await s.spend(2)  # 1.20 spent, promo first: 6.80 left (1.80 of it expiring)
    await s.check()
    assert smtp.inbox.count() == 0
    s.clock[0] = NOW + timedelta(hours=2)  # the promo lapsed: 5.00, no request made
    await s.check()
    assert [x[:3] for x in await sends(db)] == [("5.5", 1, "5.000000")]
    assert smtp.inbox.count() == 1
